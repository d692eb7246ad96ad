//! I/O: the Kafka producer.
//!
//! One librdkafka producer, idempotent with `acks=all`, so a record that the
//! broker acknowledged is durable and retries inside librdkafka never
//! duplicate or reorder within a partition. Records are enqueued in commit
//! order; librdkafka's own thread polls for delivery reports, which the
//! context turns into [`Delivery`] messages on a channel. The pipeline alone
//! reads that channel and decides what may be acknowledged to Postgres.
//!
//! A full local queue is backpressure: [`KafkaSink::send`] waits and retries.
//! Anything else librdkafka refuses at enqueue time (a record over
//! `message.max.bytes`, an invalid topic name) is a [`SinkError`], and so is
//! every failed delivery report: librdkafka has already retried whatever was
//! retriable until `message.timeout.ms`.
//!
//! A broker judges a produce request's size per batch, so a size error in a
//! delivery report does not say which record is too large: each record of the
//! failed batch is sent again in a batch of its own ([`Sink::send_alone`],
//! through a second producer made on first use), and only a record refused
//! alone is poison.

use std::collections::HashSet;
use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use bytes::Bytes;

pub mod exactly_once;

use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{DeliveryResult, Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseRecord, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientContext, Statistics};
use tokio::sync::mpsc;

use crate::lsn::Lsn;
use crate::observability::health::Health;
use crate::outbox::{ID_HEADER, OutboxRecord};
use exactly_once::{Position, TailError, TailReader};

/// The Kafka side as the pipeline sees it. [`KafkaSink`] is the real one; a
/// simulation implements it with an in-memory broker. Delivery results arrive
/// on the channel the pipeline is given with the sink.
pub trait Sink: Send + Sync + 'static {
    /// Enqueues one record; its [`Delivery`] comes back on the channel.
    /// Waits while the producer's queue is full (backpressure, not an error).
    fn send(
        &self,
        ticket: Ticket,
        record: &OutboxRecord,
    ) -> impl Future<Output = Result<(), SinkError>> + Send;

    /// Enqueues one record in a batch of its own, so that a size error
    /// reported for it is about it alone.
    fn send_alone(
        &self,
        ticket: Ticket,
        record: &OutboxRecord,
    ) -> impl Future<Output = Result<(), SinkError>> + Send;

    /// Records handed over whose delivery has not been reported yet.
    fn in_flight(&self) -> usize;

    /// The partition count of `topic` (exactly-once pins partitions).
    fn partition_count(&self, topic: &str) -> impl Future<Output = Result<i32, KafkaError>> + Send;

    /// Per partition of `topic`, the positions of the records of `source`
    /// at or above `floor` (exactly-once; see [`exactly_once`]).
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
///
/// `message.timeout.ms=0` (no limit): an outbox relay should wait out a
/// broker outage rather than give up on events after librdkafka's default
/// five minutes; the slot holds the WAL meanwhile, and readiness/alerts show
/// the stall. Set `-X message.timeout.ms=...` to fail instead.
pub const DEFAULT_PROPERTIES: &[(&str, &str)] = &[
    ("enable.idempotence", "true"),
    ("acks", "all"),
    ("partitioner", "murmur2_random"),
    ("message.timeout.ms", "0"),
    ("client.id", "outbox-relay"),
    // Broker states for /readyz (observability::health); 0 disables.
    ("statistics.interval.ms", "1000"),
];

/// Identifies one in-flight event: handed to the producer, returned with its
/// delivery report. The pipeline's ack tracker hands them out in stream order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ticket(pub u64);

/// The outcome of one record, reported by librdkafka.
#[derive(Debug)]
pub struct Delivery {
    /// Which event.
    pub ticket: Ticket,
    /// `Ok` once the broker acknowledged it.
    pub outcome: Result<Acked, DeliveryFailure>,
    /// Whether the record was sent in a batch of its own ([`Sink::send_alone`]).
    pub alone: bool,
}

/// Where an acknowledged record landed.
#[derive(Debug, Clone, Copy)]
pub struct Acked {
    /// Partition.
    pub partition: i32,
    /// Offset in that partition.
    pub offset: i64,
}

/// A record librdkafka gave up on, with its contents (copied: failures are rare)
/// so it can be dead-lettered.
#[derive(Debug, Clone)]
pub struct DeliveryFailure {
    /// Why.
    pub error: KafkaError,
    /// The record's topic.
    pub topic: String,
    /// The record's `id` header.
    pub id: String,
    /// The record's key.
    pub key: Option<Bytes>,
    /// The record's value.
    pub payload: Option<Bytes>,
    /// The record's headers other than `id`.
    pub headers: Vec<(Arc<str>, Option<Bytes>)>,
    /// The record's timestamp.
    pub timestamp_ms: Option<i64>,
    /// The partition it was meant for (negative when none was chosen).
    pub partition: i32,
}

