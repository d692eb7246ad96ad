//! I/O: the Kafka producer.
//!
//! One idempotent librdkafka producer (`acks=all`) whose delivery reports
//! become [`Delivery`] messages on a channel only the pipeline reads. A full
//! local queue is backpressure ([`Sink::send`] waits). A broker judges sizes
//! per batch, so the records of a batch refused for its size are sent again
//! one per batch ([`Sink::send_alone`]): only a record refused alone is poison.

pub mod exactly_once;

use std::collections::HashSet;
use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{DeliveryResult, Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseRecord, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientContext, Statistics};
use tokio::sync::mpsc;

use crate::lsn::Lsn;
use crate::observability::health::Health;
use crate::outbox::{ID_HEADER, OutboxRecord};
use exactly_once::{Position, TailError, TailReader};

/// The Kafka side as the pipeline sees it: [`KafkaSink`], or the simulation's
/// in-memory broker. Deliveries arrive on the channel made with the sink.
pub trait Sink: Send + Sync + 'static {
    /// Enqueues one record, waiting while the producer's queue is full.
    fn send(
        &self,
        ticket: Ticket,
        record: &OutboxRecord,
    ) -> impl Future<Output = Result<(), SinkError>> + Send;

    /// Enqueues one record in a batch of its own, so a size error is about it alone.
    fn send_alone(
        &self,
        ticket: Ticket,
        record: &OutboxRecord,
    ) -> impl Future<Output = Result<(), SinkError>> + Send;

    /// Records handed over whose delivery has not been reported yet.
    fn in_flight(&self) -> usize;

    /// The partition count of `topic` (exactly-once pins partitions); fetching
    /// it creates the topic where the broker auto-creates topics.
    fn partition_count(&self, topic: &str) -> impl Future<Output = Result<i32, KafkaError>> + Send;

    /// Per partition of `topic`, the positions of `source`'s records at or
    /// above `floor` (see [`exactly_once`]).
    fn tails(
        &self,
        topic: &str,
        source: &str,
        partitions: i32,
        floor: Lsn,
        wal_end: Lsn,
    ) -> impl Future<Output = Vec<Result<HashSet<Position>, TailError>>> + Send;
}

/// Producer settings the relay sets unless `-X` overrides them.
/// `message.timeout.ms=0`: wait out a broker outage rather than give up on
/// events after five minutes (the slot holds the WAL, readiness shows the stall).
const DEFAULT_PROPERTIES: &[(&str, &str)] = &[
    ("enable.idempotence", "true"),
    ("acks", "all"),
    ("partitioner", "murmur2_random"),
    ("message.timeout.ms", "0"),
    ("client.id", "outbox-relay"),
    // Broker states for /readyz; 0 disables.
    ("statistics.interval.ms", "1000"),
];

/// One in-flight event, handed out by the ack tracker in stream order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ticket(pub u64);

/// The outcome of one record.
#[derive(Debug)]
pub struct Delivery {
    /// Which event.
    pub ticket: Ticket,
    /// `Ok` once the broker acknowledged it.
    pub outcome: Result<(), DeliveryFailure>,
    /// Whether it was sent by [`Sink::send_alone`].
    pub alone: bool,
}

/// A record librdkafka gave up on, copied back (failures are rare) so it can
/// be sent again or dead-lettered.
#[derive(Debug, Clone)]
pub struct DeliveryFailure {
    /// librdkafka's verdict.
    pub error: KafkaError,
    /// The record, pinned to the partition it was meant for.
    pub record: OutboxRecord,
}

/// Whether a Kafka error condemns one record (poison: dead-letter it or stop)
/// rather than the configuration or the cluster (stop).
pub fn is_poison(error: &KafkaError) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        error.rdkafka_error_code(),
        Some(
            C::MessageSizeTooLarge
                | C::InvalidMessageSize
                | C::InvalidMessage
                | C::MessageBatchTooLarge
                | C::InvalidRecord
                | C::PolicyViolation
                | C::InvalidTopic
                | C::InvalidTimestamp
        )
    )
}

/// Whether a failed delivery may be the batch's fault rather than the
/// record's: sizes are checked per batch, and with KIP-467 the healthy records
/// of a batch holding an invalid one fail with `_INVALID_DIFFERENT_RECORD`.
pub fn is_batch_level(error: &KafkaError) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        error.rdkafka_error_code(),
        Some(C::MessageSizeTooLarge | C::MessageBatchTooLarge | C::InvalidDifferentRecord)
    )
}

