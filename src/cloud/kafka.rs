//! SASL/OAUTHBEARER for the relay's Kafka clients: the MSK IAM token, handed to librdkafka
//! whenever it asks (at start and at 80% of the last token's lifetime) through rdkafka's
//! `ClientContext::generate_oauth_token`.
//!
//! Every client the relay makes (the producer, the lineage reader and writer, exactly-once's
//! tail reader, the subcommands' clients) has a context that answers the ask with
//! [`KafkaAuth::oauth_token`] (`sink::KafkaClients::context`, the producer's own), so
//! `--kafka-auth` reaches them all. librdkafka asks only under `sasl.mechanism=OAUTHBEARER` without its own
//! OIDC client (`sasl.oauthbearer.method=oidc` refreshes inside librdkafka): for other setups
//! the callback is never called. librdkafka serves the ask on the thread that polls the
//! client's queue, so the token is signed from credentials already at hand, never fetched.

use std::error::Error;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use rdkafka::client::OAuthToken;
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use super::aws::Aws;
use crate::observability::metrics::{AUTH_TOKEN_FAILURES, AUTH_TOKENS};

/// librdkafka's principal for the token: only named in its own logs.
const PRINCIPAL: &str = "outbox-relay";

/// How the relay's Kafka clients authenticate, beyond what `-X` sets.
#[derive(Clone, Debug, Default)]
pub enum KafkaAuth {
    /// As the `-X` properties say (none, PLAIN, SCRAM, mTLS, librdkafka's OIDC client).
    #[default]
    Properties,
    /// `--kafka-auth aws-msk-iam`: SASL/OAUTHBEARER with MSK IAM tokens from this identity.
    AwsMskIam(Arc<Aws>),
}

impl KafkaAuth {
    /// The properties this authentication needs, set before the `-X` ones (which may change
    /// them: `security.protocol=SASL_PLAINTEXT` for a broker without TLS, say).
    pub fn properties(&self) -> &'static [(&'static str, &'static str)] {
        match self {
            KafkaAuth::Properties => &[],
            KafkaAuth::AwsMskIam(_) => &[
                ("security.protocol", "SASL_SSL"),
                ("sasl.mechanism", "OAUTHBEARER"),
            ],
        }
    }

    /// Sets [`KafkaAuth::properties`] on `config`.
    pub fn configure(&self, config: &mut ClientConfig) {
        for (key, value) in self.properties() {
            config.set(*key, *value);
        }
    }

    /// Notes what librdkafka reports (an error event): a broker refusing the MSK IAM token.
    pub fn observe(&self, error: &KafkaError, reason: &str) {
        let KafkaAuth::AwsMskIam(aws) = self else {
            return;
        };
        // librdkafka's own failures to get a token say "Failed to acquire": not a refusal.
        let refused = error.rdkafka_error_code() == Some(RDKafkaErrorCode::Authentication)
            && reason.contains("SASL authentication error");
        if refused {
            aws.kafka_refused(reason);
        }
    }

    /// What a broker said when it last refused the MSK IAM token, if one did.
    pub fn refusal(&self) -> Option<String> {
        match self {
            KafkaAuth::Properties => None,
            KafkaAuth::AwsMskIam(aws) => aws.kafka_refusal(),
        }
    }

    /// The OAUTHBEARER token librdkafka asked for, signed at `now`.
    pub fn oauth_token(&self, now: SystemTime) -> Result<OAuthToken, Box<dyn Error>> {
        let KafkaAuth::AwsMskIam(aws) = self else {
            return Err(
                "librdkafka asked for an OAUTHBEARER token, but the relay mints none: \
                        use --kafka-auth aws-msk-iam for Amazon MSK, or librdkafka's OIDC \
                        client (-X sasl.oauthbearer.method=oidc and its properties)"
                    .into(),
            );
        };
        match aws.msk_token(now) {
            Ok(token) => {
                metrics::counter!(AUTH_TOKENS, "target" => "kafka").increment(1);
                let expiry = token.expires.duration_since(UNIX_EPOCH).unwrap_or_default();
                Ok(OAuthToken {
                    token: token.value,
                    principal_name: PRINCIPAL.to_owned(),
                    lifetime_ms: i64::try_from(expiry.as_millis()).unwrap_or(i64::MAX),
                })
            }
            Err(error) => {
                metrics::counter!(AUTH_TOKEN_FAILURES, "target" => "kafka").increment(1);
                let text = crate::observability::Chain(&error).to_string();
                tracing::warn!(
                    error = %text,
                    "cannot sign the MSK IAM token; librdkafka asks again in 10 s, and deliveries \
                     wait meanwhile"
                );
                Err(text.into())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_msk_iam_the_ask_is_refused_with_the_remedy() {
        let err = KafkaAuth::Properties.oauth_token(SystemTime::now()).err();
        let text = err.map(|e| e.to_string()).unwrap_or_default();
        assert!(text.contains("--kafka-auth aws-msk-iam"), "{text}");
        assert!(text.contains("sasl.oauthbearer.method=oidc"), "{text}");
        assert!(KafkaAuth::Properties.properties().is_empty());
    }
}