impl DeliveryFailure {
    /// The record again, to send it once more (to the same partition).
    pub fn to_record(&self) -> OutboxRecord {
        OutboxRecord {
            topic: self.topic.clone(),
            key: self.key.clone(),
            payload: self.payload.clone(),
            id: Bytes::from(self.id.clone()),
            headers: self.headers.clone(),
            timestamp_ms: self.timestamp_ms.unwrap_or_default(),
            partition: (self.partition >= 0).then_some(self.partition),
        }
    }
}

/// Whether a Kafka error condemns one record (poison: dead-letter it or stop)
/// rather than the relay's configuration or the cluster (stop).
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

/// Whether a failed delivery may be the fault of the batch the record was in
/// rather than of the record: the broker checks sizes per batch
/// (`MSG_SIZE_TOO_LARGE`, `RECORD_LIST_TOO_LARGE`), and with KIP-467 the
/// healthy records of a batch holding an invalid one fail with
/// `_INVALID_DIFFERENT_RECORD`. Such a record is sent again alone.
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
        /// librdkafka's complaint without any property value (see [`SinkError::create`]).
        reason: String,
    },
    /// librdkafka refused to enqueue a record.
    #[error("Kafka refused the record for topic {topic:?} (id {id}): {source}")]
    Enqueue {
        /// Whether the refusal is about this record alone (see [`is_poison`]).
        poison: bool,
        /// The record's topic.
        topic: String,
        /// The event id.
        id: String,
        /// librdkafka's error.
        #[source]
        source: KafkaError,
    },
}

impl SinkError {
    /// A client that could not be created. librdkafka's error quotes the
    /// refused value, which may be a secret (`-X sasl.pasword=...`): keep the
    /// key and the reason, and hide every sensitive value.
    pub fn create(error: KafkaError, properties: &[(String, String)]) -> Self {
        let hide = |mut text: String, value: &str| {
            if !value.is_empty() {
                text = text.replace(value, "***");
            }
            text
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
    /// Where broker states go; `None` for a producer whose state is not the
    /// relay's readiness (the one-record-batch producer, `backfill`).
    health: Option<Arc<Health>>,
}

impl ClientContext for DeliveryContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => {
                tracing::error!(target: "librdkafka", facility = fac, "{log_message}")
            }
            RDKafkaLogLevel::Warning => {
                tracing::warn!(target: "librdkafka", facility = fac, "{log_message}")
            }
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
                tracing::info!(target: "librdkafka", facility = fac, "{log_message}")
            }
            RDKafkaLogLevel::Debug => {
                tracing::debug!(target: "librdkafka", facility = fac, "{log_message}")
            }
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        // Broker connection errors are retried by librdkafka; deliveries that
        // finally fail arrive as delivery reports, so this is informational.
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
        let ticket = Ticket(opaque as u64);
        let outcome = match result {
            Ok(msg) => Ok(Acked {
                partition: msg.partition(),
                offset: msg.offset(),
            }),
            Err((error, msg)) => {
                let mut id = String::new();
                let mut headers = Vec::new();
                if let Some(h) = msg.headers() {
                    for h in h.iter() {
                        if h.key == ID_HEADER {
                            id = h
                                .value
                                .map(String::from_utf8_lossy)
                                .unwrap_or_default()
                                .into_owned();
                        } else {
                            headers.push((Arc::from(h.key), h.value.map(Bytes::copy_from_slice)));
                        }
                    }
                }
                Err(DeliveryFailure {
                    error: error.clone(),
                    topic: msg.topic().to_owned(),
                    id,
                    key: msg.key().map(Bytes::copy_from_slice),
                    payload: msg.payload().map(Bytes::copy_from_slice),
                    headers,
                    timestamp_ms: msg.timestamp().to_millis(),
                    partition: msg.partition(),
                })
            }
        };
        // The receiver is gone only when the relay is shutting down.
        let _ = self.deliveries.send(Delivery {
            ticket,
            outcome,
            alone: self.alone,
        });
    }
}

/// The Kafka side of the relay.
pub struct KafkaSink {
    /// Shared with blocking-pool metadata reads: the relay's runtime has one thread.
    producer: Arc<ThreadedProducer<DeliveryContext>>,
    /// Exactly-once's tail reader (set by [`KafkaSink::with_tails`]).
    tails: Option<Arc<Mutex<TailReader>>>,
    /// Settings and report channel for the one-record-batch producer.
    config: ClientConfig,
    properties: Vec<(String, String)>,
    deliveries: mpsc::UnboundedSender<Delivery>,
    alone: OnceLock<ThreadedProducer<DeliveryContext>>,
}

