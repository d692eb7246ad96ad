//! Prometheus metrics: every name in one table ([`ALL`]), the recorder and
//! the [`RelayMetrics`] handles of the pipeline's hot path.
//!
//! Names follow Prometheus conventions: the `outbox_relay_` prefix, the unit
//! in the name (`_bytes`, `_seconds`), `_total` on counters. LSNs are
//! exported as plain numbers (byte positions in the WAL); a gauge is an
//! `f64`, exact up to 2^53 bytes (8 PiB) of WAL. The names are a contract
//! (the README, the alerts and dashboards under `deploy/`).
//!
//! The recorder is the `metrics` crate's global one, rendered by
//! [`PrometheusHandle::render`] for `GET /metrics` (see [`super::http`]).
//! Until [`install`] runs every call here is a cheap no-op, so unit tests and
//! `--http-addr none` pay nothing.
//!
//! # The hot path
//! The relay acknowledges ~100k events/s. Looking a metric up in the registry
//! and allocating its label on every event would cost more than the event, so
//! the pipeline keeps a [`RelayMetrics`]: the registered handles, one per
//! topic in a small map, so recording an acknowledged event is a few atomic
//! adds with no allocation. Handles are bound to the recorder installed when
//! they were created, so create [`RelayMetrics`] after [`install`]. Rare
//! events (reconnects, dead letters, slot polls) use the free functions.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::Duration;

use ::metrics::{Counter, Gauge, Histogram, counter, gauge};
use heck::ToSnakeCase;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use super::health::{SlotObservation, WalStatus};
use crate::lsn::Lsn;

