//! A real Kafka-protocol broker for tests: librdkafka's mock cluster, in
//! process, listening on loopback (a relay subprocess can reach it too), or a
//! broker in its own process ([`Tansu`]), plus a consumer that reads back what
//! the relay produced.

use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;
use rdkafka::{Offset, TopicPartitionList};

use super::postgres::{HeldPort, hold_port};
use super::tansu::Tansu;

/// Number of mock brokers.
const BROKERS: i32 = 3;

/// A Kafka-protocol broker: librdkafka's mock cluster, or tansu in its own process.
pub struct Broker {
    kind: Kind,
    /// The mock brokers' ports, which no Postgres cluster of the tests may take.
    _ports: Vec<HeldPort>,
}

enum Kind {
    Mock(MockCluster<'static, DefaultProducerContext>),
    Process(Tansu),
}

/// One record read back from the broker.
#[derive(Debug, Clone)]
pub struct Consumed {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub payload: Option<Vec<u8>>,
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    pub timestamp: Option<i64>,
}

impl Consumed {
    /// The value of header `name`, as text.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| v.as_ref())
            .map(|v| String::from_utf8_lossy(v).into_owned())
    }

    /// The `id` header.
    pub fn id(&self) -> String {
        self.header("id").unwrap_or_default()
    }

    /// The key as text.
    pub fn key_text(&self) -> Option<String> {
        self.key
            .as_ref()
            .map(|k| String::from_utf8_lossy(k).into_owned())
    }

    /// The value as text.
    pub fn payload_text(&self) -> Option<String> {
        self.payload
            .as_ref()
            .map(|k| String::from_utf8_lossy(k).into_owned())
    }
}

impl Broker {
    /// Starts a mock cluster of three brokers.
    pub fn start() -> Broker {
        // A port a Postgres cluster reserved but has not bound yet may be the one the kernel
        // gives a broker: then that cluster could take it while the broker is down. Such a
        // mock cluster is dropped and another made (bounded: ports are plenty).
        for _ in 0..20 {
            let cluster = MockCluster::new(BROKERS).expect("start librdkafka's mock cluster");
            let ports: Vec<HeldPort> = cluster
                .bootstrap_servers()
                .split(',')
                .filter_map(|server| server.rsplit_once(':'))
                .filter_map(|(_, port)| port.parse().ok())
                .map(hold_port)
                .collect();
            if ports.iter().all(HeldPort::is_held) && ports.len() == BROKERS as usize {
                return Broker {
                    kind: Kind::Mock(cluster),
                    _ports: ports,
                };
            }
        }
        panic!("no mock cluster on ports free of the tests' Postgres clusters in 20 tries")
    }

    /// A broker in its own process (see [`Tansu`]).
    pub fn process(tansu: Tansu) -> Broker {
        Broker {
            kind: Kind::Process(tansu),
            _ports: Vec::new(),
        }
    }

    /// `host:port,...` of the brokers (loopback).
    pub fn bootstrap(&self) -> String {
        match &self.kind {
            Kind::Mock(cluster) => cluster.bootstrap_servers(),
            Kind::Process(tansu) => tansu.bootstrap(),
        }
    }

    /// The broker process; panics on the mock cluster.
    pub fn tansu(&self) -> &Tansu {
        match &self.kind {
            Kind::Process(tansu) => tansu,
            Kind::Mock(_) => panic!("this test needs a broker in its own process"),
        }
    }

    /// The broker process, to kill or restart; panics on the mock cluster.
    pub fn tansu_mut(&mut self) -> &mut Tansu {
        match &mut self.kind {
            Kind::Process(tansu) => tansu,
            Kind::Mock(_) => panic!("this test needs a broker in its own process"),
        }
    }

    /// The mock cluster, for faults only it can inject; panics on a broker process.
    fn mock(&self) -> &MockCluster<'static, DefaultProducerContext> {
        match &self.kind {
            Kind::Mock(cluster) => cluster,
            Kind::Process(_) => panic!(
                "this fault is injected through librdkafka's mock cluster, which a broker in \
                 its own process does not have (see docs/development.md)"
            ),
        }
    }

    /// Creates a topic up front (otherwise the first produce creates it).
    pub fn create_topic(&self, topic: &str, partitions: i32) {
        match &self.kind {
            Kind::Mock(cluster) => cluster
                .create_topic(topic, partitions, 1)
                .expect("create mock topic"),
            Kind::Process(tansu) => tansu.create_topic(topic, partitions),
        }
    }

    /// Creates a topic with 4 partitions unless it exists.
    pub fn ensure_topic(&self, topic: &str) {
        match &self.kind {
            // An error means it exists already.
            Kind::Mock(cluster) => {
                let _ = cluster.create_topic(topic, 4, 1);
            }
            Kind::Process(tansu) => tansu.create_topic(topic, 4),
        }
    }

    /// Makes the next produce/fetch/... requests fail with `errors`, in order.
    pub fn request_errors(
        &self,
        api: rdkafka::types::RDKafkaApiKey,
        errors: &[rdkafka::types::RDKafkaRespErr],
    ) {
        self.mock().request_errors(api, errors);
    }

    /// Makes metadata answers for `topic` carry `error` (`NO_ERROR` clears it).
    pub fn topic_error(&self, topic: &str, error: rdkafka::types::RDKafkaRespErr) {
        self.mock()
            .topic_error(topic, error)
            .expect("set a mock topic error");
    }

    /// Delays every broker's responses by `delay` (zero: no delay).
    pub fn round_trip_time(&self, delay: Duration) {
        for id in 1..=BROKERS {
            self.mock()
                .broker_round_trip_time(id, delay)
                .expect("broker_round_trip_time");
        }
    }

    /// Takes every broker down: connections are closed and refused.
    pub fn down(&self) {
        for id in 1..=BROKERS {
            self.mock().broker_down(id).expect("broker_down");
        }
    }

    /// Brings every broker back.
    pub fn up(&self) {
        for id in 1..=BROKERS {
            self.mock().broker_up(id).expect("broker_up");
        }
    }

    /// Reads `topics` from the beginning until `expected` records arrived or
    /// `timeout` passed; returns what arrived.
    pub fn consume(&self, topics: &[&str], expected: usize, timeout: Duration) -> Vec<Consumed> {
        // Make sure the topics exist, so the consumer's subscription never
        // races their auto-creation by the relay's first produce.
        for topic in topics {
            self.ensure_topic(topic);
        }
        consume(&self.bootstrap(), topics, expected, timeout)
    }

    /// Reads until every id in `ids` has been seen (then two seconds more, to
    /// catch duplicates) or `timeout`.
    pub fn consume_ids(&self, topics: &[&str], ids: &[String], timeout: Duration) -> Vec<Consumed> {
        for topic in topics {
            self.ensure_topic(topic);
        }
        let wanted: std::collections::HashSet<&str> = ids.iter().map(String::as_str).collect();
        let mut seen = std::collections::HashSet::new();
        let mut read = 0;
        consume_until(
            &self.bootstrap(),
            topics,
            timeout,
            Duration::from_secs(2),
            |records| {
                for r in &records[read..] {
                    seen.insert(r.id());
                }
                read = records.len();
                wanted.iter().all(|id| seen.contains(*id))
            },
        )
    }
}

