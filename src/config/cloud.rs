//! The cloud identity flags (`--kafka-auth`, `--postgres-auth`, `--aws-*`) and their checks:
//! what AWS IAM needs of the other flags (TLS to RDS, OAUTHBEARER to MSK, no static
//! password) is refused here, before any connection, naming the flag and the fix.

use clap::{Args, ValueEnum};

use super::{ConfigError, PostgresConnInfo, SslMode, invalid};
use crate::cloud::aws::{Aws, AwsSettings};
use crate::cloud::{KafkaAuth, PostgresAuth};

/// Cloud identity flags.
#[derive(Debug, Clone, Args)]
pub struct CloudArgs {
    /// How Kafka clients log in beyond -X: aws-msk-iam signs MSK IAM tokens (SASL/OAUTHBEARER).
    #[arg(long, env = "OUTBOX_RELAY_KAFKA_AUTH", value_enum, default_value_t = KafkaAuthMode::Properties)]
    pub kafka_auth: KafkaAuthMode,
    /// How the relay logs in to Postgres: password, or aws-rds-iam (an IAM token per connection, TLS).
    #[arg(long, env = "OUTBOX_RELAY_POSTGRES_AUTH", value_enum, default_value_t = PostgresAuthMode::Password)]
    pub postgres_auth: PostgresAuthMode,
    /// AWS region of the IAM tokens (default: AWS_REGION, the profile, the MSK or RDS host names).
    #[arg(long, env = "OUTBOX_RELAY_AWS_REGION", value_parser = aws_region)]
    pub aws_region: Option<String>,
    /// IAM role to assume (sts:AssumeRole) with the credentials of the standard AWS chain.
    #[arg(long, env = "OUTBOX_RELAY_AWS_ROLE_ARN", value_parser = role_arn)]
    pub aws_role_arn: Option<String>,
    /// Session name of the assumed --aws-role-arn, as CloudTrail shows it.
    #[arg(
        long,
        env = "OUTBOX_RELAY_AWS_ROLE_SESSION_NAME",
        default_value = "outbox-relay"
    )]
    pub aws_role_session_name: String,
}

/// `--kafka-auth`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum KafkaAuthMode {
    /// As the -X properties say: none, PLAIN, SCRAM, mTLS, or librdkafka's OIDC client.
    Properties,
    /// Amazon MSK's IAM access control: SASL/OAUTHBEARER with tokens signed by AWS credentials.
    AwsMskIam,
}

/// `--postgres-auth`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PostgresAuthMode {
    /// The password of --postgres-url, --postgres-password or its file (or none: certificates).
    Password,
    /// RDS and Aurora IAM authentication: a fresh IAM token as each connection's password.
    AwsRdsIam,
}

/// The authentication the flags ask for, checked against the other flags: the Kafka side,
/// and `postgres` given its [`PostgresAuth`] (TLS made required for RDS IAM).
pub(super) fn auth(
    args: &CloudArgs,
    postgres: &mut PostgresConnInfo,
    kafka_brokers: &str,
    kafka_properties: &[(String, String)],
) -> Result<KafkaAuth, ConfigError> {
    let msk = args.kafka_auth == KafkaAuthMode::AwsMskIam;
    let rds = args.postgres_auth == PostgresAuthMode::AwsRdsIam;
    if !msk && !rds {
        let given = [
            ("--aws-region", args.aws_region.as_deref()),
            ("--aws-role-arn", args.aws_role_arn.as_deref()),
        ];
        if let Some((flag, Some(value))) = given.into_iter().find(|(_, v)| v.is_some()) {
            let reason = "is used only with --kafka-auth aws-msk-iam or --postgres-auth \
                          aws-rds-iam; remove it or give one of those";
            return Err(invalid(flag, value, reason));
        }
        return Ok(KafkaAuth::Properties);
    }
    if msk {
        check_msk(kafka_properties)?;
    }
    if rds {
        check_rds(postgres)?;
    }
    let mut hosts: Vec<String> = Vec::new();
    if msk {
        hosts.extend(kafka_brokers.split(',').map(|b| b.trim().to_owned()));
    }
    if rds {
        hosts.extend(postgres.hosts.iter().map(|(host, _)| host.clone()));
    }
    let aws = Aws::new(AwsSettings {
        region: args.aws_region.clone(),
        role_arn: args.aws_role_arn.clone(),
        session_name: args.aws_role_session_name.clone(),
        hosts,
    });
    if rds {
        postgres.auth = PostgresAuth::AwsRdsIam(aws.clone());
    }
    Ok(match msk {
        true => KafkaAuth::AwsMskIam(aws),
        false => KafkaAuth::Properties,
    })
}

