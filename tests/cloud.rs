//! Cloud identities (issue 34): AWS IAM for MSK and RDS, librdkafka's OIDC client for other
//! Kafkas, against real parts on loopback only.
//!
//! * Kafka that requires SASL/OAUTHBEARER: librdkafka's mock cluster behind the SASL front
//!   of `support::sasl`, which judges every token as MSK would (signature, credential,
//!   expiry) and closes sessions that outlive their token.
//! * Postgres that checks the password the relay sends: a TLS-only cluster whose `pg_hba`
//!   hands it to `support::ldap`'s server (LDAP simple bind), which checks it is an RDS IAM
//!   token signed now, for that host, port and user, with the expected credentials.
//! * The AWS credential chain, really run by the relay: environment variables, a profile
//!   (keys, `credential_process`) in a temporary `HOME`, web identity and an assumed role
//!   answered by a fake STS (`support::fake_http`, reached through `AWS_ENDPOINT_URL_STS`),
//!   instance metadata off (`AWS_EC2_METADATA_DISABLED`).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use aws_credential_types::Credentials;
use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use outbox_relay::cloud::aws::sign;

use crate::support::fake_http::{Answer, FakeHttp, Request};
use crate::support::kafka::consume_with;
use crate::support::ldap::FakeLdap;
use crate::support::postgres::{PgCluster, PgOptions, give_to_server_user};
use crate::support::relay::Relay;
use crate::support::sasl::{Login, SaslBroker, Validator};
use crate::support::world::World;

const REGION: &str = "us-east-1";
const SLOT: &str = "outbox_relay";
/// The relay's exit code for configuration problems.
const EXIT_CONFIG: i32 = 2;

/// The relay's flags for MSK IAM against the SASL broker (which has no TLS).
const MSK_IAM: [&str; 6] = [
    "--kafka-auth",
    "aws-msk-iam",
    "-X",
    "security.protocol=SASL_PLAINTEXT",
    "--aws-region",
    REGION,
];

/// What a test reader of the SASL broker logs in with: an unsecured JWT, which the front
/// takes from `sub` `reader` only.
const READER: [(&str, &str); 4] = [
    ("security.protocol", "SASL_PLAINTEXT"),
    ("sasl.mechanism", "OAUTHBEARER"),
    ("enable.sasl.oauthbearer.unsecure.jwt", "true"),
    ("sasl.oauthbearer.config", "principal=reader"),
];

// ------------------------------------------------------------------------------------
// Amazon MSK