/// Reads `topics` from the beginning until `done` holds for what was read
/// (then `settle` longer, to catch stragglers such as duplicates) or `timeout`.
pub fn consume_until(
    bootstrap: &str,
    topics: &[&str],
    timeout: Duration,
    settle: Duration,
    mut done: impl FnMut(&[Consumed]) -> bool,
) -> Vec<Consumed> {
    let deadline = Instant::now() + timeout;
    let mut out = Vec::new();
    let mut settled_at: Option<Instant> = None;
    let consumer = assigned_consumer(bootstrap, topics, deadline);
    while Instant::now() < deadline {
        if let Some(at) = settled_at {
            if Instant::now() >= at {
                break;
            }
        } else if done(&out) {
            settled_at = Some(Instant::now() + settle);
        }
        if let Some(Ok(msg)) = consumer.poll(Duration::from_millis(100)) {
            out.push(to_consumed(&msg));
        }
    }
    out
}

/// Reads `topics` from the beginning until `expected` records or `timeout`.
pub fn consume(
    bootstrap: &str,
    topics: &[&str],
    expected: usize,
    timeout: Duration,
) -> Vec<Consumed> {
    consume_with(bootstrap, &[], topics, expected, timeout)
}

/// [`consume`] by a consumer with these extra properties (SASL, say).
pub fn consume_with(
    bootstrap: &str,
    properties: &[(&str, &str)],
    topics: &[&str],
    expected: usize,
    timeout: Duration,
) -> Vec<Consumed> {
    let deadline = Instant::now() + timeout;
    let consumer = assigned_consumer_with(bootstrap, properties, topics, deadline);
    let mut out = Vec::new();
    while out.len() < expected && Instant::now() < deadline {
        if let Some(Ok(msg)) = consumer.poll(Duration::from_millis(100)) {
            out.push(to_consumed(&msg));
        }
    }
    out
}

/// A consumer assigned every partition of `topics` from the beginning: no
/// consumer group, so no group join or rebalance to wait for.
fn assigned_consumer(bootstrap: &str, topics: &[&str], deadline: Instant) -> BaseConsumer {
    assigned_consumer_with(bootstrap, &[], topics, deadline)
}

fn assigned_consumer_with(
    bootstrap: &str,
    properties: &[(&str, &str)],
    topics: &[&str],
    deadline: Instant,
) -> BaseConsumer {
    let mut config = ClientConfig::new();
    for (key, value) in properties {
        config.set(*key, *value);
    }
    let consumer: BaseConsumer = config
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "outbox-relay-tests")
        .set("enable.auto.commit", "false")
        .create()
        .expect("create consumer");
    let mut assignment = TopicPartitionList::new();
    for topic in topics {
        let partitions = loop {
            let found = consumer
                .fetch_metadata(Some(topic), Duration::from_secs(5))
                .ok()
                .and_then(|m| m.topics().first().map(|t| t.partitions().len()))
                .unwrap_or(0);
            if found > 0 || Instant::now() >= deadline {
                break found;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        for p in 0..partitions {
            let p = i32::try_from(p).expect("partition index");
            assignment
                .add_partition_offset(topic, p, Offset::Beginning)
                .expect("assign partition");
        }
    }
    consumer.assign(&assignment).expect("assign");
    consumer
}

fn to_consumed(msg: &rdkafka::message::BorrowedMessage<'_>) -> Consumed {
    Consumed {
        topic: msg.topic().to_owned(),
        partition: msg.partition(),
        offset: msg.offset(),
        key: msg.key().map(<[u8]>::to_vec),
        payload: msg.payload().map(<[u8]>::to_vec),
        headers: msg
            .headers()
            .map(|h| {
                h.iter()
                    .map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec)))
                    .collect()
            })
            .unwrap_or_default(),
        timestamp: msg.timestamp().to_millis(),
    }
}
