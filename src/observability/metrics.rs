//! Prometheus metrics: every name in one place, and small typed functions to
//! record them.
//!
//! Names follow Prometheus conventions: the `outbox_relay_` prefix, the unit
//! in the name (`_bytes`, `_seconds`), `_total` on counters. LSNs are
//! exported as plain numbers (byte positions in the WAL); a gauge is an
//! `f64`, exact up to 2^53 bytes (8 PiB) of WAL.
//!
//! The recorder is the `metrics` crate's global one, rendered by
//! [`PrometheusHandle::render`] for `GET /metrics` (see [`super::http`]).
//! Until [`install`] runs every call here is a cheap no-op, so unit tests and
//! `--http-addr none` pay nothing.
//!
//! # The hot path
//! The relay acknowledges ~100k events/s. The free functions below look the
//! metric up in the registry on every call and, for labelled ones, allocate
//! the label value. The pipeline instead keeps a [`RelayMetrics`]: it holds
//! the registered handles, one per topic in a small map, so recording an
//! acknowledged event is a few atomic adds with no allocation. Handles are
//! bound to the recorder installed when they were created, so create
//! [`RelayMetrics`] after [`install`].

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::Duration;

use ::metrics::{Counter, Gauge, Histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::lsn::Lsn;

/// Events the broker acknowledged, by topic. Label: `topic`.
pub const EVENTS_RELAYED_TOTAL: &str = "outbox_relay_events_relayed_total";
/// Key+value bytes of the events the broker acknowledged.
pub const BYTES_RELAYED_TOTAL: &str = "outbox_relay_bytes_relayed_total";
/// Deliveries that failed, by librdkafka error kind. Label: `kind`.
pub const DELIVERY_ERRORS_TOTAL: &str = "outbox_relay_delivery_errors_total";
/// Events sent to the dead-letter topic instead of their own.
pub const DEAD_LETTERED_TOTAL: &str = "outbox_relay_dead_lettered_total";
/// Events handed to the producer and not yet acknowledged.
pub const IN_FLIGHT_EVENTS: &str = "outbox_relay_in_flight_events";
/// Key+value bytes handed to the producer and not yet acknowledged.
pub const IN_FLIGHT_BYTES: &str = "outbox_relay_in_flight_bytes";
/// The furthest WAL position received from the replication stream.
pub const RECEIVED_LSN: &str = "outbox_relay_received_lsn";
/// The ack frontier: the position reported to Postgres as flushed.
pub const ACK_FRONTIER_LSN: &str = "outbox_relay_ack_frontier_lsn";
/// `pg_current_wal_lsn() - confirmed_flush_lsn` of the slot: WAL the slot pins.
pub const SLOT_LAG_BYTES: &str = "outbox_relay_slot_lag_bytes";
/// The slot's `wal_status`: 1 for the current one, 0 for the others. Label: `wal_status`.
pub const SLOT_WAL_STATUS: &str = "outbox_relay_slot_wal_status";
/// The slot's `safe_wal_size`: WAL that can still be written before the slot is lost.
pub const SLOT_SAFE_WAL_SIZE_BYTES: &str = "outbox_relay_slot_safe_wal_size_bytes";
/// 1 when the server reports the slot invalidated (`invalidation_reason`, 17+;
/// `conflicting`, 16+), else 0.
pub const SLOT_INVALIDATED: &str = "outbox_relay_slot_invalidated";
/// `idle_replication_slot_timeout` (18+): a stopped relay loses its slot after it; 0 is off.
pub const SLOT_IDLE_TIMEOUT_SECONDS: &str = "outbox_relay_slot_idle_timeout_seconds";
/// From the transaction's commit in Postgres to the broker's acknowledgement.
pub const COMMIT_TO_ACK_SECONDS: &str = "outbox_relay_commit_to_ack_seconds";
/// Replication stream reconnects.
pub const RECONNECTS_TOTAL: &str = "outbox_relay_reconnects_total";
/// Outbox rows deleted by `--cleanup delete`.
pub const CLEANUP_DELETED_ROWS_TOTAL: &str = "outbox_relay_cleanup_deleted_rows_total";
/// 1 when the slot is marked for failover (PostgreSQL 17+), else 0.
pub const SLOT_FAILOVER: &str = "outbox_relay_slot_failover";
/// 1 when the server's `synchronized_standby_slots` is set (PostgreSQL 17+), else 0.
pub const SYNCHRONIZED_STANDBY_SLOTS_SET: &str = "outbox_relay_synchronized_standby_slots_set";
/// Always 1; the label carries the version. Label: `version`.
pub const BUILD_INFO: &str = "outbox_relay_build_info";

/// Every metric name, for tests and documentation.
pub const ALL: &[&str] = &[
    EVENTS_RELAYED_TOTAL,
    BYTES_RELAYED_TOTAL,
    DELIVERY_ERRORS_TOTAL,
    DEAD_LETTERED_TOTAL,
    IN_FLIGHT_EVENTS,
    IN_FLIGHT_BYTES,
    RECEIVED_LSN,
    ACK_FRONTIER_LSN,
    SLOT_LAG_BYTES,
    SLOT_WAL_STATUS,
    SLOT_SAFE_WAL_SIZE_BYTES,
    SLOT_INVALIDATED,
    SLOT_IDLE_TIMEOUT_SECONDS,
    COMMIT_TO_ACK_SECONDS,
    RECONNECTS_TOTAL,
    CLEANUP_DELETED_ROWS_TOTAL,
    SLOT_FAILOVER,
    SYNCHRONIZED_STANDBY_SLOTS_SET,
    BUILD_INFO,
];

/// Buckets of [`COMMIT_TO_ACK_SECONDS`]: 0.5 ms to 60 s, fine below 25 ms
/// where a healthy relay's latencies fall.
pub const COMMIT_TO_ACK_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// The values of the `wal_status` label, as `pg_replication_slots` spells them.
pub const WAL_STATUSES: &[&str] = &["reserved", "extended", "unreserved", "lost"];

/// Most distinct `topic` label values; events for further topics are counted
/// under `topic="_other"` so a runaway topic template cannot exhaust memory.
pub const MAX_TOPIC_LABELS: usize = 1000;

/// The `topic` label value used past [`MAX_TOPIC_LABELS`].
pub const OTHER_TOPIC: &str = "_other";

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the Prometheus recorder as the global `metrics` recorder (once;
/// later calls return the same handle), describes every metric and sets
/// [`BUILD_INFO`].
///
/// If another recorder was installed first (a test harness, say), the handle
/// still renders, but only this module's descriptions and no values.
pub fn install() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            let recorder = builder().build_recorder();
            let handle = recorder.handle();
            if let Err(e) = ::metrics::set_global_recorder(recorder) {
                tracing::warn!(error = %e, "another metrics recorder is installed; /metrics will be empty");
            }
            describe();
            build_info(env!("CARGO_PKG_VERSION"));
            handle
        })
        .clone()
}