/// The relay's MSK tokens are renewed before they expire while events flow, each one
/// checked as MSK would; when fetching credentials then fails, deliveries wait (nothing is
/// confirmed past them), `/readyz` and the metrics say why, and once fetching works again
/// everything arrives.
#[tokio::test]
async fn msk_iam_tokens_are_renewed_while_events_flow_and_a_failing_fetch_only_delays_them() {
    let world = World::start().await;
    let process = CredentialProcess::new(8);
    let broker = SaslBroker::start(msk_validator(process.secrets()));
    let home = process.home().display().to_string();
    let env = [
        ("HOME", home.as_str()),
        ("AWS_EC2_METADATA_DISABLED", "true"),
    ];
    let mut relay = Relay::spawn_env(&world.pg.url(), &broker.bootstrap(), &MSK_IAM, &env);
    relay.wait_streaming();

    // Events flow while librdkafka renews the token (at 80% of its 8 s) and the broker
    // re-authenticates its sessions with the new ones.
    let mut ids = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(90);
    while !(relay_tokens(&broker.logins()) >= 3 && renewed_in_session(&broker.logins())) {
        assert!(
            Instant::now() < deadline,
            "{:#?}\n{}",
            broker.logins(),
            relay.log()
        );
        ids.extend(world.insert_tx(&[("OrderCreated", "order-1", "{}")]).await);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let written = world.current_lsn().await;
    let confirmed = world
        .wait_confirmed(SLOT, written, Duration::from_secs(30))
        .await;
    assert!(confirmed >= written, "{}", relay.log());
    let refused: Vec<&Login> = Vec::new();
    let logins = broker.logins();
    let refused = logins
        .iter()
        .filter(|l| l.verdict.is_err())
        .fold(refused, |mut r, l| {
            r.push(l);
            r
        });
    assert!(refused.is_empty(), "{refused:#?}");
    let sources = relay.metric_samples("outbox_relay_aws_credentials_info");
    assert!(
        sources.contains(&("{source=\"credential-process\"}".to_owned(), 1.0)),
        "{sources:?}"
    );

    // The identity provider goes down: once the credentials at hand expired, no token can
    // be signed; the next event waits, unconfirmed, and readiness says why.
    process.fail(true);
    let failing = relay.wait_for(Duration::from_secs(60), |r| {
        r.readyz().is_some_and(|j| {
            j["reasons"]
                .to_string()
                .contains("fetching AWS credentials fails")
        })
    });
    assert!(failing, "{:?}\n{}", relay.readyz(), relay.log());
    let before = relay
        .metric("outbox_relay_auth_token_failures_total")
        .unwrap_or(0.0);
    ids.extend(world.insert_tx(&[("OrderCreated", "order-2", "{}")]).await);
    let waiting = world.current_lsn().await;
    let asked = relay.wait_for(Duration::from_secs(30), |r| {
        r.metric("outbox_relay_auth_token_failures_total")
            .unwrap_or(0.0)
            >= before + 1.0
    });
    assert!(asked, "librdkafka did not ask again\n{}", relay.log());
    let confirmed = world.confirmed_flush(SLOT).await.unwrap_or_default();
    assert!(
        confirmed < waiting,
        "confirmed {confirmed} past {waiting}\n{}",
        relay.log()
    );
    let failed = relay.metric_samples("outbox_relay_aws_credentials_fetches_total");
    assert!(
        failed
            .iter()
            .any(|(l, v)| l.contains("failed") && *v >= 1.0),
        "{failed:?}"
    );

    // The provider is back: fetched again at librdkafka's next ask, and all is delivered.
    process.fail(false);
    world
        .wait_confirmed(SLOT, waiting, Duration::from_secs(60))
        .await;
    let records = consume_with(
        &broker.bootstrap(),
        &READER,
        &["OrderCreated"],
        ids.len(),
        Duration::from_secs(30),
    );
    let mut got: Vec<String> = records.iter().map(|r| r.id()).collect();
    got.sort();
    ids.sort();
    assert_eq!(got, ids);
    let log = relay.log();
    for secret in ["process-secret-", "session-"] {
        assert!(!log.contains(secret), "{secret} in the log");
    }
    assert!(
        relay.readyz().is_some_and(|j| j["ready"] == true),
        "{:?}",
        relay.readyz()
    );
}

/// Brokers that refuse the relay's token (its identity lacks `kafka-cluster:Connect`, say)
/// stop it at start-up as a configuration problem naming what to grant, not as an outage.
#[tokio::test]
async fn a_broker_refusing_the_msk_token_at_start_up_is_a_configuration_error() {
    let world = World::start().await;
    let refusing: Validator = Arc::new(|token: &str| match token.starts_with("eyJ") {
        true => Ok(Duration::from_secs(3600)),
        false => Err("Access denied".to_owned()),
    });
    let broker = SaslBroker::start(refusing);
    let home = tempfile::tempdir().expect("empty HOME");
    let env = env_credentials(&home.path().display().to_string());
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut relay = Relay::spawn_env(&world.pg.url(), &broker.bootstrap(), &MSK_IAM, &env);
    let status = relay.wait_exit(Duration::from_secs(120));
    let log = relay.log();
    assert_eq!(status.and_then(|s| s.code()), Some(EXIT_CONFIG), "{log}");
    for says in [
        "refused the MSK IAM token",
        "Access denied",
        "kafka-cluster:Connect",
    ] {
        assert!(log.contains(says), "{says}: {log}");
    }
    assert!(
        !log.contains("env-secret-key") && !log.contains("env-session"),
        "{log}"
    );
    assert!(broker.logins().iter().any(|l| l.verdict.is_err()));
}

/// The relay's distinct MSK tokens the broker took.
fn relay_tokens(logins: &[Login]) -> usize {
    let mut tokens: Vec<&str> = logins
        .iter()
        .filter(|l| l.verdict.is_ok() && !l.token.starts_with("eyJ"))
        .map(|l| l.token.as_str())
        .collect();
    tokens.sort_unstable();
    tokens.dedup();
    tokens.len()
}

/// Whether some connection logged in again (KIP-368) with a token it had not used.
fn renewed_in_session(logins: &[Login]) -> bool {
    logins.iter().enumerate().any(|(i, l)| {
        l.again
            && l.verdict.is_ok()
            && logins[..i]
                .iter()
                .filter(|e| e.connection == l.connection)
                .all(|e| e.token != l.token)
    })
}

/// Judges tokens as MSK's IAM listener does: a SigV4 `kafka-cluster:Connect` URL for
/// [`REGION`], signed with the secret `secrets` has for its session token, not expired
/// (900 s after signing, or the session's expiry if sooner); also the test reader's JWT.
fn msk_validator(
    secrets: impl Fn(&str) -> Option<(String, SystemTime)> + Send + Sync + 'static,
) -> Validator {
    Arc::new(move |token: &str| {
        if token.starts_with("eyJ") {
            return Ok(Duration::from_secs(3600));
        }
        let url = URL_SAFE_NO_PAD
            .decode(token)
            .map_err(|e| format!("not base64url: {e}"))?;
        let url = String::from_utf8(url).map_err(|e| e.to_string())?;
        let parsed = url::Url::parse(&url).map_err(|e| e.to_string())?;
        let query = |name: &str| {
            parsed
                .query_pairs()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.into_owned())
        };
        let expected_host = format!("kafka.{REGION}.amazonaws.com");
        if parsed.host_str() != Some(expected_host.as_str()) {
            return Err(format!("for host {:?}", parsed.host_str()));
        }
        if query("Action").as_deref() != Some("kafka-cluster:Connect") {
            return Err("not kafka-cluster:Connect".to_owned());
        }
        let session = query("X-Amz-Security-Token").ok_or("no session token")?;
        let (secret, session_expiry) = secrets(&session).ok_or("an unknown session")?;
        let credential = query("X-Amz-Credential").ok_or("no credential")?;
        let access_key = credential.split('/').next().unwrap_or_default().to_owned();
        let signed = signing_time(&query("X-Amz-Date").ok_or("no date")?)?;
        let agent = query("User-Agent").ok_or("no user agent")?;
        if !agent.starts_with("outbox-relay/") {
            return Err(format!("user agent {agent}"));
        }
        let credentials = Credentials::new(access_key, secret, Some(session), None, "test");
        let expected =
            sign::msk_token(&credentials, REGION, signed, &agent).map_err(|e| e.to_string())?;
        if expected.value != token {
            return Err("the signature is not the one of the credentials handed out".to_owned());
        }
        let valid_until = session_expiry.min(signed + Duration::from_secs(900));
        valid_until
            .duration_since(SystemTime::now())
            .map_err(|_| "expired".to_owned())
    })
}

