//! The AWS credential chain and region, built with `aws-config` on the relay's rustls and
//! ring: environment variables, the shared profile (with `credential_process` and
//! `role_arn`), web identity (EKS IRSA), the container endpoint (ECS, EKS Pod Identity) and
//! instance metadata (EC2), optionally wrapped in an assumed role. What was tried, when
//! nothing gave credentials, is said from [`ChainFacts`] by a PURE function.

use std::path::PathBuf;

use aws_config::BehaviorVersion;
use aws_config::environment::region::EnvironmentVariableRegionProvider;
use aws_config::imds::region::ImdsRegionProvider;
use aws_config::meta::region::ProvideRegion;
use aws_config::profile::ProfileFileRegionProvider;
use aws_config::provider_config::ProviderConfig;
use aws_config::sts::AssumeRoleProvider;
use aws_credential_types::Credentials;
use aws_credential_types::credential_feature::AwsCredentialFeature;
use aws_credential_types::provider::SharedCredentialsProvider;
use aws_credential_types::provider::error::CredentialsError;
use aws_smithy_http_client::tls::{Provider, rustls_provider::CryptoMode};
use aws_types::region::Region;

use super::{AwsSettings, CloudError, region};

/// Where the credentials the chain gave come from, for the log and the
/// `outbox_relay_aws_credentials_info` metric's `source` label.
pub fn source(credentials: &Credentials) -> &'static str {
    use AwsCredentialFeature as F;
    let features = credentials.get_property::<Vec<F>>();
    let has = |feature: F| features.is_some_and(|all| all.contains(&feature));
    // The most specific first: a role assumed from a profile's keys is the role.
    let named = [
        (F::CredentialsStsAssumeRole, "assumed-role"),
        (F::CredentialsStsAssumeRoleWebId, "web-identity"),
        (F::CredentialsProfileStsWebIdToken, "web-identity"),
        (F::CredentialsEnvVarsStsWebIdToken, "web-identity"),
        (F::CredentialsProcess, "credential-process"),
        (F::CredentialsProfileProcess, "credential-process"),
        (F::CredentialsProfile, "profile"),
        (F::CredentialsEnvVars, "environment"),
        (F::CredentialsHttp, "container"),
        (F::CredentialsImds, "instance-metadata"),
    ];
    let found = named.into_iter().find(|(feature, _)| has(feature.clone()));
    found.map_or("other", |(_, name)| name)
}

/// The chain to fetch credentials from, and the region tokens are signed for.
pub(super) struct Chain {
    pub region: String,
    pub provider: SharedCredentialsProvider,
}

/// Resolves the region and builds the credential chain (no credentials are fetched yet).
pub(super) async fn build(settings: &AwsSettings) -> Result<Chain, CloudError> {
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(Provider::Rustls(CryptoMode::Ring))
        .build_https();
    let providers = ProviderConfig::default().with_http_client(http.clone());
    let found = find_region(settings, &providers).await?;
    let region = found.name;
    let from = found.from;
    if let Some(named) = region::from_hosts(settings.hosts.iter().map(String::as_str))
        && named != region
    {
        tracing::warn!(
            region = %region,
            hosts_region = %named,
            "the AWS region ({from}) is not the one the MSK or RDS host names say: tokens are \
             signed for {region} and the servers in {named} refuse them; set --aws-region {named}"
        );
    }
    let sdk = aws_config::defaults(BehaviorVersion::latest())
        .region(Region::new(region.clone()))
        .http_client(http)
        .load()
        .await;
    let chain = sdk.credentials_provider().ok_or(CloudError::NoChain)?;
    let provider = match &settings.role_arn {
        None => chain,
        Some(role) => {
            let assumed = AssumeRoleProvider::builder(role.clone())
                .session_name(settings.session_name.clone())
                .configure(&sdk)
                .build_from_provider(chain)
                .await;
            SharedCredentialsProvider::new(assumed)
        }
    };
    tracing::info!(region = %region, "AWS region {region} ({from})");
    Ok(Chain { region, provider })
}

/// A region, and where it came from.
struct FoundRegion {
    name: String,
    from: &'static str,
}

fn found(name: impl ToString, from: &'static str) -> Result<FoundRegion, CloudError> {
    let name = name.to_string();
    Ok(FoundRegion { name, from })
}

