//! Every Kafka client the relay builds (the producer, the tail reader, the lineage writer, the
//! demo's consumer) starts from [`KafkaClients::config`]: the brokers, `--kafka-auth` and the
//! `-X` properties, set in one place, so that what reaches the brokers (security, TLS, SASL,
//! DNS) reaches them the same way from each; and each has a context from
//! [`KafkaClients::context`], which mints the OAUTHBEARER token librdkafka asks for.

use rdkafka::ClientConfig;
use rdkafka::error::KafkaError;

use super::SinkError;
use crate::cloud::KafkaAuth;
use crate::cloud::kafka::AuthContext;

/// Where Kafka is, how clients log in, and the `-X` properties every client takes.
#[derive(Clone, Debug, Default)]
pub struct KafkaClients {
    brokers: String,
    properties: Vec<(String, String)>,
    auth: KafkaAuth,
}

impl KafkaClients {
    /// Clients of `brokers` (`--kafka-brokers`) with `properties` (`-X`, in order).
    pub fn new(brokers: &str, properties: &[(String, String)]) -> Self {
        KafkaClients {
            brokers: brokers.to_owned(),
            properties: properties.to_vec(),
            auth: KafkaAuth::default(),
        }
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

    /// A client's context: it mints the OAUTHBEARER token librdkafka asks for.
    pub fn context(&self) -> AuthContext {
        AuthContext::new(&self.auth)
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
