//! I/O: the Kafka producer.
//!
//! One idempotent librdkafka producer (`acks=all`) whose delivery reports
//! become [`Delivery`] messages on a channel only the pipeline reads, polled on
//! the pipeline's own thread ([`reports`]). A full
//! local queue is backpressure ([`Sink::send`] waits). A broker judges sizes
//! per batch, so the records of a batch refused for its size are sent again
//! one per batch ([`Sink::send_alone`]): only a record refused alone is poison.

pub mod cause;
mod client;
pub mod client_log;
pub mod exactly_once;
pub mod lineage;
pub mod registry;
mod reports;

use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use heck::ToSnakeCase;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{DeliveryResult, Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer, ProducerContext};
use rdkafka::{ClientContext, Statistics};
use tokio::sync::mpsc;

use crate::cloud::KafkaAuth;
use crate::observability::health::Health;
use crate::outbox::{ID_HEADER, OutboxRecord};
pub use client::{ClientCallbacks, KafkaClients};
use client_log::ClientLog;
use exactly_once::TailReader;
use reports::Served;

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
}

/// A record librdkafka gave up on, copied back (failures are rare) so it can
/// be sent again or dead-lettered.
#[derive(Debug)]
pub struct DeliveryFailure {
    /// Why, classified.
    pub refusal: Refusal,
    /// The record, pinned to the partition it was meant for.
    pub record: OutboxRecord,
}

/// Whose fault a refusal is: what the pipeline does next follows from it alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Blame {
    /// The broker judged the record's batch (sizes are checked per batch; with KIP-467 the
    /// healthy records of a batch holding an invalid one fail too): send it again alone.
    Batch,
    /// The record itself can never be delivered (poison); `too_large`: its size is the reason.
    Record {
        /// A size limit refused it, so dead-lettering it must leave its payload out.
        too_large: bool,
    },
    /// Not the record's fault (the configuration, the cluster): stop.
    Fatal,
}

/// A record Kafka did not take, classified once by the sink; librdkafka's error is the source.
#[derive(Debug, thiserror::Error)]
#[error("{}", match .blame {
    Blame::Batch => "refused with its batch",
    Blame::Record { too_large: true } => "the record is too large",
    Blame::Record { too_large: false } => "the record cannot be delivered",
    Blame::Fatal => "not the record's fault",
})]
pub struct Refusal {
    /// What to do about it.
    pub blame: Blame,
    /// librdkafka's error code in snake case (`message_timed_out`), or `other`: the
    /// bounded `kind` label of the delivery errors metric.
    pub code: String,
    /// What Kafka said.
    #[source]
    pub source: Box<dyn std::error::Error + Send + Sync>,
}

impl Refusal {
    /// Classifies librdkafka's `error` about a record sent in a shared batch or `alone`.
    fn new(error: KafkaError, alone: bool) -> Self {
        use RDKafkaErrorCode as C;
        let code = error.rdkafka_error_code();
        let blame =
            match code {
                Some(
                    C::MessageSizeTooLarge | C::MessageBatchTooLarge | C::InvalidDifferentRecord,
                ) if !alone => Blame::Batch,
                Some(C::MessageSizeTooLarge | C::InvalidMessageSize | C::MessageBatchTooLarge) => {
                    Blame::Record { too_large: true }
                }
                Some(
                    C::InvalidMessage
                    | C::InvalidRecord
                    | C::PolicyViolation
                    | C::InvalidTopic
                    | C::InvalidTimestamp,
                ) => Blame::Record { too_large: false },
                _ => Blame::Fatal,
            };
        Refusal {
            blame,
            code: code.map_or("other".to_owned(), |c| format!("{c:?}").to_snake_case()),
            source: Box::new(error),
        }
    }
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
    /// librdkafka refused to enqueue a record.
    #[error("Kafka refused the record for topic {topic:?} (id {id})")]
    Enqueue {
        /// The topic the record was routed to.
        topic: String,
        /// The event's id.
        id: String,
        /// Why, classified.
        #[source]
        source: Refusal,
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
    /// Mints the OAUTHBEARER token librdkafka asks for (`--kafka-auth`).
    auth: KafkaAuth,
    log: ClientLog,
}

impl ClientContext for DeliveryContext {
    const ENABLE_REFRESH_OAUTH_TOKEN: bool = true;

    fn generate_oauth_token(
        &self,
        _config: Option<&str>,
    ) -> Result<rdkafka::client::OAuthToken, Box<dyn std::error::Error>> {
        self.auth.oauth_token(std::time::SystemTime::now())
    }

    fn log(&self, level: RDKafkaLogLevel, facility: &str, line: &str) {
        self.log.log(level, facility, line);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        // librdkafka retries these; deliveries that finally fail are reported.
        self.log.error(&error, reason);
        self.auth.observe(&error, reason);
        if let Some(health) = &self.health
            && error.rdkafka_error_code() == Some(RDKafkaErrorCode::AllBrokersDown)
        {
            health.set_producer_connected(false);
        }
    }