fn signing_time(amz_date: &str) -> Result<SystemTime, String> {
    let parsed = chrono::NaiveDateTime::parse_from_str(amz_date, "%Y%m%dT%H%M%SZ")
        .map_err(|e| format!("X-Amz-Date {amz_date}: {e}"))?;
    let secs = u64::try_from(parsed.and_utc().timestamp()).map_err(|e| e.to_string())?;
    Ok(UNIX_EPOCH + Duration::from_secs(secs))
}

/// A profile in a temporary `HOME` whose `credential_process` hands out credentials
/// expiring `lifetime` seconds later, a new session each time (`session-N-exp-UNIX`, secret
/// `process-secret-N`), or fails while told to.
struct CredentialProcess {
    dir: tempfile::TempDir,
}

impl CredentialProcess {
    fn new(lifetime: u64) -> CredentialProcess {
        let dir = tempfile::tempdir().expect("temp HOME");
        let script = dir.path().join("credentials.sh");
        let text = format!(
            "#!/bin/sh\nset -eu\ndir=\"$(dirname \"$0\")\"\n\
             if [ -e \"$dir/fail\" ]; then echo 'the identity provider is down' >&2; exit 1; fi\n\
             n=$(( $(cat \"$dir/count\" 2>/dev/null || echo 0) + 1 ))\necho \"$n\" > \"$dir/count\"\n\
             exp=$(( $(date +%s) + {lifetime} ))\n\
             printf '{{\"Version\": 1, \"AccessKeyId\": \"AKIDPROCESS\", \"SecretAccessKey\": \
             \"process-secret-%s\", \"SessionToken\": \"session-%s-exp-%s\", \"Expiration\": \
             \"%s\"}}\\n' \"$n\" \"$n\" \"$exp\" \"$(date -u -d \"@$exp\" +%Y-%m-%dT%H:%M:%SZ)\"\n"
        );
        std::fs::write(&script, text).expect("write the credential process");
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let aws = dir.path().join(".aws");
        std::fs::create_dir_all(&aws).expect(".aws");
        let config = format!("[default]\ncredential_process = {}\n", script.display());
        std::fs::write(aws.join("config"), config).expect("write ~/.aws/config");
        CredentialProcess { dir }
    }

    fn home(&self) -> &Path {
        self.dir.path()
    }

    fn fail(&self, on: bool) {
        let flag = self.dir.path().join("fail");
        match on {
            true => std::fs::write(flag, "").expect("set the failure flag"),
            false => std::fs::remove_file(flag).expect("clear the failure flag"),
        }
    }

    /// The secret and expiry of a session the process handed out.
    fn secrets(&self) -> impl Fn(&str) -> Option<(String, SystemTime)> + Send + Sync + 'static {
        |session: &str| {
            let rest = session.strip_prefix("session-")?;
            let (n, exp) = rest.split_once("-exp-")?;
            let exp = UNIX_EPOCH + Duration::from_secs(exp.parse().ok()?);
            Some((format!("process-secret-{n}"), exp))
        }
    }
}

// ------------------------------------------------------------------------------------
// RDS

/// A TLS-only Postgres whose TCP logins go to a fake LDAP server judging RDS IAM tokens.
struct RdsWorld {
    world: World,
    ldap: FakeLdap,
    _certs: tempfile::TempDir,
}

impl RdsWorld {
    /// Tokens must be signed for `postgres` on this server, with one of `keys` (access key
    /// id, secret, session token).
    async fn start(keys: &'static [Keys]) -> RdsWorld {
        let certs = tempfile::Builder::new()
            .prefix("rds-tls-")
            .tempdir_in("/tmp")
            .expect("a certificate directory");
        let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()]).expect("cert");
        std::fs::write(certs.path().join("server.crt"), cert.cert.pem()).expect("write cert");
        let key = certs.path().join("server.key");
        std::fs::write(&key, cert.signing_key.serialize_pem()).expect("write key");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        give_to_server_user(certs.path());
        let port = Arc::new(std::sync::OnceLock::<u16>::new());
        let server_port = port.clone();
        let ldap = FakeLdap::start(move |dn, password| {
            let port = server_port.get().copied().unwrap_or(0);
            dn == "cn=postgres,dc=relay" && rds_token_ok(password, port, keys).is_ok()
        });
        let file = |name: &str| certs.path().join(name).display().to_string();
        let ldap_line = |kind: &str| {
            format!(
                "hostssl {kind} postgres 127.0.0.1/32 ldap ldapserver=127.0.0.1 ldapport={} \
                 ldapprefix=\"cn=\" ldapsuffix=\",dc=relay\"",
                ldap.port()
            )
        };
        let pg = PgCluster::start_with(PgOptions {
            extra_conf: vec![
                ("ssl".into(), "on".into()),
                ("ssl_cert_file".into(), file("server.crt")),
                ("ssl_key_file".into(), file("server.key")),
            ],
            extra_hba: vec![
                ldap_line("all"),
                ldap_line("replication"),
                "hostnossl all all 127.0.0.1/32 reject".into(),
                "hostnossl replication all 127.0.0.1/32 reject".into(),
            ],
            // Debian's PostgreSQL 15 is built with LDAP.
            major: Some(15),
        });
        let _ = port.set(pg.port());
        RdsWorld {
            world: World::with(pg).await,
            ldap,
            _certs: certs,
        }
    }

    /// `--postgres-url` without a password: the relay signs one.
    fn url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/postgres",
            self.world.pg.port()
        )
    }
}