fn builder() -> PrometheusBuilder {
    let matcher = Matcher::Full(COMMIT_TO_ACK_SECONDS.to_owned());
    match PrometheusBuilder::new().set_buckets_for_metric(matcher, COMMIT_TO_ACK_BUCKETS) {
        Ok(builder) => builder,
        // Only an empty bucket list is refused, and ours is a non-empty constant.
        Err(_) => PrometheusBuilder::new(),
    }
}

fn describe() {
    use ::metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        EVENTS_RELAYED_TOTAL,
        "Outbox events the broker acknowledged, by topic."
    );
    describe_counter!(
        BYTES_RELAYED_TOTAL,
        "Key and value bytes of the events the broker acknowledged."
    );
    describe_counter!(
        DELIVERY_ERRORS_TOTAL,
        "Deliveries that failed for good, by librdkafka error kind."
    );
    describe_counter!(
        DEAD_LETTERED_TOTAL,
        "Events routed to the dead-letter topic."
    );
    describe_gauge!(
        IN_FLIGHT_EVENTS,
        "Events handed to the producer and not yet acknowledged."
    );
    describe_gauge!(
        IN_FLIGHT_BYTES,
        "Key and value bytes handed to the producer and not yet acknowledged."
    );
    describe_gauge!(
        RECEIVED_LSN,
        "Furthest WAL position received from the replication stream, in bytes."
    );
    describe_gauge!(
        ACK_FRONTIER_LSN,
        "WAL position reported to Postgres as flushed (everything before it is acknowledged by the broker), in bytes."
    );
    describe_gauge!(
        SLOT_LAG_BYTES,
        "pg_current_wal_lsn() - confirmed_flush_lsn of the slot: WAL the slot keeps."
    );
    describe_gauge!(
        SLOT_WAL_STATUS,
        "The slot's wal_status (1 for the current value); extended/unreserved/lost need attention."
    );
    describe_gauge!(
        SLOT_SAFE_WAL_SIZE_BYTES,
        "WAL that can still be written before the slot is invalidated (NaN when unlimited)."
    );
    describe_gauge!(
        SLOT_INVALIDATED,
        "1 when Postgres reports the slot invalidated (invalidation_reason, conflicting)."
    );
    describe_gauge!(
        SLOT_IDLE_TIMEOUT_SECONDS,
        "idle_replication_slot_timeout: a relay stopped longer loses its slot (0: off)."
    );
    describe_histogram!(
        COMMIT_TO_ACK_SECONDS,
        "Seconds from the transaction's commit in Postgres to the broker's acknowledgement."
    );
    describe_counter!(RECONNECTS_TOTAL, "Replication stream reconnects.");
    describe_counter!(
        CLEANUP_DELETED_ROWS_TOTAL,
        "Outbox rows deleted by --cleanup delete after the broker acknowledged their events."
    );
    describe_gauge!(
        SLOT_FAILOVER,
        "1 when the slot is marked for failover (PostgreSQL 17+), else 0."
    );
    describe_gauge!(
        SYNCHRONIZED_STANDBY_SLOTS_SET,
        "1 when synchronized_standby_slots is set on the server (PostgreSQL 17+), else 0."
    );
    describe_gauge!(BUILD_INFO, "Always 1; the version label names the build.");
}