/// The region: `--aws-region`, then `AWS_REGION` or `AWS_DEFAULT_REGION`, the profile's
/// `region`, the MSK or RDS host names, instance metadata.
async fn find_region(
    settings: &AwsSettings,
    providers: &ProviderConfig,
) -> Result<FoundRegion, CloudError> {
    if let Some(region) = &settings.region {
        return found(region, "from --aws-region");
    }
    if let Some(region) = EnvironmentVariableRegionProvider::new().region().await {
        return found(region, "from AWS_REGION or AWS_DEFAULT_REGION");
    }
    let profile = ProfileFileRegionProvider::builder()
        .configure(providers)
        .build();
    if let Some(region) = profile.region().await {
        return found(region, "from the AWS profile");
    }
    if let Some(region) = region::from_hosts(settings.hosts.iter().map(String::as_str)) {
        return found(region, "from the MSK or RDS host names");
    }
    let imds = ImdsRegionProvider::builder().configure(providers).build();
    if let Some(region) = imds.region().await {
        return found(region, "from the instance metadata");
    }
    Err(CloudError::NoRegion)
}

/// What the environment says about each source of the chain, for [`explain`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChainFacts {
    /// `AWS_ACCESS_KEY_ID` (with `AWS_SECRET_ACCESS_KEY`) is set.
    pub env_keys: bool,
    /// `AWS_PROFILE`, else `default`.
    pub profile: String,
    /// The shared credentials and config files, and whether each exists.
    pub profile_files: Vec<(PathBuf, bool)>,
    /// `AWS_WEB_IDENTITY_TOKEN_FILE` and `AWS_ROLE_ARN` are both set (IRSA's pod identity).
    pub web_identity: bool,
    /// `AWS_CONTAINER_CREDENTIALS_RELATIVE_URI` or `..._FULL_URI` is set (ECS, EKS Pod Identity).
    pub container: bool,
    /// `AWS_EC2_METADATA_DISABLED=true`.
    pub imds_disabled: bool,
    /// `--aws-role-arn`.
    pub role_arn: Option<String>,
}

impl ChainFacts {
    /// The facts of this process's environment and files.
    pub fn gather(role_arn: Option<&str>) -> ChainFacts {
        let set = |name: &str| std::env::var_os(name).is_some_and(|v| !v.is_empty());
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let home = var("HOME").map(PathBuf::from).unwrap_or_default();
        let file = |env: &str, default: &str| var(env).map_or(home.join(default), PathBuf::from);
        let files = [
            file("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials"),
            file("AWS_CONFIG_FILE", ".aws/config"),
        ];
        ChainFacts {
            env_keys: set("AWS_ACCESS_KEY_ID"),
            profile: var("AWS_PROFILE").unwrap_or_else(|| "default".to_owned()),
            profile_files: files
                .into_iter()
                .map(|f| (f.clone(), f.is_file()))
                .collect(),
            web_identity: set("AWS_WEB_IDENTITY_TOKEN_FILE") && set("AWS_ROLE_ARN"),
            container: set("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI")
                || set("AWS_CONTAINER_CREDENTIALS_FULL_URI"),
            imds_disabled: var("AWS_EC2_METADATA_DISABLED")
                .is_some_and(|v| v.eq_ignore_ascii_case("true")),
            role_arn: role_arn.map(str::to_owned),
        }
    }
}

/// PURE: what the chain tried, in its order, each with what this environment has for it,
/// and what to do; `error` is the chain's own error (none when it found nothing).
pub fn explain(facts: &ChainFacts, error: Option<&str>) -> String {
    let found = match error {
        Some(error) => format!("the AWS credential chain failed: {error}"),
        None => "no AWS credentials were found".to_owned(),
    };
    let role = match &facts.role_arn {
        Some(role) => format!(" (the source credentials for assuming --aws-role-arn {role})"),
        None => String::new(),
    };
    format!(
        "{found}{role}. Tried, in order: {}. Give the relay credentials in one of these ways \
         (docs/operations.md, AWS IAM)",
        tried(facts).join("; ")
    )
}