/// Whether `password` is an RDS IAM token for `postgres` on `127.0.0.1:port`, signed within
/// the last minute with one of `keys`, and still valid.
fn rds_token_ok(password: &str, port: u16, keys: &[Keys]) -> Result<SystemTime, String> {
    let parsed = url::Url::parse(&format!("https://{password}")).map_err(|e| e.to_string())?;
    let query = |name: &str| {
        parsed
            .query_pairs()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.into_owned())
    };
    let signed = signing_time(&query("X-Amz-Date").ok_or("no date")?)?;
    let credential = query("X-Amz-Credential").ok_or("no credential")?;
    let access_key = credential.split('/').next().unwrap_or_default();
    let keys = keys
        .iter()
        .find(|keys| keys.id == access_key)
        .ok_or_else(|| format!("unknown access key {access_key}"))?;
    let session = keys.session.map(str::to_owned);
    let credentials = Credentials::new(keys.id, keys.secret, session, None, "test");
    let expected = sign::rds_token(&credentials, REGION, "127.0.0.1", port, "postgres", signed)
        .map_err(|e| e.to_string())?;
    if expected != password {
        return Err("not the token of these credentials for this host, port and user".to_owned());
    }
    let age = SystemTime::now().duration_since(signed).unwrap_or_default();
    match age < Duration::from_secs(60) {
        true => Ok(signed),
        false => Err("signed too long ago".to_owned()),
    }
}

/// Credentials the test hands the relay, as the fake servers know them.
struct Keys {
    id: &'static str,
    secret: &'static str,
    session: Option<&'static str>,
}

const ENV_KEYS: &[Keys] = &[Keys {
    id: "AKIDENVIRONMENT",
    secret: "env-secret-key",
    session: Some("env-session"),
}];

fn env_credentials(home: &str) -> Vec<(&'static str, String)> {
    vec![
        ("HOME", home.to_owned()),
        ("AWS_EC2_METADATA_DISABLED", "true".to_owned()),
        ("AWS_ACCESS_KEY_ID", "AKIDENVIRONMENT".to_owned()),
        ("AWS_SECRET_ACCESS_KEY", "env-secret-key".to_owned()),
        ("AWS_SESSION_TOKEN", "env-session".to_owned()),
    ]
}

/// Every connection (control and replication) logs in with an RDS IAM token signed for it;
/// when the stream breaks, the reconnect signs a new one.
#[tokio::test]
async fn rds_iam_signs_a_token_for_every_connection_and_reconnect() {
    let rds = RdsWorld::start(ENV_KEYS).await;
    let home = tempfile::tempdir().expect("empty HOME");
    let env = env_credentials(&home.path().display().to_string());
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let args = ["--postgres-auth", "aws-rds-iam", "--aws-region", REGION];
    let mut relay = Relay::spawn_env(&rds.url(), &rds.world.broker.bootstrap(), &args, &env);
    relay.wait_streaming();
    relays_one_event(&rds.world, &relay, "OrderCreated").await;
    let binds = rds.ldap.binds();
    assert!(
        binds.len() >= 2,
        "control and replication connections: {binds:#?}"
    );
    assert!(
        binds.iter().all(|b| b.accepted),
        "{binds:#?}\n{}",
        relay.log()
    );

    // The walsender dies: the relay reconnects with a token signed after that.
    let killed = SystemTime::now();
    let seen = binds.len();
    assert!(rds.world.pg.kill_walsenders().await >= 1);
    relays_one_event(&rds.world, &relay, "OrderPaid").await;
    let binds = rds.ldap.binds();
    let port = rds.world.pg.port();
    let fresh = binds[seen..].iter().filter(|b| b.accepted).any(|b| {
        let signed = rds_token_ok(&b.password, port, ENV_KEYS);
        signed.is_ok_and(|at| at + Duration::from_secs(1) > killed)
    });
    assert!(
        fresh,
        "no token signed after the reconnect: {:#?}",
        &binds[seen..]
    );
    assert!(binds.iter().all(|b| b.accepted), "{binds:#?}");
    // Static keys: fetched once, at start-up, which /metrics shows all the same.
    let sources = relay.metric_samples("outbox_relay_aws_credentials_info");
    let environment = ("{source=\"environment\"}".to_owned(), 1.0);
    assert!(sources.contains(&environment), "{sources:?}");
    let expiry = relay.metric("outbox_relay_aws_credentials_expiry_timestamp_seconds");
    assert_eq!(expiry, Some(f64::INFINITY));
    let tokens = relay.metric_samples("outbox_relay_auth_tokens_total");
    assert!(
        tokens
            .iter()
            .any(|(l, v)| l.contains("postgres") && *v >= 3.0),
        "{tokens:?}"
    );
    assert!(!relay.log().contains("env-secret-key"));
}