/// The producer could not be built or refused a record outright.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// Bad producer configuration (an unknown `-X` property, say).
    #[error(
        "cannot create the Kafka producer: {reason}. Check --kafka-brokers and the -X properties"
    )]
    Create {
        /// librdkafka's complaint, sensitive values hidden.
        reason: String,
    },
    /// librdkafka refused to enqueue a record ([`is_poison`] tells whose fault).
    #[error("Kafka refused the record for topic {topic:?} (id {id})")]
    Enqueue {
        /// The topic the record was routed to.
        topic: String,
        /// The event's id.
        id: String,
        /// What librdkafka said.
        #[source]
        source: KafkaError,
    },
}

impl SinkError {
    /// A client that could not be created. librdkafka quotes the refused
    /// value, which may be a secret: keep the key, hide sensitive values.
    fn create(error: KafkaError, properties: &[(String, String)]) -> Self {
        let hide = |text: String, value: &str| match value {
            "" => text,
            _ => text.replace(value, "***"),
        };
        let mut reason = match error {
            KafkaError::ClientConfig(_, description, key, value) => {
                format!("librdkafka refused -X {key}: {}", hide(description, &value))
            }
            other => other.to_string(),
        };
        for (key, value) in properties {
            if crate::config::is_sensitive_property(key) {
                reason = hide(reason, value);
            }
        }
        SinkError::Create { reason }
    }
}

struct DeliveryContext {
    deliveries: mpsc::UnboundedSender<Delivery>,
    alone: bool,
    /// `None` where the producer's state is not readiness (`send_alone`, `backfill`).
    health: Option<Arc<Health>>,
}

impl ClientContext for DeliveryContext {
    fn error(&self, error: KafkaError, reason: &str) {
        // librdkafka retries these; deliveries that finally fail are reported.
        tracing::warn!(target: "librdkafka", error = %error, "Kafka client error: {reason}");
        if let Some(health) = &self.health
            && error.rdkafka_error_code() == Some(RDKafkaErrorCode::AllBrokersDown)
        {
            health.set_producer_connected(false);
        }
    }

    fn stats(&self, statistics: Statistics) {
        if let Some(health) = &self.health {
            health.producer_stats(&statistics);
        }
    }
}

impl ProducerContext for DeliveryContext {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, opaque: usize) {
        let outcome = result.as_ref().map(|_| ()).map_err(|(error, msg)| {
            let mut record = OutboxRecord {
                topic: msg.topic().to_owned(),
                key: msg.key().map(Bytes::copy_from_slice),
                payload: msg.payload().map(Bytes::copy_from_slice),
                id: Bytes::new(),
                headers: Vec::new(),
                headers_before_id: 0,
                timestamp_ms: msg.timestamp().to_millis().unwrap_or_default(),
                partition: (msg.partition() >= 0).then_some(msg.partition()),
            };
            for h in msg.headers().into_iter().flat_map(|h| h.iter()) {
                let value = h.value.map(Bytes::copy_from_slice);
                match h.key {
                    ID_HEADER if record.id.is_empty() => {
                        record.id = value.unwrap_or_default();
                        record.headers_before_id = record.headers.len();
                    }
                    key => record.headers.push((Arc::from(key), value)),
                }
            }
            DeliveryFailure {
                error: error.clone(),
                record,
            }
        });
        // The receiver is gone only when the relay is shutting down.
        let _ = self.deliveries.send(Delivery {
            ticket: Ticket(opaque as u64),
            outcome,
            alone: self.alone,
        });
    }
}

/// The Kafka side of the relay.
pub struct KafkaSink {
    /// Shared with blocking-pool metadata reads.
    producer: Arc<ThreadedProducer<DeliveryContext>>,
    tails: Option<Arc<Mutex<TailReader>>>,
    /// For the one-record-batch producer, made on first use.
    config: ClientConfig,
    properties: Vec<(String, String)>,
    deliveries: mpsc::UnboundedSender<Delivery>,
    alone: OnceLock<ThreadedProducer<DeliveryContext>>,
}

