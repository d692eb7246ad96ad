//! Prometheus metrics: every name and `# HELP` text in one table ([`ALL`], a contract
//! with docs/observability.md and `deploy/`), the recorder and the slot gauges. Until [`install`]
//! runs every call is a no-op, so unit tests and `--http-addr none` pay nothing.

use std::sync::OnceLock;

use ::metrics::gauge;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use super::health::{SlotObservation, WalStatus};
use crate::outbox::Shard;

/// Declares each metric's name constant (documented by its help text), [`ALL`] and `describe()`.
macro_rules! metrics {
    ($($describe:ident $name:ident = $metric:literal, $help:literal;)+) => {
        $(#[doc = $help] pub const $name: &str = $metric;)+
        /// Every metric name, for tests and documentation.
        pub const ALL: &[&str] = &[$($name),+];
        fn describe() {
            $(::metrics::$describe!($name, $help);)+
        }
    };
}

metrics! {
    describe_counter EVENTS_RELAYED_TOTAL = "outbox_relay_events_relayed_total",
        "Outbox events the broker acknowledged, by topic.";
    describe_counter BYTES_RELAYED_TOTAL = "outbox_relay_bytes_relayed_total",
        "Key and value bytes of the events the broker acknowledged.";
    describe_counter DELIVERY_ERRORS_TOTAL = "outbox_relay_delivery_errors_total",
        "Deliveries that failed for good, by librdkafka error kind.";
    describe_counter DEAD_LETTERED_TOTAL = "outbox_relay_dead_lettered_total",
        "Events routed to the dead-letter topic.";
    describe_gauge IN_FLIGHT_EVENTS = "outbox_relay_in_flight_events",
        "Events handed to the producer and not yet acknowledged.";
    describe_gauge IN_FLIGHT_BYTES = "outbox_relay_in_flight_bytes",
        "Key and value bytes handed to the producer and not yet acknowledged.";
    describe_gauge RECEIVED_LSN = "outbox_relay_received_lsn",
        "Furthest WAL position received from the replication stream, in bytes.";
    describe_gauge ACK_FRONTIER_LSN = "outbox_relay_ack_frontier_lsn",
        "WAL position reported to Postgres as flushed (everything before it is acknowledged by the broker), in bytes.";
    describe_gauge SLOT_LAG_BYTES = "outbox_relay_slot_lag_bytes",
        "pg_current_wal_lsn() - confirmed_flush_lsn of the slot: WAL the slot keeps.";
    describe_gauge SLOT_WAL_STATUS = "outbox_relay_slot_wal_status",
        "The slot's wal_status (1 for the current value); extended/unreserved/lost need attention.";
    describe_gauge SLOT_SAFE_WAL_SIZE_BYTES = "outbox_relay_slot_safe_wal_size_bytes",
        "WAL that can still be written before the slot is invalidated (NaN when unlimited).";
    describe_gauge SLOT_INVALIDATED = "outbox_relay_slot_invalidated",
        "1 when Postgres reports the slot invalidated (invalidation_reason, conflicting).";
    describe_gauge SLOT_IDLE_TIMEOUT_SECONDS = "outbox_relay_slot_idle_timeout_seconds",
        "idle_replication_slot_timeout: a relay stopped longer loses its slot (0: off).";
    describe_histogram COMMIT_TO_ACK_SECONDS = "outbox_relay_commit_to_ack_seconds",
        "Seconds from the transaction's commit in Postgres to the broker's acknowledgement.";
    describe_counter RECONNECTS_TOTAL = "outbox_relay_reconnects_total",
        "Replication stream reconnects.";
    describe_counter TAIL_RECORDS_READ_TOTAL = "outbox_relay_exactly_once_tail_records_read_total",
        "Records read back from a partition's end after a (re)connect (--delivery exactly-once), by topic and partition.";
    describe_counter CLEANUP_DELETED_ROWS_TOTAL = "outbox_relay_cleanup_deleted_rows_total",
        "Outbox rows deleted by --cleanup delete after the broker acknowledged their events.";
    describe_counter CLEANUP_KEPT_ROWS_TOTAL = "outbox_relay_cleanup_kept_rows_total",
        "Outbox rows --cleanup delete leaves in the table because not all they held reached Kafka (dead-lettered without the payload).";
    describe_gauge CLEANUP_BACKLOG_ROWS = "outbox_relay_cleanup_backlog_rows",
        "Outbox rows from the oldest one --cleanup delete has not deleted yet on; the slot waits for that one, and reading pauses at --max-in-flight-events.";
    describe_gauge CLEANUP_HELD_ROWS = "outbox_relay_cleanup_held_rows",
        "Outbox rows a delete left in place (another session holds them, or the delete failed), to be tried again.";
    describe_gauge SLOT_FAILOVER = "outbox_relay_slot_failover",
        "1 when the slot is marked for failover (PostgreSQL 17+), else 0.";
    describe_gauge SLOT_FAILOVER_READY = "outbox_relay_slot_failover_ready",
        "1 when every standby --postgres-url names holds a persistent synchronized copy of the failover slot, else 0.";
    describe_gauge SYNCHRONIZED_STANDBY_SLOTS_SET = "outbox_relay_synchronized_standby_slots_set",
        "1 when synchronized_standby_slots is set on the server (PostgreSQL 17+), else 0.";
    describe_counter AWS_CREDENTIALS_FETCHES = "outbox_relay_aws_credentials_fetches_total",
        "Fetches of AWS credentials from the credential chain, by outcome (ok, failed).";
    describe_gauge AWS_CREDENTIALS_EXPIRY = "outbox_relay_aws_credentials_expiry_timestamp_seconds",
        "When the AWS credentials in use expire, in Unix seconds (+Inf for keys that do not).";
    describe_gauge AWS_CREDENTIALS_INFO = "outbox_relay_aws_credentials_info",
        "1 for the source of the AWS credentials in use (environment, profile, credential-process, web-identity, container, instance-metadata, assumed-role), else 0.";
    describe_counter AUTH_TOKENS = "outbox_relay_auth_tokens_total",
        "AWS IAM tokens signed, by target: kafka (MSK tokens handed to librdkafka), postgres (RDS tokens, one per connection).";
    describe_counter AUTH_TOKEN_FAILURES = "outbox_relay_auth_token_failures_total",
        "AWS IAM tokens that could not be signed, by target (kafka, postgres); each is asked for again.";
    describe_gauge SCHEMA_REGISTRY_WAITING_EVENTS = "outbox_relay_schema_registry_waiting_events",
        "Events waiting for a Schema Registry schema id (the registry unavailable, or one new schema being registered); nothing after them is acknowledged.";
    describe_counter SCHEMA_REGISTRY_REQUESTS_TOTAL = "outbox_relay_schema_registry_requests_total",
        "Schema Registry requests (one per new subject and schema, and per retry), by outcome: ok, unavailable, refused, unauthorized.";
    describe_gauge BUILD_INFO = "outbox_relay_build_info",
        "Always 1; the version label names the build.";
    describe_gauge SHARD_INFO = "outbox_relay_shard_info",
        "Always 1; shard and shards label --shard I/K (0 and 1 unsharded), slot the slot streamed.";
}

/// Buckets of [`COMMIT_TO_ACK_SECONDS`]: 0.5 ms to 60 s, fine below 25 ms
/// where a healthy relay's latencies fall.
const COMMIT_TO_ACK_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the Prometheus recorder globally (once; later calls return the
/// same handle), describes every metric and sets [`BUILD_INFO`]. If another
/// recorder came first, the handle renders only the descriptions.
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

/// The recorder's settings: [`COMMIT_TO_ACK_SECONDS`]'s buckets.
pub(super) fn builder() -> PrometheusBuilder {
    let matcher = Matcher::Full(COMMIT_TO_ACK_SECONDS.to_owned());
    // Only an empty bucket list is refused, and ours is a non-empty constant.
    let builder = PrometheusBuilder::new().set_buckets_for_metric(matcher, COMMIT_TO_ACK_BUCKETS);
    builder.unwrap_or_else(|_| PrometheusBuilder::new())
}

/// Sets [`SHARD_INFO`]: which share of the outbox this relay streams, from which slot.
pub fn set_shard(shard: Option<Shard>, slot: &str) {
    let (index, count) = shard.map_or((0, 1), |s| (s.index, s.count));
    let labels = [
        ("shard", index.to_string()),
        ("shards", count.to_string()),
        ("slot", slot.to_owned()),
    ];
    gauge!(SHARD_INFO, &labels).set(1.0);
}

/// What the slot poller saw. A missing slot sets every `wal_status` gauge to
/// 0; an unknown one changes nothing.
pub fn set_slot(observation: &SlotObservation) {
    let slot = match observation {
        SlotObservation::Unknown => return,
        SlotObservation::Missing => None,
        SlotObservation::Seen(slot) => Some(slot),
    };
    for (status, name) in WalStatus::KNOWN {
        let current = slot.is_some_and(|s| s.wal_status == status);
        gauge!(SLOT_WAL_STATUS, "wal_status" => name).set(f64::from(current));
    }
    let Some(slot) = slot else { return };
    if let Some(lag) = slot.lag_bytes {
        gauge!(SLOT_LAG_BYTES).set(lag as f64);
    }
    // NaN: unlimited (`max_slot_wal_keep_size = -1`).
    gauge!(SLOT_SAFE_WAL_SIZE_BYTES).set(slot.safe_wal_size_bytes.map_or(f64::NAN, |s| s as f64));
    gauge!(SLOT_FAILOVER).set(f64::from(slot.failover == Some(true)));
    if let Some(ready) = slot.failover_ready {
        gauge!(SLOT_FAILOVER_READY).set(f64::from(ready));
    }
    let standby_slots = slot.synchronized_standby_slots_set == Some(true);
    gauge!(SYNCHRONIZED_STANDBY_SLOTS_SET).set(f64::from(standby_slots));
    gauge!(SLOT_INVALIDATED).set(f64::from(slot.invalidated().is_some()));
    gauge!(SLOT_IDLE_TIMEOUT_SECONDS).set(slot.idle_timeout_secs.unwrap_or(0) as f64);
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
            CLEANUP_KEPT_ROWS_TOTAL,
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
    fn rare_events_and_the_slot_render_under_their_names() {
        let recorder = builder().build_recorder();
        let handle = recorder.handle();
        ::metrics::with_local_recorder(&recorder, || {
            set_slot(&SlotObservation::Seen(
                crate::observability::health::SlotStatus {
                    lag_bytes: Some(1234),
                    wal_status: WalStatus::Extended,
                    safe_wal_size_bytes: Some(4096),
                    failover: Some(true),
                    synchronized_standby_slots_set: Some(false),
                    failover_ready: Some(false),
                    ..Default::default()
                },
            ));
            ::metrics::counter!(DEAD_LETTERED_TOTAL).increment(1);
            ::metrics::counter!(RECONNECTS_TOTAL).increment(1);
            ::metrics::counter!(CLEANUP_DELETED_ROWS_TOTAL).increment(3);
            gauge!(BUILD_INFO, "version" => "1.2.3").set(1.0);
            set_shard(Some(Shard { index: 2, count: 4 }), "s_shard_2_of_4");
        });
        let text = handle.render();
        for line in [
            "outbox_relay_slot_lag_bytes 1234",
            "outbox_relay_slot_wal_status{wal_status=\"extended\"} 1",
            "outbox_relay_slot_wal_status{wal_status=\"reserved\"} 0",
            "outbox_relay_slot_safe_wal_size_bytes 4096",
            "outbox_relay_slot_failover 1",
            "outbox_relay_slot_failover_ready 0",
            "outbox_relay_synchronized_standby_slots_set 0",
            "outbox_relay_dead_lettered_total 1",
            "outbox_relay_reconnects_total 1",
            "outbox_relay_cleanup_deleted_rows_total 3",
            "outbox_relay_build_info{version=\"1.2.3\"} 1",
            "outbox_relay_shard_info{shard=\"2\",shards=\"4\",slot=\"s_shard_2_of_4\"} 1",
        ] {
            assert!(text.contains(line), "missing {line:?} in:\n{text}");
        }
    }

    #[test]
    fn install_is_idempotent() {
        let a = install();
        let b = install();
        assert!(a.render().contains(BUILD_INFO));
        assert_eq!(a.render(), b.render());
    }
}