/// Inserts one `event_type` event and checks it reaches the world's broker.
async fn relays_one_event(world: &World, relay: &Relay, event_type: &str) {
    let ids = world.insert_tx(&[(event_type, "order-1", "{}")]).await;
    let timeout = Duration::from_secs(60);
    let records = world.broker.consume(&[event_type], 1, timeout);
    let got: Vec<String> = records.iter().map(|r| r.id()).collect();
    assert_eq!(got, ids, "{}", relay.log());
}

/// The standard chain, as the relay runs it: environment variables, static keys in a
/// profile in `HOME`, web identity (IRSA's file and role, exchanged with STS),
/// `--aws-role-arn` assumed on top, the container endpoint (ECS, EKS Pod Identity) and
/// instance metadata (IMDSv2, which also says the region); each signs the token `status`
/// logs in with.
#[tokio::test]
async fn credentials_come_from_each_source_of_the_chain() {
    const KEYS: &[Keys] = &[
        Keys {
            id: "AKIDENVIRONMENT",
            secret: "env-secret-key",
            session: Some("env-session"),
        },
        Keys {
            id: "AKIDPROFILE",
            secret: "profile-secret-key",
            session: None,
        },
        Keys {
            id: "AKIDWEBIDENTITY",
            secret: "web-identity-secret",
            session: Some("web-identity-session"),
        },
        Keys {
            id: "AKIDASSUMEDROLE",
            secret: "assumed-role-secret",
            session: Some("assumed-role-session"),
        },
        Keys {
            id: "AKIDCONTAINER",
            secret: "container-secret",
            session: Some("container-session"),
        },
        Keys {
            id: "AKIDINSTANCE",
            secret: "instance-secret",
            session: Some("instance-session"),
        },
    ];
    let rds = RdsWorld::start(KEYS).await;
    let sts = FakeHttp::start(fake_sts);
    let metadata = FakeHttp::start(fake_metadata);
    let dir = tempfile::tempdir().expect("temp dir");
    let empty_home = dir.path().join("empty");
    let profile_home = dir.path().join("profile");
    std::fs::create_dir_all(profile_home.join(".aws")).expect("~/.aws");
    std::fs::create_dir_all(&empty_home).expect("HOME");
    let credentials =
        "[default]\naws_access_key_id = AKIDPROFILE\naws_secret_access_key = profile-secret-key\n";
    std::fs::write(profile_home.join(".aws/credentials"), credentials).expect("credentials file");
    let web_token = dir.path().join("web-identity-token");
    std::fs::write(&web_token, "eyJ.web-identity-of-the-pod.sig").expect("token file");
    let path = |p: &PathBuf| p.display().to_string();
    let base = |home: &PathBuf| {
        vec![
            ("HOME", path(home)),
            ("AWS_EC2_METADATA_DISABLED", "true".to_owned()),
            ("AWS_ENDPOINT_URL_STS", sts.url()),
        ]
    };
    let mut environment = base(&empty_home);
    environment.extend(env_credentials(&path(&empty_home)).into_iter().skip(2));
    let mut web_identity = base(&empty_home);
    web_identity.push(("AWS_WEB_IDENTITY_TOKEN_FILE", path(&web_token)));
    web_identity.push((
        "AWS_ROLE_ARN",
        "arn:aws:iam::123456789012:role/relay-pod".to_owned(),
    ));
    let mut container = base(&empty_home);
    container.push((
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        format!("{}/v2/credentials/relay-task", metadata.url()),
    ));
    // Instance metadata on, at the fake's address; no --aws-region: it says the region too.
    let instance = vec![
        ("HOME", path(&empty_home)),
        ("AWS_EC2_METADATA_SERVICE_ENDPOINT", metadata.url()),
    ];
    const REGION_ARGS: [&str; 2] = ["--aws-region", REGION];
    const ROLE: [&str; 4] = [
        "--aws-region",
        REGION,
        "--aws-role-arn",
        "arn:aws:iam::123456789012:role/relay-assumed",
    ];
    let sources = [
        Source {
            name: "environment",
            env: environment.clone(),
            args: &REGION_ARGS,
            access_key: "AKIDENVIRONMENT",
        },
        Source {
            name: "profile",
            env: base(&profile_home),
            args: &REGION_ARGS,
            access_key: "AKIDPROFILE",
        },
        Source {
            name: "web identity",
            env: web_identity,
            args: &REGION_ARGS,
            access_key: "AKIDWEBIDENTITY",
        },
        Source {
            name: "assumed role",
            env: environment,
            args: &ROLE,
            access_key: "AKIDASSUMEDROLE",
        },
        Source {
            name: "container",
            env: container,
            args: &REGION_ARGS,
            access_key: "AKIDCONTAINER",
        },
        Source {
            name: "instance metadata",
            env: instance,
            args: &[],
            access_key: "AKIDINSTANCE",
        },
    ];
    for Source {
        name: source,
        env,
        args: extra,
        access_key,
    } in sources
    {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let url = rds.url();
        let mut args = vec![
            "status",
            "--postgres-url",
            &url,
            "--postgres-auth",
            "aws-rds-iam",
        ];
        args.extend_from_slice(extra);
        let mut relay = Relay::spawn_raw_env(&args, &env);
        let status = relay.wait_exit(Duration::from_secs(60));
        let log = relay.log();
        assert_eq!(status.and_then(|s| s.code()), Some(0), "{source}: {log}");
        let binds = rds.ldap.binds();
        let last = binds.last().expect("a login");
        assert!(
            last.accepted && last.password.contains(access_key),
            "{source}: {last:?}"
        );
        for keys in KEYS {
            let secret = keys.secret;
            assert!(!log.contains(secret), "{source}: {secret} in the log");
        }
    }
    // Keys the server does not take: refused before anything else, with what to grant.
    let refused = [
        ("HOME", path(&empty_home)),
        ("AWS_EC2_METADATA_DISABLED", "true".to_owned()),
        ("AWS_ACCESS_KEY_ID", "AKIDUNKNOWN".to_owned()),
        ("AWS_SECRET_ACCESS_KEY", "unknown-secret-key".to_owned()),
    ];
    let env: Vec<(&str, &str)> = refused.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let url = rds.url();
    let args = [
        "status",
        "--postgres-url",
        &url,
        "--postgres-auth",
        "aws-rds-iam",
        "--aws-region",
        REGION,
    ];
    let mut relay = Relay::spawn_raw_env(&args, &env);
    let status = relay.wait_exit(Duration::from_secs(60));
    let log = relay.log();
    assert_eq!(status.and_then(|s| s.code()), Some(EXIT_CONFIG), "{log}");
    assert!(
        log.contains("refused the RDS IAM token") && log.contains("rds-db:connect"),
        "{log}"
    );
    assert!(!log.contains("unknown-secret-key"), "{log}");

    // STS got the pod's token and role, and the role assumption was signed with the
    // environment's keys.
    let requests = sts.requests();
    let web = requests
        .iter()
        .find(|r| r.body.contains("AssumeRoleWithWebIdentity"));
    let web = web.expect("an AssumeRoleWithWebIdentity request");
    assert!(
        web.body
            .contains("WebIdentityToken=eyJ.web-identity-of-the-pod.sig"),
        "{web:?}"
    );
    assert!(web.body.contains("relay-pod"), "{web:?}");
    let assume = requests
        .iter()
        .find(|r| r.body.contains("Action=AssumeRole&"));
    let assume = assume.expect("an AssumeRole request");
    let signed = assume.header("authorization").unwrap_or_default();
    assert!(signed.contains("Credential=AKIDENVIRONMENT/"), "{assume:?}");
    assert!(
        assume.body.contains("RoleSessionName=outbox-relay"),
        "{assume:?}"
    );
}