/// Sets [`BUILD_INFO`]`{version}` to 1.
pub fn build_info(version: &str) {
    ::metrics::gauge!(BUILD_INFO, "version" => version.to_owned()).set(1.0);
}

/// The broker acknowledged one event (allocates the label: prefer [`RelayMetrics`]).
pub fn event_acked(topic: &str, bytes: usize, commit_to_ack: Duration) {
    ::metrics::counter!(EVENTS_RELAYED_TOTAL, "topic" => topic.to_owned()).increment(1);
    ::metrics::counter!(BYTES_RELAYED_TOTAL).increment(bytes as u64);
    ::metrics::histogram!(COMMIT_TO_ACK_SECONDS).record(commit_to_ack.as_secs_f64());
}

/// A delivery failed for good; `kind` comes from [`error_kind`].
pub fn delivery_error(kind: &str) {
    ::metrics::counter!(DELIVERY_ERRORS_TOTAL, "kind" => kind.to_owned()).increment(1);
}

/// One event went to the dead-letter topic.
pub fn dead_lettered() {
    ::metrics::counter!(DEAD_LETTERED_TOTAL).increment(1);
}

/// The replication stream was re-established.
pub fn reconnected() {
    ::metrics::counter!(RECONNECTS_TOTAL).increment(1);
}

/// `--cleanup delete` removed `rows` outbox rows.
pub fn cleanup_deleted(rows: u64) {
    ::metrics::counter!(CLEANUP_DELETED_ROWS_TOTAL).increment(rows);
}

