//! Every Kafka client the relay builds (the producer, the tail reader, the lineage writer, the
//! demo's consumer) starts from [`KafkaClients::config`]: the brokers, `--kafka-auth` and the
//! `-X` properties, set in one place, so that what reaches the brokers (security, TLS, SASL,
//! DNS) reaches them the same way from each; and each has a context from
//! [`KafkaClients::context`], which mints the OAUTHBEARER token librdkafka asks for.

use std::error::Error;
use std::time::SystemTime;

use rdkafka::client::OAuthToken;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::ConsumerContext;
use rdkafka::error::KafkaError;
use rdkafka::{ClientConfig, ClientContext};

use super::SinkError;
use super::client_log::ClientLog;
use crate::cloud::KafkaAuth;

/// Where Kafka is, how clients log in, and the `-X` properties every client takes.
#[derive(Clone, Debug, Default)]
pub struct KafkaClients {
    brokers: String,
    properties: Vec<(String, String)>,
    /// One folding of librdkafka's lines for every client made from these: a client made
    /// for each try of a read (start-up's, while Kafka does not answer) logs no line anew.
    log: ClientLog,
    auth: KafkaAuth,
}

impl KafkaClients {
    /// Clients of `brokers` (`--kafka-brokers`) with `properties` (`-X`, in order).
    pub fn new(brokers: &str, properties: &[(String, String)]) -> Self {
        KafkaClients {
            brokers: brokers.to_owned(),
            properties: properties.to_vec(),
            log: ClientLog::default(),
            auth: KafkaAuth::default(),
        }
    }

    /// `--kafka-brokers`, as given.
    pub fn brokers(&self) -> &str {
        &self.brokers
    }

    /// The folding of librdkafka's lines every client made from these shares.
    pub fn log(&self) -> ClientLog {
        self.log.clone()
    }

    /// These clients, logging in as `auth` says (`--kafka-auth`).
    pub fn with_auth(mut self, auth: KafkaAuth) -> Self {
        self.auth = auth;
        self
    }

    /// How the clients log in.
    pub fn auth(&self) -> &KafkaAuth {
        &self.auth
    }

    /// A client's context: librdkafka's lines and errors folded (with every other client's
    /// of these), and the OAUTHBEARER token it asks for minted.
    pub fn context(&self) -> ClientCallbacks {
        ClientCallbacks {
            log: self.log(),
            auth: self.auth.clone(),
        }
    }

    /// A client's settings: the brokers, then `defaults`, then what `--kafka-auth` needs,
    /// then the `-X` properties, which override them; a client's own settings are set after.
    pub fn config(&self, defaults: &[(&str, &str)]) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.brokers);
        for (key, value) in defaults {
            config.set(*key, *value);
        }
        self.auth.configure(&mut config);
        for (key, value) in &self.properties {
            config.set(key, value);
        }
        config
    }

    /// A client librdkafka would not create, said without showing a secret value.
    pub fn refused(&self, error: KafkaError) -> SinkError {
        SinkError::create(error, &self.properties)
    }
}

/// What librdkafka calls back on the relay's Kafka clients but the producer (which has its
/// own context): its log lines and errors, folded by [`ClientLog`], and its asks for an
/// OAUTHBEARER token, which `--kafka-auth` answers.
pub struct ClientCallbacks {
    log: ClientLog,
    auth: KafkaAuth,
}

impl ClientCallbacks {
    /// What a broker said when it last refused the client's MSK IAM token, if one did.
    pub fn refusal(&self) -> Option<String> {
        self.auth.refusal()
    }
}

impl ClientContext for ClientCallbacks {
    const ENABLE_REFRESH_OAUTH_TOKEN: bool = true;

    fn log(&self, level: RDKafkaLogLevel, facility: &str, line: &str) {
        self.log.log(level, facility, line);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.log.error(&error, reason);
        self.auth.observe(&error, reason);
    }

    fn generate_oauth_token(&self, _config: Option<&str>) -> Result<OAuthToken, Box<dyn Error>> {
        self.auth.oauth_token(SystemTime::now())
    }
}

impl ConsumerContext for ClientCallbacks {}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::cloud::aws::tests::started;
    use crate::sink::KafkaSink;
    use crate::sink::exactly_once::TailReader;

    /// No broker speaks SASL/OAUTHBEARER here (tests/cloud.rs has one), so this shows
    /// librdkafka's side alone: the clients ask their context for a token, and ask again
    /// before it expires.
    #[tokio::test(flavor = "current_thread")]
    async fn clients_ask_for_the_msk_token_and_again_before_it_expires() {
        let aws = started(Duration::from_secs(6), u32::MAX).await.aws;
        let auth = KafkaAuth::AwsMskIam(aws.clone());
        // SASL without TLS, to a port where nothing listens: the asks need no broker.
        let properties = [("security.protocol".to_owned(), "SASL_PLAINTEXT".to_owned())];
        let kafka = KafkaClients::new("127.0.0.1:1", &properties).with_auth(auth);
        // The tail reader (the lineage reader is one) has its token as it is made, before
        // any metadata request could wait for it.
        let reader = TailReader::new(&kafka).unwrap();
        assert_eq!(aws.msk_tokens_signed(), 1);
        // The producer asks when its queue is served, then at 80% of the token's life: a
        // lifetime in the wrong unit would be refused or never renewed.
        let (sink, _deliveries) = KafkaSink::new(&kafka, 10, None, None).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while aws.msk_tokens_signed() < 3 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(aws.msk_tokens_signed() >= 3, "{}", aws.msk_tokens_signed());
        drop((reader, sink));
    }
}