/// A source of credentials: the relay's environment and flags, and the access key its
/// token must carry.
struct Source {
    name: &'static str,
    env: Vec<(&'static str, String)>,
    args: &'static [&'static str],
    access_key: &'static str,
}

/// The container credentials endpoint and IMDSv2 (token, role, the role's credentials, the
/// region), answering with fixed credentials.
fn fake_metadata(request: &Request) -> Answer {
    let expiry = humantime::format_rfc3339_seconds(SystemTime::now() + Duration::from_secs(3600));
    let credentials = |id: &str, secret: &str, session: &str| {
        format!(
            "{{\"Code\":\"Success\",\"Type\":\"AWS-HMAC\",\"AccessKeyId\":\"{id}\",\
             \"SecretAccessKey\":\"{secret}\",\"Token\":\"{session}\",\
             \"Expiration\":\"{expiry}\",\"LastUpdated\":\"{expiry}\"}}"
        )
    };
    let role = "/latest/meta-data/iam/security-credentials/";
    match (request.method.as_str(), request.path.as_str()) {
        ("GET", "/v2/credentials/relay-task") => Answer::new(
            200,
            "application/json",
            credentials("AKIDCONTAINER", "container-secret", "container-session"),
        ),
        ("PUT", "/latest/api/token") => Answer::new(200, "text/plain", "imds-session-token")
            .with_header("x-aws-ec2-metadata-token-ttl-seconds", "21600"),
        _ if request.header("x-aws-ec2-metadata-token") != Some("imds-session-token") => {
            Answer::new(401, "text/plain", "")
        }
        ("GET", path) if path == role => Answer::new(200, "text/plain", "relay-instance"),
        ("GET", path) if path == format!("{role}relay-instance") => Answer::new(
            200,
            "application/json",
            credentials("AKIDINSTANCE", "instance-secret", "instance-session"),
        ),
        ("GET", "/latest/meta-data/placement/region") => Answer::new(200, "text/plain", REGION),
        _ => Answer::new(404, "text/plain", ""),
    }
}