/// Events and bytes in flight.
pub fn set_in_flight(events: usize, bytes: usize) {
    ::metrics::gauge!(IN_FLIGHT_EVENTS).set(events as f64);
    ::metrics::gauge!(IN_FLIGHT_BYTES).set(bytes as f64);
}

/// The furthest position received from the stream.
pub fn set_received_lsn(lsn: Lsn) {
    ::metrics::gauge!(RECEIVED_LSN).set(lsn.as_u64() as f64);
}

/// The ack frontier.
pub fn set_ack_frontier(lsn: Lsn) {
    ::metrics::gauge!(ACK_FRONTIER_LSN).set(lsn.as_u64() as f64);
}

/// What the slot poller saw. `wal_status` is `pg_replication_slots.wal_status`
/// (`None` when the slot is missing: every status gauge is then 0);
/// `safe_wal_size` is `None` when unlimited (`max_slot_wal_keep_size = -1`).
pub fn set_slot(lag_bytes: Option<u64>, wal_status: Option<&str>, safe_wal_size: Option<i64>) {
    if let Some(lag) = lag_bytes {
        ::metrics::gauge!(SLOT_LAG_BYTES).set(lag as f64);
    }
    for status in WAL_STATUSES {
        let value = if wal_status == Some(*status) {
            1.0
        } else {
            0.0
        };
        ::metrics::gauge!(SLOT_WAL_STATUS, "wal_status" => *status).set(value);
    }
    match safe_wal_size {
        Some(size) => ::metrics::gauge!(SLOT_SAFE_WAL_SIZE_BYTES).set(size as f64),
        None => ::metrics::gauge!(SLOT_SAFE_WAL_SIZE_BYTES).set(f64::NAN),
    }
}

/// The slot's failover facts; absent (before PostgreSQL 17) reads as 0.
pub fn set_failover(failover: Option<bool>, standby_slots_set: Option<bool>) {
    let value = |b: Option<bool>| if b == Some(true) { 1.0 } else { 0.0 };
    ::metrics::gauge!(SLOT_FAILOVER).set(value(failover));
    ::metrics::gauge!(SYNCHRONIZED_STANDBY_SLOTS_SET).set(value(standby_slots_set));
}

/// The slot facts of newer servers (see [`SLOT_INVALIDATED`]).
pub fn set_slot_facts(facts: &crate::observability::health::SlotFacts) {
    let invalidated = if facts.invalidated().is_some() {
        1.0
    } else {
        0.0
    };
    ::metrics::gauge!(SLOT_INVALIDATED).set(invalidated);
    ::metrics::gauge!(SLOT_IDLE_TIMEOUT_SECONDS).set(facts.idle_timeout_secs.unwrap_or(0) as f64);
}

/// A bounded label value for a librdkafka error: the error code in snake case
/// (`message_timed_out`, `topic_authorization_failed`), or the error's family.
pub fn error_kind(error: &rdkafka::error::KafkaError) -> String {
    match error.rdkafka_error_code() {
        Some(code) => snake_case(&format!("{code:?}")),
        None => "other".to_owned(),
    }
}

fn snake_case(camel: &str) -> String {
    let mut out = String::with_capacity(camel.len() + 8);
    for (i, c) in camel.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else if c.is_ascii_alphanumeric() {
            out.push(c);
        }
    }
    out
}

/// Pre-registered metric handles for the pipeline's hot path; see the module docs.
pub struct RelayMetrics {
    topics: HashMap<Box<str>, Counter>,
    other_topic: Option<Counter>,
    bytes_relayed: Counter,
    commit_to_ack: Histogram,
    in_flight_events: Gauge,
    in_flight_bytes: Gauge,
    received_lsn: Gauge,
    ack_frontier: Gauge,
}