impl KafkaSink {
    /// Builds the producer. Delivery reports arrive on the returned channel;
    /// broker states go to `health`.
    pub fn new(
        brokers: &str,
        properties: &[(String, String)],
        max_in_flight_events: usize,
        health: Option<Arc<Health>>,
    ) -> Result<(Self, mpsc::UnboundedReceiver<Delivery>), SinkError> {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", brokers);
        for (k, v) in DEFAULT_PROPERTIES {
            config.set(*k, *v);
        }
        // The relay's own cap is what bounds memory; librdkafka's queue must
        // hold at least that much or every send would hit QueueFull.
        let queue = (max_in_flight_events.saturating_mul(2)).max(100_000);
        config.set("queue.buffering.max.messages", queue.to_string());
        for (k, v) in properties {
            config.set(k, v);
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let producer = config
            .create_with_context(DeliveryContext {
                deliveries: tx.clone(),
                alone: false,
                health,
            })
            .map_err(|error| SinkError::create(error, properties))?;
        let sink = KafkaSink {
            producer: Arc::new(producer),
            tails: None,
            config,
            properties: properties.to_vec(),
            deliveries: tx,
            alone: OnceLock::new(),
        };
        Ok((sink, rx))
    }

    /// Reads partition tails with `reader` (`--delivery exactly-once`).
    pub fn with_tails(mut self, reader: TailReader) -> Self {
        self.tails = Some(Arc::new(Mutex::new(reader)));
        self
    }

    async fn send_with(
        producer: &ThreadedProducer<DeliveryContext>,
        ticket: Ticket,
        record: &OutboxRecord,
    ) -> Result<(), SinkError> {
        let mut waited = Duration::ZERO;
        loop {
            let mut headers =
                OwnedHeaders::new_with_capacity(1 + record.headers.len()).insert(Header {
                    key: ID_HEADER,
                    value: Some(record.id.as_ref()),
                });
            for (name, value) in &record.headers {
                headers = headers.insert(Header {
                    key: name,
                    value: value.as_deref(),
                });
            }
            let mut base: BaseRecord<'_, [u8], [u8], usize> =
                BaseRecord::with_opaque_to(&record.topic, ticket.0 as usize)
                    .timestamp(record.timestamp_ms)
                    .headers(headers);
            if let Some(key) = &record.key {
                base = base.key(key.as_ref());
            }
            if let Some(partition) = record.partition {
                base = base.partition(partition);
            }
            if let Some(payload) = &record.payload {
                base = base.payload(payload.as_ref());
            }
            match producer.send(base) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                    if waited.as_secs() > 0 && waited.as_millis() % 10_000 < 5 {
                        tracing::warn!(
                            waited_ms = waited.as_millis() as u64,
                            "librdkafka's local queue is full; waiting for deliveries"
                        );
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    waited += Duration::from_millis(5);
                }
                Err((source, _)) => {
                    return Err(SinkError::Enqueue {
                        poison: is_poison(&source),
                        topic: record.topic.clone(),
                        id: record.id_text(),
                        source,
                    });
                }
            }
        }
    }

    /// The partition count of `topic` (fetching metadata creates it where the
    /// broker auto-creates topics). Blocking.
    fn fetch_partition_count(
        producer: &ThreadedProducer<DeliveryContext>,
        topic: &str,
    ) -> Result<i32, KafkaError> {
        let metadata = producer
            .client()
            .fetch_metadata(Some(topic), Duration::from_secs(30))?;
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
    }

    /// [`Sink::partition_count`], blocking (for the `backfill` command).
    pub fn partition_count(&self, topic: &str) -> Result<i32, KafkaError> {
        Self::fetch_partition_count(&self.producer, topic)
    }

    /// Waits up to `timeout` for outstanding deliveries.
    pub fn flush(&self, timeout: Duration) -> bool {
        let alone = self.alone.get().is_none_or(|p| p.flush(timeout).is_ok());
        self.producer.flush(timeout).is_ok() && alone
    }
}

impl Sink for KafkaSink {
    async fn send(&self, ticket: Ticket, record: &OutboxRecord) -> Result<(), SinkError> {
        Self::send_with(&self.producer, ticket, record).await
    }

    /// Through a second producer, made on first use.
    async fn send_alone(&self, ticket: Ticket, record: &OutboxRecord) -> Result<(), SinkError> {
        let producer = match self.alone.get() {
            Some(producer) => producer,
            None => {
                let mut config = self.config.clone();
                config
                    .set("batch.num.messages", "1")
                    .set("linger.ms", "0")
                    .set("statistics.interval.ms", "0");
                let producer = config
                    .create_with_context(DeliveryContext {
                        deliveries: self.deliveries.clone(),
                        alone: true,
                        health: None,
                    })
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
        tokio::task::spawn_blocking(move || Self::fetch_partition_count(&producer, &topic))
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
                .map(|partition| {
                    Err(TailError::Read {
                        topic: topic.to_owned(),
                        partition,
                        reason: reason.clone(),
                    })
                })
                .collect()
        };
        let Some(reader) = self.tails.clone() else {
            return failed("no tail reader (not --delivery exactly-once)".to_owned());
        };
        let (owned, source) = (topic.to_owned(), source.to_owned());
        let read = tokio::task::spawn_blocking(move || {
            let mut reader = reader.lock().unwrap_or_else(PoisonError::into_inner);
            reader.set_source(source);
            reader.delivered(&owned, partitions, floor, wal_end)
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
            );
            assert!(result.is_ok(), "{mechanism}: {:?}", result.err());
        }
        assert!(
            KafkaSink::new(
                "127.0.0.1:1",
                &props(&[("security.protocol", "SSL")]),
                10,
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
            let err = KafkaSink::new("127.0.0.1:1", &props(&[(key, value)]), 10, None)
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