    fn stats(&self, statistics: Statistics) {
        if let Some(health) = &self.health {
            health.set_producer_connected(statistics.brokers.values().any(|b| b.state == "UP"));
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
                id_header_at: None,
                timestamp_ms: msg.timestamp().to_millis().unwrap_or_default(),
                partition: (msg.partition() >= 0).then_some(msg.partition()),
                schemas: None,
            };
            for h in msg.headers().into_iter().flat_map(|h| h.iter()) {
                let value = h.value.map(Bytes::copy_from_slice);
                match h.key {
                    ID_HEADER if record.id.is_empty() => {
                        record.id = value.unwrap_or_default();
                        record.id_header_at = Some(record.headers.len());
                    }
                    key => record.headers.push((Arc::from(key), value)),
                }
            }
            DeliveryFailure {
                refusal: Refusal::new(error.clone(), self.alone),
                record,
            }
        });
        // The receiver is gone only when the relay is shutting down.
        let _ = self.deliveries.send(Delivery {
            ticket: Ticket(opaque as u64),
            outcome,
        });
    }
}

/// The Kafka side of the relay.
pub struct KafkaSink {
    /// Shared with blocking-pool metadata reads.
    producer: Arc<Served<DeliveryContext>>,
    tails: Option<Arc<Mutex<TailReader>>>,
    /// For the one-record-batch producer, made on first use.
    config: ClientConfig,
    kafka: KafkaClients,
    deliveries: mpsc::UnboundedSender<Delivery>,
    alone: OnceLock<Arc<Served<DeliveryContext>>>,
}

impl KafkaSink {
    /// Builds the producer; delivery reports arrive on the returned channel.
    /// `tails` reads partitions back under `--delivery exactly-once`.
    pub fn new(
        kafka: &KafkaClients,
        max_in_flight_events: usize,
        health: Option<Arc<Health>>,
        tails: Option<TailReader>,
    ) -> Result<(Self, mpsc::UnboundedReceiver<Delivery>), SinkError> {
        // The relay's cap bounds memory; librdkafka's queue must hold at
        // least that much or every send would hit QueueFull.
        let queue = (max_in_flight_events.saturating_mul(2)).max(100_000);
        let queue = queue.to_string();
        let mut defaults = DEFAULT_PROPERTIES.to_vec();
        defaults.push(("queue.buffering.max.messages", &queue));
        let config = kafka.config(&defaults);
        let (tx, rx) = mpsc::unbounded_channel();
        let context = DeliveryContext {
            deliveries: tx.clone(),
            alone: false,
            health,
            auth: kafka.auth().clone(),
            log: kafka.log(),
        };
        let producer: BaseProducer<_> = config
            .create_with_context(context)
            .map_err(|error| kafka.refused(error))?;
        let sink = KafkaSink {
            producer: reports::serve(producer),
            tails: tails.map(|reader| Arc::new(Mutex::new(reader))),
            config,
            kafka: kafka.clone(),
            deliveries: tx,
            alone: OnceLock::new(),
        };
        Ok((sink, rx))
    }

    async fn send_with(
        producer: &BaseProducer<DeliveryContext>,
        ticket: Ticket,
        record: &OutboxRecord,
    ) -> Result<(), SinkError> {
        // Without a place for `id`, the headers already hold it (Kafka Connect's transforms).
        let at = record.id_header_at.map(|at| at.min(record.headers.len()));
        let (before, after) = record.headers.split_at(at.unwrap_or(record.headers.len()));
        fn named((name, value): &(Arc<str>, Option<Bytes>)) -> (&str, Option<&[u8]>) {
            (name, value.as_deref())
        }
        let id = at.map(|_| (ID_HEADER, Some(record.id.as_ref())));
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
                // librdkafka checks the record alone before batching it.
                Err((error, _)) => {
                    return Err(SinkError::Enqueue {
                        topic: record.topic.clone(),
                        id: record.id_text(),
                        source: Refusal::new(error, true),
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
                    auth: self.kafka.auth().clone(),
                    log: self.kafka.log(),
                };
                let producer: BaseProducer<_> = config
                    .create_with_context(context)
                    .map_err(|error| self.kafka.refused(error))?;
                self.alone.get_or_init(|| reports::serve(producer))
            }
        };
        Self::send_with(producer, ticket, record).await
    }