/// Declares the metric names, [`ALL`] and their `# HELP` texts in one table.
macro_rules! metrics {
    ($($(#[doc = $doc:literal])+ $describe:ident $name:ident = $metric:literal, $help:literal;)+) => {
        $($(#[doc = $doc])+ pub const $name: &str = $metric;)+
        /// Every metric name, for tests and documentation.
        pub const ALL: &[&str] = &[$($name),+];
        fn describe() {
            $(::metrics::$describe!($name, $help);)+
        }
    };
}

metrics! {
    /// Events the broker acknowledged, by topic. Label: `topic`.
    describe_counter EVENTS_RELAYED_TOTAL = "outbox_relay_events_relayed_total",
        "Outbox events the broker acknowledged, by topic.";
    /// Key+value bytes of the events the broker acknowledged.
    describe_counter BYTES_RELAYED_TOTAL = "outbox_relay_bytes_relayed_total",
        "Key and value bytes of the events the broker acknowledged.";
    /// Deliveries that failed, by librdkafka error kind. Label: `kind`.
    describe_counter DELIVERY_ERRORS_TOTAL = "outbox_relay_delivery_errors_total",
        "Deliveries that failed for good, by librdkafka error kind.";
    /// Events sent to the dead-letter topic instead of their own.
    describe_counter DEAD_LETTERED_TOTAL = "outbox_relay_dead_lettered_total",
        "Events routed to the dead-letter topic.";
    /// Events handed to the producer and not yet acknowledged.
    describe_gauge IN_FLIGHT_EVENTS = "outbox_relay_in_flight_events",
        "Events handed to the producer and not yet acknowledged.";
    /// Key+value bytes handed to the producer and not yet acknowledged.
    describe_gauge IN_FLIGHT_BYTES = "outbox_relay_in_flight_bytes",
        "Key and value bytes handed to the producer and not yet acknowledged.";
    /// The furthest WAL position received from the replication stream.
    describe_gauge RECEIVED_LSN = "outbox_relay_received_lsn",
        "Furthest WAL position received from the replication stream, in bytes.";
    /// The ack frontier: the position reported to Postgres as flushed.
    describe_gauge ACK_FRONTIER_LSN = "outbox_relay_ack_frontier_lsn",
        "WAL position reported to Postgres as flushed (everything before it is acknowledged by the broker), in bytes.";
    /// `pg_current_wal_lsn() - confirmed_flush_lsn` of the slot: WAL the slot pins.
    describe_gauge SLOT_LAG_BYTES = "outbox_relay_slot_lag_bytes",
        "pg_current_wal_lsn() - confirmed_flush_lsn of the slot: WAL the slot keeps.";
    /// The slot's `wal_status`: 1 for the current one, 0 for the others. Label: `wal_status`.
    describe_gauge SLOT_WAL_STATUS = "outbox_relay_slot_wal_status",
        "The slot's wal_status (1 for the current value); extended/unreserved/lost need attention.";
    /// The slot's `safe_wal_size`: WAL that can still be written before the slot is lost.
    describe_gauge SLOT_SAFE_WAL_SIZE_BYTES = "outbox_relay_slot_safe_wal_size_bytes",
        "WAL that can still be written before the slot is invalidated (NaN when unlimited).";
    /// 1 when the server reports the slot invalidated (`invalidation_reason`, 17+;
    /// `conflicting`, 16+), else 0.
    describe_gauge SLOT_INVALIDATED = "outbox_relay_slot_invalidated",
        "1 when Postgres reports the slot invalidated (invalidation_reason, conflicting).";
    /// `idle_replication_slot_timeout` (18+): a stopped relay loses its slot after it; 0 is off.
    describe_gauge SLOT_IDLE_TIMEOUT_SECONDS = "outbox_relay_slot_idle_timeout_seconds",
        "idle_replication_slot_timeout: a relay stopped longer loses its slot (0: off).";
    /// From the transaction's commit in Postgres to the broker's acknowledgement.
    describe_histogram COMMIT_TO_ACK_SECONDS = "outbox_relay_commit_to_ack_seconds",
        "Seconds from the transaction's commit in Postgres to the broker's acknowledgement.";
    /// Replication stream reconnects.
    describe_counter RECONNECTS_TOTAL = "outbox_relay_reconnects_total",
        "Replication stream reconnects.";
    /// Outbox rows deleted by `--cleanup delete`.
    describe_counter CLEANUP_DELETED_ROWS_TOTAL = "outbox_relay_cleanup_deleted_rows_total",
        "Outbox rows deleted by --cleanup delete after the broker acknowledged their events.";
    /// 1 when the slot is marked for failover (PostgreSQL 17+), else 0.
    describe_gauge SLOT_FAILOVER = "outbox_relay_slot_failover",
        "1 when the slot is marked for failover (PostgreSQL 17+), else 0.";
    /// 1 when the server's `synchronized_standby_slots` is set (PostgreSQL 17+), else 0.
    describe_gauge SYNCHRONIZED_STANDBY_SLOTS_SET = "outbox_relay_synchronized_standby_slots_set",
        "1 when synchronized_standby_slots is set on the server (PostgreSQL 17+), else 0.";
    /// Always 1; the label carries the version. Label: `version`.
    describe_gauge BUILD_INFO = "outbox_relay_build_info",
        "Always 1; the version label names the build.";
}

/// Buckets of [`COMMIT_TO_ACK_SECONDS`]: 0.5 ms to 60 s, fine below 25 ms
/// where a healthy relay's latencies fall.
const COMMIT_TO_ACK_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// The `wal_status` label's values, as `pg_replication_slots` spells them.
const WAL_STATUSES: [WalStatus; 4] = [
    WalStatus::Reserved,
    WalStatus::Extended,
    WalStatus::Unreserved,
    WalStatus::Lost,
];

/// Most distinct `topic` label values; events for further topics are counted
/// under `topic="_other"` so a runaway topic template cannot exhaust memory.
const MAX_TOPIC_LABELS: usize = 1000;

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
            gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
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

/// A delivery failed for good; `kind` comes from [`error_kind`].
pub fn delivery_error(kind: &str) {
    counter!(DELIVERY_ERRORS_TOTAL, "kind" => kind.to_owned()).increment(1);
}

/// One event went to the dead-letter topic.
pub fn dead_lettered() {
    counter!(DEAD_LETTERED_TOTAL).increment(1);
}

/// The replication stream was re-established.
pub fn reconnected() {
    counter!(RECONNECTS_TOTAL).increment(1);
}

/// `--cleanup delete` removed `rows` outbox rows.
pub fn cleanup_deleted(rows: u64) {
    counter!(CLEANUP_DELETED_ROWS_TOTAL).increment(rows);
}

/// What the slot poller saw. A missing slot sets every `wal_status` gauge to 0;
/// an unknown one changes nothing.
pub fn set_slot(observation: &SlotObservation) {
    let flag = |b: bool| if b { 1.0 } else { 0.0 };
    let slot = match observation {
        SlotObservation::Unknown => return,
        SlotObservation::Missing => None,
        SlotObservation::Seen(slot) => Some(slot),
    };
    for status in WAL_STATUSES {
        let current = slot.is_some_and(|s| s.wal_status == status);
        gauge!(SLOT_WAL_STATUS, "wal_status" => status.as_str()).set(flag(current));
    }
    let Some(slot) = slot else { return };
    if let Some(lag) = slot.lag_bytes {
        gauge!(SLOT_LAG_BYTES).set(lag as f64);
    }
    // NaN: unlimited (`max_slot_wal_keep_size = -1`).
    gauge!(SLOT_SAFE_WAL_SIZE_BYTES).set(slot.safe_wal_size_bytes.map_or(f64::NAN, |s| s as f64));
    gauge!(SLOT_FAILOVER).set(flag(slot.failover == Some(true)));
    let standby_slots = slot.synchronized_standby_slots_set == Some(true);
    gauge!(SYNCHRONIZED_STANDBY_SLOTS_SET).set(flag(standby_slots));
    gauge!(SLOT_INVALIDATED).set(flag(slot.facts.invalidated().is_some()));
    let idle_timeout = slot.facts.idle_timeout_secs.unwrap_or(0);
    gauge!(SLOT_IDLE_TIMEOUT_SECONDS).set(idle_timeout as f64);
}

/// A bounded label value for a librdkafka error: the error code in snake case
/// (`message_timed_out`, `topic_authorization_failed`), or `other`.
pub fn error_kind(error: &rdkafka::error::KafkaError) -> String {
    match error.rdkafka_error_code() {
        Some(code) => format!("{code:?}").to_snake_case(),
        None => "other".to_owned(),
    }
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

impl RelayMetrics {
    /// Registers the handles with the recorder installed now.
    pub(crate) fn new() -> Self {
        RelayMetrics {
            topics: HashMap::new(),
            other_topic: None,
            bytes_relayed: counter!(BYTES_RELAYED_TOTAL),
            commit_to_ack: ::metrics::histogram!(COMMIT_TO_ACK_SECONDS),
            in_flight_events: gauge!(IN_FLIGHT_EVENTS),
            in_flight_bytes: gauge!(IN_FLIGHT_BYTES),
            received_lsn: gauge!(RECEIVED_LSN),
            ack_frontier: gauge!(ACK_FRONTIER_LSN),
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
                    counter!(EVENTS_RELAYED_TOTAL, "topic" => "_other")
                })
                .clone();
        }
        let counter = counter!(EVENTS_RELAYED_TOTAL, "topic" => topic.to_owned());
        self.topics.insert(topic.into(), counter.clone());
        counter
    }

    /// The broker acknowledged one event with `bytes` of key+value; `topic`
    /// is its counter from [`RelayMetrics::topic`].
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
            for (topic, bytes, latency) in [
                ("orders", 100, Duration::from_millis(3)),
                ("orders", 50, Duration::from_millis(30)),
                ("payments", 10, Duration::from_secs(2)),
            ] {
                let counter = relay.topic(topic);
                relay.acked_on(Some(&counter), bytes, latency);
            }
            relay.set_in_flight(7, 700);
            relay.set_received_lsn(Lsn(0x1_0000_0010));
            relay.set_ack_frontier(Lsn(42));
            set_slot(&SlotObservation::Seen(
                crate::observability::health::SlotStatus {
                    lag_bytes: Some(1234),
                    wal_status: WalStatus::Extended,
                    safe_wal_size_bytes: Some(4096),
                    failover: Some(true),
                    synchronized_standby_slots_set: Some(false),
                    facts: Default::default(),
                },
            ));
            delivery_error("message_timed_out");
            dead_lettered();
            reconnected();
            cleanup_deleted(3);
            gauge!(BUILD_INFO, "version" => "1.2.3").set(1.0);
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
            "outbox_relay_slot_failover 1",
            "outbox_relay_synchronized_standby_slots_set 0",
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
                let counter = relay.topic(&format!("t{i}"));
                relay.acked_on(Some(&counter), 1, Duration::ZERO);
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