/// MSK IAM is SASL/OAUTHBEARER with the relay's tokens: `-X` may change the protocol's
/// transport (SASL_PLAINTEXT), not the mechanism.
fn check_msk(properties: &[(String, String)]) -> Result<(), ConfigError> {
    let flag = "--kafka-auth";
    for (key, value) in properties {
        let lower = value.to_ascii_lowercase();
        let refused = match key.as_str() {
            "sasl.mechanism" | "sasl.mechanisms" if !value.eq_ignore_ascii_case("OAUTHBEARER") => {
                format!(
                    "aws-msk-iam logs in with SASL/OAUTHBEARER, but -X {key}={value} asks for another mechanism; remove it"
                )
            }
            "sasl.oauthbearer.method" if lower == "oidc" => {
                "aws-msk-iam signs its own tokens; -X sasl.oauthbearer.method=oidc would ask an \
                 OIDC provider instead: remove one of the two"
                    .to_owned()
            }
            "enable.sasl.oauthbearer.unsecure.jwt" if lower == "true" => {
                "aws-msk-iam signs its own tokens; remove -X enable.sasl.oauthbearer.unsecure.jwt"
                    .to_owned()
            }
            "security.protocol" if !lower.starts_with("sasl_") => format!(
                "aws-msk-iam needs SASL: -X security.protocol={value} has none. MSK's IAM \
                 listener (port 9098, 9198 public) takes SASL_SSL, the default: remove it"
            ),
            _ => continue,
        };
        return Err(invalid(flag, "aws-msk-iam", refused));
    }
    Ok(())
}

/// RDS takes IAM tokens over TLS only, for a role without a password of its own.
fn check_rds(postgres: &mut PostgresConnInfo) -> Result<(), ConfigError> {
    let flag = "--postgres-auth";
    if postgres.password.is_some() {
        let reason = "the IAM token is the password: remove the password from --postgres-url \
                      (and --postgres-password or --postgres-password-file)";
        return Err(invalid(flag, "aws-rds-iam", reason));
    }
    if let Some((host, _)) = postgres
        .hosts
        .iter()
        .find(|(host, _)| host.starts_with('/'))
    {
        let reason = format!(
            "an IAM token is signed for a host name, and {host:?} is a Unix socket directory: \
             give the RDS endpoint's host name in --postgres-url"
        );
        return Err(invalid(flag, "aws-rds-iam", reason));
    }
    match postgres.sslmode {
        SslMode::Disable => {
            let reason = "RDS accepts IAM tokens over TLS only, and --postgres-url says \
                          sslmode=disable: use sslmode=verify-full with sslrootcert= the RDS CA \
                          bundle (global-bundle.pem), or at least sslmode=require";
            Err(invalid(flag, "aws-rds-iam", reason))
        }
        // A token is never sent in the clear: `prefer` would fall back to plaintext.
        SslMode::Prefer => {
            postgres.sslmode = SslMode::Require;
            Ok(())
        }
        SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => Ok(()),
    }
}

/// `us-east-1`: lower-case letters, digits and dashes.
fn aws_region(raw: &str) -> Result<String, &'static str> {
    let valid = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-';
    match !raw.is_empty() && raw.chars().all(valid) {
        true => Ok(raw.to_owned()),
        false => Err("expected a region code such as us-east-1"),
    }
}