    fn in_flight(&self) -> usize {
        let count =
            self.producer.in_flight_count() + self.alone.get().map_or(0, |p| p.in_flight_count());
        usize::try_from(count).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Clients of a broker nothing listens on, with `pairs` as `-X` properties.
    fn props(pairs: &[(&str, &str)]) -> KafkaClients {
        let properties: Vec<(String, String)> = (pairs.iter())
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        KafkaClients::new("127.0.0.1:1", &properties)
    }

    #[tokio::test]
    async fn kafka_tls_and_sasl_are_available_through_properties() {
        for mechanism in ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] {
            let result = KafkaSink::new(
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
        assert!(KafkaSink::new(&props(&[("security.protocol", "SSL")]), 10, None, None).is_ok());
    }

    #[tokio::test]
    async fn unknown_properties_are_a_clear_error() {
        let err = KafkaSink::new(&props(&[("no.such.property", "1")]), 10, None, None)
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
            let err = KafkaSink::new(&props(&[(key, value)]), 10, None, None)
                .err()
                .map(|e| format!("{e} {e:?}"))
                .unwrap_or_default();
            assert!(err.contains(key), "{key}: {err}");
            assert!(!err.contains("hunter2"), "{err}");
        }
    }

    /// The reports are polled by a task on the runtime: on one thread that also runs the
    /// sender, every record is reported, the alone producer's too, and a sink dropped with
    /// records in flight unhooks its queue (librdkafka would otherwise call into freed memory).
    #[tokio::test(flavor = "current_thread")]
    async fn deliveries_are_served_on_the_runtimes_thread() {
        let cluster = rdkafka::mocking::MockCluster::new(1).unwrap();
        cluster.create_topic("t", 4, 1).unwrap();
        let brokers = cluster.bootstrap_servers();
        let kafka = KafkaClients::new(&brokers, &[]);
        let (sink, mut deliveries) = KafkaSink::new(&kafka, 1_000, None, None).unwrap();
        let record = |n: u64| OutboxRecord {
            topic: "t".to_owned(),
            key: Some(Bytes::from(n.to_string())),
            payload: Some(Bytes::from_static(b"{}")),
            id: Bytes::from(format!("id-{n}")),
            headers: Vec::new(),
            id_header_at: Some(0),
            timestamp_ms: 0,
            partition: None,
            schemas: None,
        };
        for n in 0..1_000 {
            sink.send(Ticket(n), &record(n)).await.unwrap();
        }
        sink.send_alone(Ticket(1_000), &record(1_000))
            .await
            .unwrap();
        let mut acked = std::collections::BTreeSet::new();
        while acked.len() < 1_001 {
            let delivery = tokio::time::timeout(Duration::from_secs(30), deliveries.recv())
                .await
                .expect("every record is reported within 30 s")
                .expect("the channel is open while the sink lives");
            assert!(delivery.outcome.is_ok(), "{delivery:?}");
            assert!(
                acked.insert(delivery.ticket.0),
                "reported twice: {delivery:?}"
            );
        }
        assert_eq!(sink.in_flight(), 0);
        for n in 0..1_000 {
            sink.send(Ticket(2_000 + n), &record(n)).await.unwrap();
        }
        drop(sink);
        // Later reports go nowhere (the pending ones were purged by the producer's drop).
        tokio::task::yield_now().await;
    }

    #[test]
    fn refusals_are_classified_once_by_code_and_batch() {
        use RDKafkaErrorCode as C;
        let too_large = Blame::Record { too_large: true };
        let poison = Blame::Record { too_large: false };
        // (code, sent alone, blame)
        let table = [
            (C::MessageSizeTooLarge, false, Blame::Batch),
            (C::MessageBatchTooLarge, false, Blame::Batch),
            (C::InvalidDifferentRecord, false, Blame::Batch),
            (C::MessageSizeTooLarge, true, too_large),
            (C::MessageBatchTooLarge, true, too_large),
            (C::InvalidMessageSize, false, too_large),
            (C::InvalidDifferentRecord, true, Blame::Fatal),
            (C::InvalidRecord, false, poison),
            (C::InvalidMessage, true, poison),
            (C::PolicyViolation, false, poison),
            (C::InvalidTopic, false, poison),
            (C::InvalidTimestamp, true, poison),
            (C::MessageTimedOut, false, Blame::Fatal),
            (C::TopicAuthorizationFailed, true, Blame::Fatal),
        ];
        for (code, alone, blame) in table {
            let refusal = Refusal::new(KafkaError::MessageProduction(code), alone);
            assert_eq!(refusal.blame, blame, "{code:?}, alone: {alone}");
        }
    }

    #[test]
    fn refusal_codes_are_snake_case_metric_labels() {
        let code = |e| Refusal::new(e, false).code;
        let e = KafkaError::MessageProduction(RDKafkaErrorCode::MessageTimedOut);
        assert_eq!(code(e), "message_timed_out");
        let e = KafkaError::MessageProduction(RDKafkaErrorCode::TopicAuthorizationFailed);
        assert_eq!(code(e), "topic_authorization_failed");
        assert_eq!(code(KafkaError::Canceled), "other");
    }

    #[test]
    fn broker_state_comes_from_librdkafka_statistics() {
        let health = Arc::new(Health::default());
        let context = DeliveryContext {
            deliveries: mpsc::unbounded_channel().0,
            alone: false,
            health: Some(Arc::clone(&health)),
            auth: KafkaAuth::default(),
            log: ClientLog::default(),
        };
        let stats = |states: &[&str]| {
            let mut stats = Statistics::default();
            for (i, state) in states.iter().enumerate() {
                let broker = rdkafka::statistics::Broker {
                    state: (*state).to_owned(),
                    ..Default::default()
                };
                stats.brokers.insert(format!("127.0.0.1:9092/{i}"), broker);
            }
            stats
        };
        let connected = || {
            health
                .snapshot(std::time::Instant::now())
                .producer_connected
        };
        context.stats(stats(&["INIT", "UP"]));
        assert!(connected());
        context.stats(stats(&["CONNECT"]));
        assert!(!connected());
    }
}
