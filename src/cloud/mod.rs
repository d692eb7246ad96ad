//! Cloud identities instead of static secrets: AWS IAM for Amazon MSK (`--kafka-auth
//! aws-msk-iam`: SASL/OAUTHBEARER with the MSK IAM token, refreshed through librdkafka's
//! OAUTHBEARER refresh) and for RDS and Aurora PostgreSQL (`--postgres-auth aws-rds-iam`: a
//! fresh IAM token as the password of every connection the relay opens).
//!
//! The flags become a [`KafkaAuth`] and a [`PostgresAuth`] in the validated configuration,
//! sharing one [`aws::Aws`] identity; [`start`] fetches its first credentials before any
//! connection is opened. Every Kafka client is made with a context whose token
//! callback signs with that identity, and every Postgres connection takes its password from
//! [`PostgresAuth::password`]. Other OAuth providers (Confluent Cloud, Google Cloud Managed
//! Kafka, Azure Event Hubs) need nothing here: librdkafka's own OIDC client is configured
//! with `-X` (docs/operations.md).

pub mod aws;
pub mod kafka;

use std::sync::Arc;

use aws::Aws;

pub use kafka::KafkaAuth;

use crate::observability::health::Health;

/// An AWS identity could not give what a connection needs; no secret is in the message.
#[derive(Debug, thiserror::Error)]
pub enum CloudError {
    /// No region for the tokens.
    #[error(
        "no AWS region for the IAM tokens: give --aws-region (or set AWS_REGION), or a region \
         in the AWS profile; the relay also reads it from MSK and RDS host names and, on EC2, \
         from the instance metadata"
    )]
    NoRegion,
    /// `aws-config` built no credential chain.
    #[error("the AWS configuration has no credential chain")]
    NoChain,
    /// The chain gave no credentials at start-up: what it tried and what to do.
    #[error("{explanation}")]
    Credentials {
        /// The sources tried, what this environment has for each, and the remedy.
        explanation: String,
    },
    /// The credentials at hand expired and fetching new ones fails (while running: retried).
    #[error(
        "the AWS credentials expired at {expired} and fetching new ones fails ({failing}); \
         retrying"
    )]
    Expired {
        /// When they expired (RFC 3339).
        expired: String,
        /// Why the last fetch failed.
        failing: String,
    },
    /// A broker refused the MSK IAM token: the identity's policy or the cluster's settings.
    #[error(
        "the Kafka brokers refused the MSK IAM token ({reason}): the AWS identity needs \
         kafka-cluster:Connect on the cluster and the topic and group actions of \
         docs/operations.md (AWS IAM), the cluster IAM access control, and --aws-region the \
         cluster's region"
    )]
    KafkaRefused {
        /// librdkafka's report: the broker and its message.
        reason: String,
    },
    /// A token could not be signed.
    #[error("cannot sign the AWS IAM token")]
    Sign(#[from] aws::sign::SignError),
    /// A token was asked for before [`start`].
    #[error("the AWS identity was not started (a bug: please report it)")]
    NotStarted,
}

/// How the relay logs in to Postgres.
#[derive(Clone, Debug, Default)]
pub enum PostgresAuth {
    /// The password from `--postgres-url`, `--postgres-password` or its file, if any.
    #[default]
    Password,
    /// `--postgres-auth aws-rds-iam`: an RDS IAM token minted for every connection.
    AwsRdsIam(Arc<Aws>),
}

impl PartialEq for PostgresAuth {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (PostgresAuth::Password, PostgresAuth::Password) => true,
            (PostgresAuth::AwsRdsIam(a), PostgresAuth::AwsRdsIam(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

impl Eq for PostgresAuth {}

impl PostgresAuth {
    /// The password for a connection to `host:port` as `user`: `configured` (the URL's or
    /// the flags'), or a fresh RDS IAM token.
    pub async fn password(
        &self,
        configured: Option<&str>,
        host: &str,
        port: u16,
        user: &str,
    ) -> Result<Option<String>, CloudError> {
        match self {
            PostgresAuth::Password => Ok(configured.map(str::to_owned)),
            PostgresAuth::AwsRdsIam(aws) => {
                let token = aws.rds_token(host, port, user).await?;
                metrics::counter!(crate::observability::metrics::AUTH_TOKENS, "target" => "postgres")
                    .increment(1);
                Ok(Some(token))
            }
        }
    }
}

/// Fetches the first AWS credentials when `kafka` or `postgres` uses AWS IAM, and keeps
/// them fresh from then on (on the current runtime); `health` then says when that fails.
pub async fn start(
    kafka: &KafkaAuth,
    postgres: &PostgresAuth,
    health: Option<Arc<Health>>,
) -> Result<(), CloudError> {
    let aws = match (kafka, postgres) {
        (KafkaAuth::AwsMskIam(aws), _) | (_, PostgresAuth::AwsRdsIam(aws)) => aws,
        _ => return Ok(()),
    };
    aws.start(health).await
}