/// `arn:aws:iam::123456789012:role/relay` (any partition, any path).
fn role_arn(raw: &str) -> Result<String, &'static str> {
    let parts: Vec<&str> = raw.splitn(6, ':').collect();
    let valid = parts.len() == 6
        && parts[0] == "arn"
        && parts[2] == "iam"
        && parts[4].len() == 12
        && parts[4].bytes().all(|b| b.is_ascii_digit())
        && parts[5].starts_with("role/");
    match valid {
        true => Ok(raw.to_owned()),
        false => Err("expected a role ARN such as arn:aws:iam::123456789012:role/outbox-relay"),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use crate::cloud::{KafkaAuth, PostgresAuth};
    use crate::config::{Cli, Config, SslMode};

    fn config(url: &str, extra: &[&str]) -> Result<Config, String> {
        let mut args = vec![
            "outbox-relay",
            "--postgres-url",
            url,
            "--kafka-brokers",
            "b-1.orders.abc.c2.kafka.eu-west-1.amazonaws.com:9098",
        ];
        args.extend_from_slice(extra);
        let cli = Cli::try_parse_from(args).map_err(|e| e.to_string())?;
        Config::from_cli(&cli).map_err(|e| e.to_string())
    }

    const RDS: &str = "postgres://relay@db.abc.eu-west-1.rds.amazonaws.com/app";

    #[test]
    fn msk_iam_sets_oauthbearer_over_tls_and_shares_one_identity_with_rds() {
        let both = [
            "--kafka-auth",
            "aws-msk-iam",
            "--postgres-auth",
            "aws-rds-iam",
        ];
        let config = config(RDS, &both).unwrap();
        let KafkaAuth::AwsMskIam(kafka) = &config.kafka_auth else {
            panic!("{config:?}")
        };
        let PostgresAuth::AwsRdsIam(postgres) = &config.postgres.auth else {
            panic!("{config:?}")
        };
        assert!(std::sync::Arc::ptr_eq(kafka, postgres));
        let hosts = &kafka.settings().hosts;
        assert!(
            hosts.iter().any(|h| h.contains("kafka.eu-west-1")),
            "{hosts:?}"
        );
        assert!(
            hosts.iter().any(|h| h.contains("rds.amazonaws.com")),
            "{hosts:?}"
        );
        assert_eq!(
            config.kafka_auth.properties(),
            [
                ("security.protocol", "SASL_SSL"),
                ("sasl.mechanism", "OAUTHBEARER")
            ]
        );
        // The default sslmode (prefer) becomes require: a token never goes in the clear.
        assert_eq!(config.postgres.sslmode, SslMode::Require);
        let defaults = self::config(RDS, &[]).unwrap();
        assert!(matches!(defaults.kafka_auth, KafkaAuth::Properties));
        assert_eq!(defaults.postgres.auth, PostgresAuth::Password);
        assert_eq!(defaults.postgres.sslmode, SslMode::Prefer);
    }

    #[test]
    fn what_aws_iam_cannot_work_with_is_refused_naming_the_flag_and_the_fix() {
        let msk = ["--kafka-auth", "aws-msk-iam"];
        let rds = ["--postgres-auth", "aws-rds-iam"];
        // (URL, flags, needles of the error): one row per refusal.
        let cases: [(&str, &[&str], &[&str]); 10] = [
            (
                RDS,
                &[&msk[..], &["-X", "sasl.mechanism=PLAIN"]].concat(),
                &["--kafka-auth", "sasl.mechanism=PLAIN"],
            ),
            (
                RDS,
                &[&msk[..], &["-X", "sasl.oauthbearer.method=oidc"]].concat(),
                &["--kafka-auth", "oidc"],
            ),
            (
                RDS,
                &[&msk[..], &["-X", "security.protocol=SSL"]].concat(),
                &["--kafka-auth", "SASL_SSL"],
            ),
            (
                "postgres://relay@db/app?sslmode=disable",
                &rds,
                &["--postgres-auth", "TLS", "sslmode=verify-full"],
            ),
            (
                "postgres://relay:pw@db/app",
                &rds,
                &["--postgres-auth", "remove the password"],
            ),
            (
                RDS,
                &[&rds[..], &["--postgres-password", "pw"]].concat(),
                &["remove the password"],
            ),
            ("postgres://relay@%2Frun%2Fpg/app", &rds, &["Unix socket"]),
            (
                RDS,
                &["--aws-region", "us-east-1"],
                &["--aws-region", "only with"],
            ),
            (
                RDS,
                &[&rds[..], &["--aws-region", "US East"]].concat(),
                &["--aws-region", "us-east-1"],
            ),
            (
                RDS,
                &[&rds[..], &["--aws-role-arn", "relay"]].concat(),
                &["--aws-role-arn", "arn:aws:iam::"],
            ),
        ];
        for (url, flags, needles) in cases {
            let err = config(url, flags).unwrap_err();
            for needle in needles {
                assert!(err.contains(needle), "{flags:?}: {needle}: {err}");
            }
        }
        // What works: SASL_PLAINTEXT (a broker without TLS), OAUTHBEARER spelt out, a role.
        let fine = [
            "-X",
            "security.protocol=SASL_PLAINTEXT",
            "-X",
            "sasl.mechanism=oauthbearer",
            "--aws-role-arn",
            "arn:aws-cn:iam::123456789012:role/path/relay",
        ];
        let config = config(RDS, &[&msk[..], &fine].concat()).unwrap();
        assert!(matches!(config.kafka_auth, KafkaAuth::AwsMskIam(_)));
    }
}