impl Default for RelayMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl RelayMetrics {
    /// Registers the handles with the recorder installed now.
    pub fn new() -> Self {
        RelayMetrics {
            topics: HashMap::new(),
            other_topic: None,
            bytes_relayed: ::metrics::counter!(BYTES_RELAYED_TOTAL),
            commit_to_ack: ::metrics::histogram!(COMMIT_TO_ACK_SECONDS),
            in_flight_events: ::metrics::gauge!(IN_FLIGHT_EVENTS),
            in_flight_bytes: ::metrics::gauge!(IN_FLIGHT_BYTES),
            received_lsn: ::metrics::gauge!(RECEIVED_LSN),
            ack_frontier: ::metrics::gauge!(ACK_FRONTIER_LSN),
        }
    }

    /// The [`EVENTS_RELAYED_TOTAL`] counter of `topic`; allocates only the
    /// first time a topic is seen. A `Counter` clone is a reference count.
    pub fn topic(&mut self, topic: &str) -> Counter {
        if let Some(counter) = self.topics.get(topic) {
            return counter.clone();
        }
        if self.topics.len() >= MAX_TOPIC_LABELS {
            return self
                .other_topic
                .get_or_insert_with(|| {
                    tracing::warn!(
                        limit = MAX_TOPIC_LABELS,
                        "too many distinct topics for the events_relayed metric; counting the rest under topic=\"_other\""
                    );
                    ::metrics::counter!(EVENTS_RELAYED_TOTAL, "topic" => OTHER_TOPIC)
                })
                .clone();
        }
        let counter = ::metrics::counter!(EVENTS_RELAYED_TOTAL, "topic" => topic.to_owned());
        self.topics.insert(topic.into(), counter.clone());
        counter
    }

    /// The broker acknowledged one event of `topic` with `bytes` of key+value.
    pub fn event_acked(&mut self, topic: &str, bytes: usize, commit_to_ack: Duration) {
        self.topic(topic).increment(1);
        self.acked_on(None, bytes, commit_to_ack);
    }

    /// Like [`RelayMetrics::event_acked`] with the topic's counter already in hand
    /// (from [`RelayMetrics::topic`]).
    pub fn acked_on(&self, topic: Option<&Counter>, bytes: usize, commit_to_ack: Duration) {
        if let Some(topic) = topic {
            topic.increment(1);
        }
        self.bytes_relayed.increment(bytes as u64);
        self.commit_to_ack.record(commit_to_ack.as_secs_f64());
    }

    /// Events and bytes in flight.
    pub fn set_in_flight(&self, events: usize, bytes: usize) {
        self.in_flight_events.set(events as f64);
        self.in_flight_bytes.set(bytes as f64);
    }

    /// The furthest position received from the stream.
    pub fn set_received_lsn(&self, lsn: Lsn) {
        self.received_lsn.set(lsn.as_u64() as f64);
    }