impl KafkaSink {
    /// Builds the producer; delivery reports arrive on the returned channel.
    /// `tails` reads partitions back under `--delivery exactly-once`.
    pub fn new(
        brokers: &str,
        properties: &[(String, String)],
        max_in_flight_events: usize,
        health: Option<Arc<Health>>,
        tails: Option<TailReader>,
    ) -> Result<(Self, mpsc::UnboundedReceiver<Delivery>), SinkError> {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", brokers);
        for (k, v) in DEFAULT_PROPERTIES {
            config.set(*k, *v);
        }
        // The relay's cap bounds memory; librdkafka's queue must hold at
        // least that much or every send would hit QueueFull.
        let queue = (max_in_flight_events.saturating_mul(2)).max(100_000);
        config.set("queue.buffering.max.messages", queue.to_string());
        for (k, v) in properties {
            config.set(k, v);
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let context = DeliveryContext {
            deliveries: tx.clone(),
            alone: false,
            health,
        };
        let producer = config
            .create_with_context(context)
            .map_err(|error| SinkError::create(error, properties))?;
        let sink = KafkaSink {
            producer: Arc::new(producer),
            tails: tails.map(|reader| Arc::new(Mutex::new(reader))),
            config,
            properties: properties.to_vec(),
            deliveries: tx,
            alone: OnceLock::new(),
        };
        Ok((sink, rx))
    }

    async fn send_with(
        producer: &ThreadedProducer<DeliveryContext>,
        ticket: Ticket,
        record: &OutboxRecord,
    ) -> Result<(), SinkError> {
        let at = record.headers_before_id.min(record.headers.len());
        let (before, after) = record.headers.split_at(at);
        fn named((name, value): &(Arc<str>, Option<Bytes>)) -> (&str, Option<&[u8]>) {
            (name, value.as_deref())
        }
        let id = std::iter::once((ID_HEADER, Some(record.id.as_ref())));
        let mut headers = OwnedHeaders::new_with_capacity(1 + record.headers.len());
        for (key, value) in before
            .iter()
            .map(named)
            .chain(id)
            .chain(after.iter().map(named))
        {
            headers = headers.insert(Header { key, value });
        }
        let mut base: BaseRecord<'_, [u8], [u8], usize> =
            BaseRecord::with_opaque_to(&record.topic, ticket.0 as usize)
                .timestamp(record.timestamp_ms)
                .headers(headers);
        base.key = record.key.as_deref();
        base.payload = record.payload.as_deref();
        base.partition = record.partition;
        let mut waited = Duration::ZERO;
        loop {
            match producer.send(base) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), refused)) => {
                    if waited.as_secs() > 0 && waited.as_millis() % 10_000 < 5 {
                        tracing::warn!(
                            waited_ms = waited.as_millis() as u64,
                            "librdkafka's local queue is full; waiting for deliveries"
                        );
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    waited += Duration::from_millis(5);
                    base = refused;
                }
                Err((source, _)) => {
                    return Err(SinkError::Enqueue {
                        topic: record.topic.clone(),
                        id: record.id_text(),
                        source,
                    });
                }
            }
        }
    }
}

impl Sink for KafkaSink {
    async fn send(&self, ticket: Ticket, record: &OutboxRecord) -> Result<(), SinkError> {
        Self::send_with(&self.producer, ticket, record).await
    }

    async fn send_alone(&self, ticket: Ticket, record: &OutboxRecord) -> Result<(), SinkError> {
        let producer = match self.alone.get() {
            Some(producer) => producer,
            None => {
                let mut config = self.config.clone();
                config
                    .set("batch.num.messages", "1")
                    .set("linger.ms", "0")
                    .set("statistics.interval.ms", "0");
                let context = DeliveryContext {
                    deliveries: self.deliveries.clone(),
                    alone: true,
                    health: None,
                };
                let producer = config
                    .create_with_context(context)
                    .map_err(|error| SinkError::create(error, &self.properties))?;
                self.alone.get_or_init(|| producer)
            }
        };
        Self::send_with(producer, ticket, record).await
    }

    fn in_flight(&self) -> usize {
        let count =
            self.producer.in_flight_count() + self.alone.get().map_or(0, |p| p.in_flight_count());
        usize::try_from(count).unwrap_or(0)
    }