/// Each source of the chain, in its order, with what this environment has for it.
fn tried(facts: &ChainFacts) -> [String; 5] {
    let yes_no = |set: bool, yes: &str, no: &str| if set { yes.to_owned() } else { no.to_owned() };
    let files: Vec<String> = (facts.profile_files.iter())
        .map(|(path, exists)| {
            let state = if *exists { "" } else { " (missing)" };
            format!("{}{state}", path.display())
        })
        .collect();
    let env_keys = yes_no(
        facts.env_keys,
        "AWS_ACCESS_KEY_ID is set",
        "AWS_ACCESS_KEY_ID is not set",
    );
    let web_identity = yes_no(
        facts.web_identity,
        "AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN are set",
        "AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN are not both set; on EKS, annotate the \
         service account with eks.amazonaws.com/role-arn",
    );
    let container = yes_no(
        facts.container,
        "AWS_CONTAINER_CREDENTIALS_* is set",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI or _FULL_URI is not set",
    );
    let imds = yes_no(
        facts.imds_disabled,
        "disabled by AWS_EC2_METADATA_DISABLED",
        "no answer: not on EC2, or no instance profile",
    );
    [
        format!("environment variables ({env_keys})"),
        format!(
            "the shared profile {:?} in {}",
            facts.profile,
            files.join(" and ")
        ),
        format!("web identity ({web_identity})"),
        format!("the container endpoint ({container})"),
        format!("instance metadata ({imds})"),
    ]
}

/// The chain's error as text: its message and causes (no secret is among them).
pub fn describe(error: &CredentialsError) -> Option<String> {
    match error {
        CredentialsError::CredentialsNotLoaded(_) => None,
        other => Some(crate::observability::Chain(other).to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> ChainFacts {
        ChainFacts {
            profile: "default".to_owned(),
            profile_files: vec![
                (PathBuf::from("/home/relay/.aws/credentials"), false),
                (PathBuf::from("/home/relay/.aws/config"), true),
            ],
            ..ChainFacts::default()
        }
    }

    /// A change to the facts, and what the explanation must then say.
    struct Case {
        change: fn(&mut ChainFacts),
        says: &'static str,
    }

    #[test]
    fn the_explanation_names_every_source_and_what_it_lacks() {
        let cases = [
            Case {
                change: |_| {},
                says: "no AWS credentials were found. Tried, in order: environment",
            },
            Case {
                change: |_| {},
                says: "AWS_ACCESS_KEY_ID is not set",
            },
            Case {
                change: |_| {},
                says: "/home/relay/.aws/credentials (missing) and /home/relay/.aws/config;",
            },
            Case {
                change: |_| {},
                says: "eks.amazonaws.com/role-arn",
            },
            Case {
                change: |f| f.web_identity = true,
                says: "AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN are set",
            },
            Case {
                change: |f| f.imds_disabled = true,
                says: "disabled by AWS_EC2_METADATA_DISABLED",
            },
            Case {
                change: |f| f.profile = "prod".to_owned(),
                says: "the shared profile \"prod\"",
            },
            Case {
                change: |f| f.role_arn = Some("arn:aws:iam::1:role/r".to_owned()),
                says: "for assuming --aws-role-arn arn:aws:iam::1:role/r",
            },
        ];
        for case in cases {
            let mut facts = facts();
            (case.change)(&mut facts);
            let text = explain(&facts, None);
            assert!(text.contains(case.says), "{}: {text}", case.says);
        }
        let failed = explain(&facts(), Some("STS said no"));
        assert!(
            failed.starts_with("the AWS credential chain failed: STS said no. Tried"),
            "{failed}"
        );
    }

    #[test]
    fn the_source_is_named_by_the_most_specific_feature() {
        let mut credentials = Credentials::new("AKID", "secret", None, None, "test");
        assert_eq!(source(&credentials), "other");
        credentials
            .get_property_mut_or_default::<Vec<AwsCredentialFeature>>()
            .push(AwsCredentialFeature::CredentialsProfile);
        assert_eq!(source(&credentials), "profile");
        credentials
            .get_property_mut_or_default::<Vec<AwsCredentialFeature>>()
            .push(AwsCredentialFeature::CredentialsProcess);
        assert_eq!(source(&credentials), "credential-process");
    }
}