/// STS's `AssumeRoleWithWebIdentity` and `AssumeRole`, answering with fixed credentials;
/// a web identity token other than the pod's is refused as STS does.
fn fake_sts(request: &Request) -> Answer {
    let expiry = humantime::format_rfc3339_seconds(SystemTime::now() + Duration::from_secs(3600));
    let web_identity = request.body.contains("Action=AssumeRoleWithWebIdentity");
    if web_identity && !request.body.contains("eyJ.web-identity-of-the-pod.sig") {
        let error = "<ErrorResponse><Error><Type>Sender</Type><Code>AccessDenied</Code>\
                     <Message>Not authorized to perform sts:AssumeRoleWithWebIdentity</Message>\
                     </Error><RequestId>1</RequestId></ErrorResponse>";
        return Answer::new(403, "text/xml", error);
    }
    let action = match web_identity {
        true => "AssumeRoleWithWebIdentity",
        false => "AssumeRole",
    };
    let keys = match web_identity {
        true => Keys {
            id: "AKIDWEBIDENTITY",
            secret: "web-identity-secret",
            session: Some("web-identity-session"),
        },
        false => Keys {
            id: "AKIDASSUMEDROLE",
            secret: "assumed-role-secret",
            session: Some("assumed-role-session"),
        },
    };
    let id = keys.id;
    let secret = keys.secret;
    let session = keys.session.unwrap_or_default();
    let body = format!(
        "<{action}Response xmlns=\"https://sts.amazonaws.com/doc/2011-06-15/\"><{action}Result>\
         <Credentials><AccessKeyId>{id}</AccessKeyId><SecretAccessKey>{secret}</SecretAccessKey>\
         <SessionToken>{session}</SessionToken><Expiration>{expiry}</Expiration></Credentials>\
         <AssumedRoleUser><AssumedRoleId>AROATEST:outbox-relay</AssumedRoleId>\
         <Arn>arn:aws:sts::123456789012:assumed-role/relay/outbox-relay</Arn></AssumedRoleUser>\
         </{action}Result><ResponseMetadata><RequestId>1</RequestId></ResponseMetadata>\
         </{action}Response>"
    );
    Answer::new(200, "text/xml", body)
}

/// A start-up the relay refuses: its environment and flags, and what the refusal says.
struct Refusal<'a> {
    env: &'a [(&'a str, &'a str)],
    args: &'a [&'a str],
    says: &'a [&'a str],
}

/// No credentials, credentials refused, no region: exit 2 before any connection, saying
/// what was tried and what to do, and nothing secret.
#[test]
fn missing_or_refused_credentials_stop_the_relay_at_start_up_with_what_was_tried() {
    let sts = FakeHttp::start(fake_sts);
    let dir = tempfile::tempdir().expect("temp dir");
    let home = dir.path().display().to_string();
    let wrong_token = dir.path().join("token");
    std::fs::write(&wrong_token, "eyJ.a-token-sts-refuses.sig").expect("token file");
    let token_file = wrong_token.display().to_string();
    let msk = ["--kafka-auth", "aws-msk-iam"];
    // Nothing listens on these: a connection attempt would fail with exit 3 or 4.
    let head = [
        "--postgres-url",
        "postgres://relay@127.0.0.1:1/app",
        "--kafka-brokers",
        "127.0.0.1:1",
    ];
    let none = [
        ("HOME", home.as_str()),
        ("AWS_EC2_METADATA_DISABLED", "true"),
    ];
    let refused = [
        ("HOME", home.as_str()),
        ("AWS_EC2_METADATA_DISABLED", "true"),
        ("AWS_ENDPOINT_URL_STS", &sts.url()),
        ("AWS_WEB_IDENTITY_TOKEN_FILE", &token_file),
        ("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/relay-pod"),
    ];
    let region = ["--aws-region", REGION];
    let cases = [
        Refusal {
            env: &none,
            args: &region,
            says: &[
                "no AWS credentials were found",
                "AWS_ACCESS_KEY_ID is not set",
                "/.aws/credentials (missing)",
                "eks.amazonaws.com/role-arn",
                "disabled by AWS_EC2_METADATA_DISABLED",
            ],
        },
        Refusal {
            env: &refused,
            args: &region,
            says: &[
                "the AWS credential chain failed",
                "AccessDenied",
                "web identity (AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN are set)",
            ],
        },
        Refusal {
            env: &none,
            args: &[],
            says: &["no AWS region", "--aws-region"],
        },
    ];
    for Refusal {
        env,
        args: extra,
        says: needles,
    } in cases
    {
        let args = [&head[..], &msk, extra].concat();
        let mut relay = Relay::spawn_raw_env(&args, env);
        let status = relay.wait_exit(Duration::from_secs(60));
        let log = relay.log();
        assert_eq!(status.and_then(|s| s.code()), Some(EXIT_CONFIG), "{log}");
        for needle in needles {
            assert!(log.contains(needle), "{needle}: {log}");
        }
        assert!(!log.contains("a-token-sts-refuses"), "{log}");
        assert!(
            !log.contains("127.0.0.1:1"),
            "connected before the credentials: {log}"
        );
    }
}

// ------------------------------------------------------------------------------------
// OAuth for other Kafkas