    async fn partition_count(&self, topic: &str) -> Result<i32, KafkaError> {
        let (producer, topic) = (Arc::clone(&self.producer), topic.to_owned());
        let fetch = tokio::task::spawn_blocking(move || {
            let timeout = Duration::from_secs(30);
            let metadata = producer.client().fetch_metadata(Some(&topic), timeout)?;
            let count = metadata
                .topics()
                .first()
                .filter(|t| t.error().is_none())
                .map_or(0, |t| t.partitions().len());
            match i32::try_from(count) {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(KafkaError::MetadataFetch(
                    RDKafkaErrorCode::UnknownTopicOrPartition,
                )),
            }
        });
        fetch
            .await
            .unwrap_or(Err(KafkaError::MetadataFetch(RDKafkaErrorCode::Fail)))
    }

    async fn tails(
        &self,
        topic: &str,
        source: &str,
        partitions: i32,
        floor: Lsn,
        wal_end: Lsn,
    ) -> Vec<Result<HashSet<Position>, TailError>> {
        let failed = |reason: String| {
            (0..partitions)
                .map(|partition| Err(TailError::read(topic, partition, &reason)))
                .collect()
        };
        let Some(reader) = self.tails.clone() else {
            return failed("no tail reader (not --delivery exactly-once)".to_owned());
        };
        let (owned, source) = (topic.to_owned(), source.to_owned());
        let read = tokio::task::spawn_blocking(move || {
            let reader = reader.lock().unwrap_or_else(PoisonError::into_inner);
            reader.delivered(&owned, &source, partitions, floor, wal_end)
        });
        read.await
            .unwrap_or_else(|e| failed(format!("the blocking read stopped: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[tokio::test]
    async fn kafka_tls_and_sasl_are_available_through_properties() {
        for mechanism in ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] {
            let result = KafkaSink::new(
                "127.0.0.1:1",
                &props(&[
                    ("security.protocol", "SASL_SSL"),
                    ("sasl.mechanism", mechanism),
                    ("sasl.username", "relay"),
                    ("sasl.password", "secret"),
                ]),
                10,
                None,
                None,
            );
            assert!(result.is_ok(), "{mechanism}: {:?}", result.err());
        }
        assert!(
            KafkaSink::new(
                "127.0.0.1:1",
                &props(&[("security.protocol", "SSL")]),
                10,
                None,
                None
            )
            .is_ok()
        );
    }

    #[tokio::test]
    async fn unknown_properties_are_a_clear_error() {
        let err = KafkaSink::new(
            "127.0.0.1:1",
            &props(&[("no.such.property", "1")]),
            10,
            None,
            None,
        )
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
        assert!(err.contains("-X"), "{err}");
    }

    #[tokio::test]
    async fn refused_properties_show_the_key_never_the_value() {
        for (key, value) in [
            ("sasl.pasword", "hunter2"),
            (
                "sasl.jaas.config",
                "PlainLoginModule required password=\"hunter2\"",
            ),
            ("acks", "hunter2"),
            ("security.protocol", "hunter2"),
        ] {
            let err = KafkaSink::new("127.0.0.1:1", &props(&[(key, value)]), 10, None, None)
                .err()
                .map(|e| format!("{e} {e:?}"))
                .unwrap_or_default();
            assert!(err.contains(key), "{key}: {err}");
            assert!(!err.contains("hunter2"), "{err}");
        }
    }

    #[test]
    fn size_errors_from_the_broker_are_batch_level() {
        for code in [
            RDKafkaErrorCode::MessageSizeTooLarge,
            RDKafkaErrorCode::MessageBatchTooLarge,
            RDKafkaErrorCode::InvalidDifferentRecord,
        ] {
            assert!(is_batch_level(&KafkaError::MessageProduction(code)));
        }
        assert!(!is_batch_level(&KafkaError::MessageProduction(
            RDKafkaErrorCode::InvalidRecord
        )));
    }

    #[test]
    fn poison_errors_are_record_level_ones() {
        assert!(is_poison(&KafkaError::MessageProduction(
            RDKafkaErrorCode::MessageSizeTooLarge
        )));
        assert!(is_poison(&KafkaError::MessageProduction(
            RDKafkaErrorCode::InvalidRecord
        )));
        assert!(!is_poison(&KafkaError::MessageProduction(
            RDKafkaErrorCode::MessageTimedOut
        )));
        assert!(!is_poison(&KafkaError::MessageProduction(
            RDKafkaErrorCode::TopicAuthorizationFailed
        )));
    }
}