    /// The ack frontier.
    pub fn set_ack_frontier(&self, lsn: Lsn) {
        self.ack_frontier.set(lsn.as_u64() as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_prometheus_conventions() {
        for name in ALL {
            assert!(name.starts_with("outbox_relay_"), "{name}");
            assert!(
                name.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
                "{name}"
            );
        }
        let mut sorted = ALL.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), ALL.len(), "duplicate metric name");
        for counter in [
            EVENTS_RELAYED_TOTAL,
            BYTES_RELAYED_TOTAL,
            DELIVERY_ERRORS_TOTAL,
            DEAD_LETTERED_TOTAL,
            RECONNECTS_TOTAL,
            CLEANUP_DELETED_ROWS_TOTAL,
        ] {
            assert!(counter.ends_with("_total"), "{counter}");
        }
        assert!(COMMIT_TO_ACK_SECONDS.ends_with("_seconds"));
        assert!(SLOT_LAG_BYTES.ends_with("_bytes"));
        assert!(SLOT_SAFE_WAL_SIZE_BYTES.ends_with("_bytes"));
        assert!(IN_FLIGHT_BYTES.ends_with("_bytes"));
        assert_eq!(COMMIT_TO_ACK_BUCKETS.first(), Some(&0.0005));
        assert_eq!(COMMIT_TO_ACK_BUCKETS.last(), Some(&60.0));
        assert!(COMMIT_TO_ACK_BUCKETS.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn recorded_values_render_under_their_names() {
        let recorder = builder().build_recorder();
        let handle = recorder.handle();
        ::metrics::with_local_recorder(&recorder, || {
            let mut relay = RelayMetrics::new();
            relay.event_acked("orders", 100, Duration::from_millis(3));
            relay.event_acked("orders", 50, Duration::from_millis(30));
            relay.event_acked("payments", 10, Duration::from_secs(2));
            relay.set_in_flight(7, 700);
            relay.set_received_lsn(Lsn(0x1_0000_0010));
            relay.set_ack_frontier(Lsn(42));
            set_slot(Some(1234), Some("extended"), Some(4096));
            set_failover(Some(true), Some(false));
            delivery_error("message_timed_out");
            dead_lettered();
            reconnected();
            cleanup_deleted(3);
            build_info("1.2.3");
        });
        let text = handle.render();
        for line in [
            "outbox_relay_events_relayed_total{topic=\"orders\"} 2",
            "outbox_relay_events_relayed_total{topic=\"payments\"} 1",
            "outbox_relay_bytes_relayed_total 160",
            "outbox_relay_in_flight_events 7",
            "outbox_relay_in_flight_bytes 700",
            "outbox_relay_received_lsn 4294967312",
            "outbox_relay_ack_frontier_lsn 42",
            "outbox_relay_slot_lag_bytes 1234",
            "outbox_relay_slot_wal_status{wal_status=\"extended\"} 1",
            "outbox_relay_slot_wal_status{wal_status=\"reserved\"} 0",
            "outbox_relay_slot_safe_wal_size_bytes 4096",
            "outbox_relay_delivery_errors_total{kind=\"message_timed_out\"} 1",
            "outbox_relay_dead_lettered_total 1",
            "outbox_relay_reconnects_total 1",
            "outbox_relay_cleanup_deleted_rows_total 3",
            "outbox_relay_build_info{version=\"1.2.3\"} 1",
            "outbox_relay_commit_to_ack_seconds_bucket{le=\"0.005\"} 1",
            "outbox_relay_commit_to_ack_seconds_bucket{le=\"0.05\"} 2",
            "outbox_relay_commit_to_ack_seconds_count 3",
        ] {
            assert!(text.contains(line), "missing {line:?} in:\n{text}");
        }
    }

    #[test]
    fn topic_labels_are_bounded() {
        let recorder = builder().build_recorder();
        let handle = recorder.handle();
        ::metrics::with_local_recorder(&recorder, || {
            let mut relay = RelayMetrics::new();
            for i in 0..MAX_TOPIC_LABELS + 5 {
                relay.event_acked(&format!("t{i}"), 1, Duration::ZERO);
            }
            assert_eq!(relay.topics.len(), MAX_TOPIC_LABELS);
        });
        let text = handle.render();
        assert!(
            text.contains("outbox_relay_events_relayed_total{topic=\"_other\"} 5"),
            "{text}"
        );
    }

    #[test]
    fn error_kinds_are_snake_case_codes() {
        use rdkafka::error::{KafkaError, RDKafkaErrorCode};
        let e = KafkaError::MessageProduction(RDKafkaErrorCode::MessageTimedOut);
        assert_eq!(error_kind(&e), "message_timed_out");
        let e = KafkaError::MessageProduction(RDKafkaErrorCode::TopicAuthorizationFailed);
        assert_eq!(error_kind(&e), "topic_authorization_failed");
        assert_eq!(error_kind(&KafkaError::Canceled), "other");
    }

    #[test]
    fn install_is_idempotent() {
        let a = install();
        let b = install();
        assert!(a.render().contains(BUILD_INFO));
        assert_eq!(a.render(), b.render());
    }
}