/// librdkafka's OIDC client, set up with `-X` as docs/operations.md says for Confluent
/// Cloud (client credentials, scope, SASL extensions), fetches a token from the identity
/// provider and every client of the relay logs in with it.
#[tokio::test]
async fn librdkafkas_oidc_client_logs_the_relay_in_through_properties() {
    let world = World::start().await;
    let issued = jwt("relay-client", 3600);
    let token = issued.clone();
    let idp = FakeHttp::start(move |_| {
        let body = format!(
            "{{\"access_token\":\"{token}\",\"token_type\":\"Bearer\",\"expires_in\":3600}}"
        );
        Answer::new(200, "application/json", body)
    });
    let expected = issued.clone();
    let validator: Validator = Arc::new(move |token: &str| match token == expected {
        true => Ok(Duration::from_secs(3600)),
        false if token.starts_with("eyJ") && token.contains('.') => Ok(Duration::from_secs(3600)),
        false => Err("not a token of the identity provider".to_owned()),
    });
    let broker = SaslBroker::start(validator);
    let endpoint = format!(
        "sasl.oauthbearer.token.endpoint.url={}/oauth2/token",
        idp.url()
    );
    let args = [
        "-X",
        "security.protocol=SASL_PLAINTEXT",
        "-X",
        "sasl.mechanism=OAUTHBEARER",
        "-X",
        "sasl.oauthbearer.method=oidc",
        "-X",
        &endpoint,
        "-X",
        "sasl.oauthbearer.client.id=relay-client",
        "-X",
        "sasl.oauthbearer.client.secret=relay-client-secret",
        "-X",
        "sasl.oauthbearer.scope=kafka",
        "-X",
        "sasl.oauthbearer.extensions=logicalCluster=lkc-test,identityPoolId=pool-test",
    ];
    let mut relay = Relay::spawn_env(&world.pg.url(), &broker.bootstrap(), &args, &[]);
    relay.wait_streaming();
    let ids = world.insert_tx(&[("OrderCreated", "order-1", "{}")]).await;
    let records = consume_with(
        &broker.bootstrap(),
        &READER,
        &["OrderCreated"],
        1,
        Duration::from_secs(30),
    );
    assert_eq!(
        records.iter().map(|r| r.id()).collect::<Vec<_>>(),
        ids,
        "{}",
        relay.log()
    );

    let requests = idp.requests();
    let request = requests.first().expect("a token request");
    assert_eq!(request.method, "POST");
    assert!(
        request.body.contains("grant_type=client_credentials"),
        "{request:?}"
    );
    assert!(request.body.contains("scope=kafka"), "{request:?}");
    let basic = STANDARD.encode("relay-client:relay-client-secret");
    assert_eq!(
        request.header("authorization"),
        Some(format!("Basic {basic}").as_str())
    );
    let logins = broker.logins();
    let relays: Vec<&Login> = logins.iter().filter(|l| l.token == issued).collect();
    assert!(!relays.is_empty(), "{logins:#?}");
    for login in relays {
        assert!(
            login
                .extensions
                .contains(&"logicalCluster=lkc-test".to_owned()),
            "{login:?}"
        );
        assert!(
            login
                .extensions
                .contains(&"identityPoolId=pool-test".to_owned()),
            "{login:?}"
        );
    }
    assert!(!relay.log().contains("relay-client-secret"));
}

/// librdkafka's own unsecured JWT (development brokers) still logs the relay in: the token
/// callback every client has for `--kafka-auth` stays out of its way.
#[tokio::test]
async fn librdkafkas_unsecured_jwt_still_works_without_kafka_auth() {
    let world = World::start().await;
    let jwt_of_relay: Validator = Arc::new(|token: &str| {
        let payload = token.split('.').nth(1).unwrap_or_default();
        let claims = URL_SAFE_NO_PAD.decode(payload).unwrap_or_default();
        match String::from_utf8_lossy(&claims).contains("\"sub\":\"relay\"") {
            true => Ok(Duration::from_secs(3600)),
            false => Err("not the relay's JWT".to_owned()),
        }
    });
    let broker = SaslBroker::start(jwt_of_relay);
    let args = [
        "-X",
        "security.protocol=SASL_PLAINTEXT",
        "-X",
        "sasl.mechanism=OAUTHBEARER",
        "-X",
        "enable.sasl.oauthbearer.unsecure.jwt=true",
        "-X",
        "sasl.oauthbearer.config=principal=relay",
    ];
    let mut relay = Relay::spawn_env(&world.pg.url(), &broker.bootstrap(), &args, &[]);
    relay.wait_streaming();
    let ids = world.insert_tx(&[("OrderCreated", "order-1", "{}")]).await;
    let written = world.current_lsn().await;
    let confirmed = world
        .wait_confirmed(SLOT, written, Duration::from_secs(30))
        .await;
    assert!(confirmed >= written, "{}", relay.log());
    assert_eq!(ids.len(), 1);
    let logins = broker.logins();
    assert!(
        !logins.is_empty() && logins.iter().all(|l| l.verdict.is_ok()),
        "{logins:#?}"
    );
}

/// An unsigned JWT for `sub` expiring in `seconds`, as an identity provider would issue
/// (librdkafka reads `sub` and `exp`; the broker checks the signature, the front here does not).
fn jwt(sub: &str, seconds: u64) -> String {
    let exp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
        + seconds;
    let header = URL_SAFE_NO_PAD.encode(r#"{"alg":"RS256","typ":"JWT"}"#);
    let payload = URL_SAFE_NO_PAD.encode(format!(
        r#"{{"sub":"{sub}","exp":{exp},"iat":{}}}"#,
        exp - seconds
    ));
    format!("{header}.{payload}.c2lnbmF0dXJl")
}
