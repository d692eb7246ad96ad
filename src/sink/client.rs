//! Every Kafka client the relay builds (the producer, the tail reader, the lineage writer, the
//! demo's consumer) starts from [`KafkaClients::config`]: the brokers and the `-X` properties,
//! set in one place, so that what reaches the brokers (security, TLS, SASL, DNS) reaches them
//! the same way from each.

use rdkafka::ClientConfig;
use rdkafka::error::KafkaError;

use super::SinkError;

/// Where Kafka is and the `-X` properties every client takes.
#[derive(Clone, Debug, Default)]
pub struct KafkaClients {
    brokers: String,
    properties: Vec<(String, String)>,
}

impl KafkaClients {
    /// Clients of `brokers` (`--kafka-brokers`) with `properties` (`-X`, in order).
    pub fn new(brokers: &str, properties: &[(String, String)]) -> Self {
        KafkaClients {
            brokers: brokers.to_owned(),
            properties: properties.to_vec(),
        }
    }

    /// A client's settings: the brokers, then `defaults`, then the `-X` properties, which
    /// override them; a client's own settings are set after.
    pub fn config(&self, defaults: &[(&str, &str)]) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.brokers);
        for (key, value) in defaults {
            config.set(*key, *value);
        }
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
