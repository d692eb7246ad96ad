//! Readiness: the shared [`Health`] state, and the PURE rules ([`evaluate`]) that turn a
//! snapshot of it into `/readyz`'s answer. Slot risks the relay cannot fix itself are warnings
//! with the remedy; a slot it cannot stream from is a reason.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;

use crate::lsn::Lsn;
use crate::remedy;

/// Limits of readiness: `/readyz` fails (or warns) beyond them (`--ready-max-slot-lag-bytes`,
/// `--ready-max-ack-staleness`, `--slot-min-safe-wal-size`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadinessThresholds {
    /// Readiness fails when the slot keeps more WAL than this (bytes).
    pub max_slot_lag_bytes: u64,
    /// Readiness fails when the oldest unacknowledged event was handed to Kafka longer ago.
    pub max_ack_staleness: Duration,
    /// A warning when the slot's `safe_wal_size` falls below this (bytes).
    pub min_safe_wal_size: u64,
}

impl Default for ReadinessThresholds {
    /// The flags' defaults.
    fn default() -> Self {
        ReadinessThresholds {
            max_slot_lag_bytes: 1 << 30,
            max_ack_staleness: Duration::from_secs(60),
            min_safe_wal_size: 1 << 30,
        }
    }
}

/// `pg_replication_slots.wal_status`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WalStatus {
    /// WAL is within `max_wal_size`.
    Reserved,
    /// Past `max_wal_size` but kept by the slot (or `wal_keep_size`).
    Extended,
    /// The slot no longer reserves its WAL: it will be lost at the next checkpoint.
    Unreserved,
    /// WAL the slot needs is gone; the slot is unusable.
    Lost,
    /// NULL or a value this build does not know.
    #[default]
    Unknown,
}

impl WalStatus {
    /// The values `pg_replication_slots` reports, as it spells them.
    pub(crate) const KNOWN: [(WalStatus, &'static str); 4] = [
        (WalStatus::Reserved, "reserved"),
        (WalStatus::Extended, "extended"),
        (WalStatus::Unreserved, "unreserved"),
        (WalStatus::Lost, "lost"),
    ];

    /// Parses the catalog's text (`None` for SQL NULL).
    pub fn parse(text: Option<&str>) -> Self {
        let known = Self::KNOWN.iter().find(|(_, name)| Some(*name) == text);
        known.map_or(WalStatus::Unknown, |(status, _)| *status)
    }

    /// The catalog's spelling.
    pub fn as_str(self) -> &'static str {
        let known = Self::KNOWN.iter().find(|(status, _)| *status == self);
        known.map_or("unknown", |(_, name)| name)
    }
}

/// One poll of the slot.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SlotStatus {
    /// `pg_current_wal_lsn() - confirmed_flush_lsn`; `None` without a confirmed position.
    pub lag_bytes: Option<u64>,
    /// `wal_status`.
    pub wal_status: WalStatus,
    /// `safe_wal_size`; `None` when unlimited (`max_slot_wal_keep_size = -1`) or lost.
    pub safe_wal_size_bytes: Option<i64>,
    /// Whether the slot is marked for failover (`None` before PostgreSQL 17).
    pub failover: Option<bool>,
    /// Whether `synchronized_standby_slots` is set (`None` before PostgreSQL 17).
    pub synchronized_standby_slots_set: Option<bool>,
    /// `invalidation_reason` (PostgreSQL 17+): why the slot can no longer stream.
    pub invalidation_reason: Option<String>,
    /// `conflicting` (PostgreSQL 16+): invalidated by a recovery conflict.
    pub conflicting: Option<bool>,
    /// `inactive_since` (PostgreSQL 17+): when the slot was last released.
    pub inactive_since: Option<String>,
    /// `idle_replication_slot_timeout` in seconds (PostgreSQL 18+; 0 is off).
    pub idle_timeout_secs: Option<u64>,
    /// For a failover slot: whether every standby `--postgres-url` names holds a persistent
    /// synchronized copy (`None`: not a failover slot, or no standby named).
    pub failover_ready: Option<bool>,
    /// What each standby lacks while not ready (`host:port: ...`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub failover_lacking: Vec<String>,
}

impl SlotStatus {
    /// Why the slot can no longer stream, when the server says it cannot.
    pub fn invalidated(&self) -> Option<String> {
        match (&self.invalidation_reason, self.conflicting) {
            (Some(reason), _) => Some(reason.clone()),
            (None, Some(true)) => Some("conflict with recovery".to_owned()),
            _ => None,
        }
    }
}

/// What is known about the slot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum SlotObservation {
    /// Not polled yet, or polling fails: readiness does not judge the slot.
    #[default]
    Unknown,
    /// The slot does not exist.
    Missing,
    /// The last poll.
    Seen(SlotStatus),
}

/// The state readiness is judged on, at one instant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthSnapshot {
    /// While start-up has not finished: what it does or waits for.
    pub starting: Option<String>,
    /// The replication stream is running.
    pub streaming: bool,
    /// The producer has a connection to a broker.
    pub producer_connected: bool,
    /// Since the oldest unacknowledged event was handed to the producer; zero when none.
    pub ack_staleness: Duration,
    /// The slot.
    pub slot: SlotObservation,
    /// `--cleanup delete`'s backlog.
    pub cleanup: CleanupBacklog,
    /// Since the first row a delete left in place waits; zero when none.
    pub cleanup_held_for: Duration,
    /// The AWS credentials IAM tokens are signed with; `None` without AWS IAM.
    pub credentials: Option<CredentialHealth>,
    /// The wall clock, which credentials expire by.
    pub wall_clock: SystemTime,
    /// Why events wait for the Schema Registry, while they do.
    pub schema_registry: Option<String>,
}

/// The AWS credentials the relay signs its IAM tokens with (`--kafka-auth aws-msk-iam`,
/// `--postgres-auth aws-rds-iam`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CredentialHealth {
    /// When the credentials in use expire; `None` when they do not (access keys).
    pub expires: Option<SystemTime>,
    /// How fetching them again fails; `None` once a fetch worked.
    pub failing: Option<FetchFailure>,
}

/// Fetching AWS credentials fails.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchFailure {
    /// Since the first failure in a row.
    pub since: SystemTime,
    /// The last failure's error.
    pub why: String,
}

impl CredentialHealth {
    /// PURE: a readiness reason once the credentials expired while fetching fails (no new
    /// connection can log in), a warning while fetching fails before they expire.
    fn judge(&self, now: SystemTime) -> (Option<String>, Option<String>) {
        let Some(failure) = &self.failing else {
            return (None, None);
        };
        let since = humantime::format_rfc3339_seconds(failure.since);
        let why = &failure.why;
        let failing = format!("fetching AWS credentials fails since {since} ({why})");
        let fix = "Fix the credentials the chain reads (docs/operations.md, AWS IAM)";
        let Some(expires) = self.expires else {
            return (None, Some(format!("{failing}. {fix}")));
        };
        let at = humantime::format_rfc3339_seconds(expires);
        if expires <= now {
            let reason = format!(
                "{failing}, and those in use expired at {at}: no IAM token can be signed, so no \
                 new Kafka or Postgres connection can log in (deliveries wait, nothing past them \
                 is acknowledged; the relay keeps retrying). {fix}"
            );
            return (Some(reason), None);
        }
        let warning = format!(
            "{failing}; those in use expire at {at}, after which no new Kafka or Postgres \
             connection can log in. {fix}"
        );
        (None, Some(warning))
    }
}

/// `--cleanup delete`'s backlog, as the pipeline last published it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CleanupBacklog {
    /// Rows from the oldest one not yet deleted on.
    pub rows: usize,
    /// Reading is paused: `rows` reached the limit.
    pub full: bool,
    /// Rows a delete left in place, to be tried again.
    pub held: usize,
    /// When the first of them was left in place.
    pub held_since: Option<Instant>,
    /// Whether the last delete failed (else the held rows are locked by another session).
    pub failing: bool,
}

impl CleanupBacklog {
    /// Why rows are left in place.
    fn why_held(&self) -> &'static str {
        match self.failing {
            true => "the deletes fail (the log says why, under \"--cleanup delete\")",
            false => {
                "another session holds them (an open transaction that locked, updated or \
                 deleted them: find it in pg_locks and pg_stat_activity and end it)"
            }
        }
    }
}

/// `/readyz`'s answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Readiness {
    /// Whether every readiness condition holds.
    pub ready: bool,
    /// Why not (empty when ready).
    pub reasons: Vec<String>,
    /// What the operator should look at even though the relay is ready.
    pub warnings: Vec<String>,
}

/// How to recover from a slot that cannot stream.
/// PURE: the readiness rules.
pub fn evaluate(state: &HealthSnapshot, limits: &ReadinessThresholds) -> Readiness {
    let mut reasons = Vec::new();
    reasons.extend(state.starting.clone());
    if !state.streaming {
        reasons.push(
            "not streaming: the replication stream is starting, stopping or failed (see the log)"
                .to_owned(),
        );
    }
    if !state.producer_connected {
        reasons.push(
            "the Kafka producer is not connected to any broker: check --kafka-brokers, the \
             network and the brokers (librdkafka's log names the failing one)"
                .to_owned(),
        );
    }
    if state.ack_staleness > limits.max_ack_staleness {
        reasons.push(format!(
            "deliveries are stuck: the oldest unacknowledged event was handed to Kafka {}s ago \
             (limit --ready-max-ack-staleness {}s); check the brokers, topic ACLs and the log",
            state.ack_staleness.as_secs(),
            limits.max_ack_staleness.as_secs()
        ));
    }
    let cleanup = &state.cleanup;
    if cleanup.full {
        reasons.push(format!(
            "--cleanup delete: {} outbox rows from the oldest one not yet deleted on, the limit \
             (--max-in-flight-events): reading the WAL is paused until it is deleted; {} rows \
             are left in place: {}",
            cleanup.rows,
            cleanup.held,
            cleanup.why_held()
        ));
    }
    if cleanup.held > 0 && state.cleanup_held_for > limits.max_ack_staleness {
        reasons.push(format!(
            "--cleanup delete: {} outbox rows could not be deleted for {}s (limit \
             --ready-max-ack-staleness {}s): {}. The slot's confirmed position stays before \
             their transactions, so Postgres keeps the WAL from there",
            cleanup.held,
            state.cleanup_held_for.as_secs(),
            limits.max_ack_staleness.as_secs(),
            cleanup.why_held()
        ));
    }
    if let Some(why) = &state.schema_registry {
        reasons.push(format!(
            "{why}; nothing after them is acknowledged until the registry answers (check \
             --schema-registry-url and the registry)"
        ));
    }
    let mut warnings = Vec::new();
    if let Some(credentials) = &state.credentials {
        let (reason, warning) = credentials.judge(state.wall_clock);
        reasons.extend(reason);
        warnings.extend(warning);
    }
    match &state.slot {
        SlotObservation::Unknown => {}
        SlotObservation::Missing => reasons.push(format!(
            "the replication slot does not exist (dropped, or lost in a failover): events \
             committed since the last ack may be unrelayed. {}",
            remedy::LOST_SLOT
        )),
        SlotObservation::Seen(slot) => {
            if let Some(lag) = slot.lag_bytes
                && lag > limits.max_slot_lag_bytes
            {
                reasons.push(format!(
                    "the slot is {lag} bytes behind the server's WAL (limit \
                     --ready-max-slot-lag-bytes {}): the relay lags or deliveries are stuck",
                    limits.max_slot_lag_bytes
                ));
            }
            if let Some(reason) = slot.invalidated() {
                reasons.push(remedy::invalidated_slot(&reason));
            } else if slot.wal_status == WalStatus::Lost {
                reasons.push(remedy::wal_lost());
            }
            reasons.extend(failover_unready(slot));
            warnings.extend(slot_warnings(slot, limits));
            warnings.extend(idle_timeout_warning(slot.idle_timeout_secs.unwrap_or(0)));
        }
    }
    Readiness {
        ready: reasons.is_empty(),
        reasons,
        warnings,
    }
}

/// PURE: why a failover slot is not ready for a promotion yet, while it is not.
pub fn failover_unready(slot: &SlotStatus) -> Option<String> {
    (slot.failover_ready == Some(false)).then(|| {
        format!(
            "the failover slot is not ready on every standby ({}): a promotion now would lose it. \
             A standby's copy becomes usable once persistent (synced and not temporary in its \
             pg_replication_slots), seconds after the relay created or marked the slot; if it \
             stays not ready, check sync_replication_slots = on, hot_standby_feedback = on and \
             dbname in primary_conninfo on the standby",
            slot.failover_lacking.join("; ")
        )
    })
}

/// PURE: warnings about the slot's WAL retention and failover, each with the remedy.
pub fn slot_warnings(slot: &SlotStatus, limits: &ReadinessThresholds) -> Vec<String> {
    let mut warnings = Vec::new();
    match slot.wal_status {
        WalStatus::Extended => warnings.push(
            "the slot's wal_status is 'extended': it keeps more WAL than max_wal_size. Make the \
             relay catch up before it reaches max_slot_wal_keep_size, or raise that"
                .to_owned(),
        ),
        WalStatus::Unreserved => warnings.push(
            "the slot's wal_status is 'unreserved': the next checkpoint removes WAL it needs and \
             the slot is lost. Raise max_slot_wal_keep_size now (ALTER SYSTEM SET ...; SELECT \
             pg_reload_conf();) and fix what holds the relay back"
                .to_owned(),
        ),
        WalStatus::Lost => warnings.push(remedy::wal_lost()),
        WalStatus::Reserved | WalStatus::Unknown => {}
    }
    if slot.failover == Some(true) && slot.synchronized_standby_slots_set == Some(false) {
        warnings.push(
            "the slot is marked for failover but synchronized_standby_slots is empty: a failover \
             may lose transactions the relay already published. Set it to the standbys' slots"
                .to_owned(),
        );
    }
    if let Some(safe) = slot.safe_wal_size_bytes
        && slot.wal_status != WalStatus::Lost
        && safe < i64::try_from(limits.min_safe_wal_size).unwrap_or(i64::MAX)
    {
        warnings.push(format!(
            "only {safe} bytes of WAL can still be written before the slot is invalidated \
             (safe_wal_size, below --slot-min-safe-wal-size {}): make the relay catch up or \
             raise max_slot_wal_keep_size",
            limits.min_safe_wal_size
        ));
    }
    warnings
}

/// PURE: the warning for an `idle_replication_slot_timeout` (in seconds) that is set.
pub fn idle_timeout_warning(secs: u64) -> Option<String> {
    let timeout = humantime::format_duration(Duration::from_secs(secs));
    (secs > 0).then(|| {
        format!(
            "idle_replication_slot_timeout is {timeout}: a relay stopped longer loses its slot \
             (invalidation_reason idle_timeout) and the events committed meanwhile. Keep \
             restarts shorter, or set it to 0"
        )
    })
}

/// The pipeline's progress, for the summary line and `/readyz`'s ack staleness.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// Events acknowledged since start.
    pub events_acked: u64,
    /// Events in flight.
    pub in_flight_events: u64,
    /// When the oldest unacknowledged event was handed to the producer.
    pub oldest_in_flight: Option<Instant>,
    /// Furthest position received.
    pub received: Lsn,
    /// Ack frontier.
    pub frontier: Lsn,
    /// `--cleanup delete`'s backlog.
    pub cleanup: CleanupBacklog,
}

/// The relay's one readiness and progress state, shared by the HTTP server, the producer, the
/// pipeline and the slot poller.
#[derive(Debug, Default)]
pub struct Health {
    thresholds: ReadinessThresholds,
    starting: Mutex<Option<String>>,
    streaming: AtomicBool,
    producer_connected: AtomicBool,
    progress: Mutex<Progress>,
    slot: Mutex<SlotObservation>,
    credentials: Mutex<Option<CredentialHealth>>,
    schema_registry: Mutex<Option<String>>,
}

/// A poisoned lock still holds a consistent value: every write is one assignment.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Health {
    /// Nothing running yet: not ready.
    pub fn new(thresholds: ReadinessThresholds) -> Self {
        Health {
            thresholds,
            ..Health::default()
        }
    }

    /// The limits in force.
    pub fn thresholds(&self) -> ReadinessThresholds {
        self.thresholds
    }

    /// What start-up does or waits for (`None` once it finished, or failed).
    pub fn set_starting(&self, starting: Option<String>) {
        *lock(&self.starting) = starting;
    }

    /// The replication stream started (true) or stopped (false).
    pub fn set_streaming(&self, streaming: bool) {
        self.streaming.store(streaming, Relaxed);
    }

    /// Whether the producer reaches a broker: librdkafka's `AllBrokersDown` clears it
    /// and each delivery sets it, so it holds with `-X statistics.interval.ms=0` too.
    pub fn set_producer_connected(&self, connected: bool) {
        self.producer_connected.store(connected, Relaxed);
    }

    /// The slot poller's finding, including "missing" and "unknown".
    pub fn set_slot_observation(&self, observation: SlotObservation) {
        *lock(&self.slot) = observation;
    }

    /// How the AWS credentials are (with AWS IAM only).
    pub fn set_credentials(&self, credentials: CredentialHealth) {
        *lock(&self.credentials) = Some(credentials);
    }

    /// Why events wait for the Schema Registry; `None` once they do not.
    pub fn set_schema_registry(&self, waiting: Option<String>) {
        *lock(&self.schema_registry) = waiting;
    }

    /// The pipeline's progress now.
    pub fn set_progress(&self, progress: Progress) {
        *lock(&self.progress) = progress;
    }

    /// The pipeline's last reported progress.
    pub fn progress(&self) -> Progress {
        *lock(&self.progress)
    }

    /// The last slot observation.
    pub fn slot(&self) -> SlotObservation {
        lock(&self.slot).clone()
    }

    /// The state at `now`.
    pub fn snapshot(&self, now: Instant) -> HealthSnapshot {
        let progress = self.progress();
        let since =
            |t: Option<Instant>| t.map_or(Duration::ZERO, |t| now.saturating_duration_since(t));
        HealthSnapshot {
            starting: lock(&self.starting).clone(),
            streaming: self.streaming.load(Relaxed),
            producer_connected: self.producer_connected.load(Relaxed),
            ack_staleness: since(progress.oldest_in_flight),
            slot: self.slot(),
            cleanup: progress.cleanup,
            cleanup_held_for: since(progress.cleanup.held_since),
            credentials: lock(&self.credentials).clone(),
            wall_clock: SystemTime::now(),
            schema_registry: lock(&self.schema_registry).clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn good() -> HealthSnapshot {
        HealthSnapshot {
            starting: None,
            streaming: true,
            producer_connected: true,
            ack_staleness: Duration::ZERO,
            slot: SlotObservation::Seen(SlotStatus {
                lag_bytes: Some(1000),
                wal_status: WalStatus::Reserved,
                safe_wal_size_bytes: None,
                failover: None,
                synchronized_standby_slots_set: None,
                ..SlotStatus::default()
            }),
            cleanup: CleanupBacklog::default(),
            cleanup_held_for: Duration::ZERO,
            credentials: None,
            wall_clock: SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000),
            schema_registry: None,
        }
    }

    fn slot(lag: u64, status: WalStatus, safe: Option<i64>) -> SlotObservation {
        SlotObservation::Seen(SlotStatus {
            lag_bytes: Some(lag),
            wal_status: status,
            safe_wal_size_bytes: safe,
            failover: None,
            synchronized_standby_slots_set: None,
            ..SlotStatus::default()
        })
    }

    #[test]
    fn newer_servers_slot_facts_reach_readiness() {
        let mut state = good();
        let SlotObservation::Seen(slot) = &mut state.slot else {
            unreachable!()
        };
        slot.idle_timeout_secs = Some(86_400);
        let r = evaluate(&state, &ReadinessThresholds::default());
        assert!(r.ready, "{r:?}");
        assert!(
            r.warnings[0].contains("idle_replication_slot_timeout is 1day"),
            "{r:?}"
        );
        // PostgreSQL 16 says only `conflicting`; 17 also names the reason.
        for (reason, conflicting, named) in [
            (None, Some(true), "conflict with recovery"),
            (Some("idle_timeout"), Some(false), "idle_timeout"),
        ] {
            let SlotObservation::Seen(slot) = &mut state.slot else {
                unreachable!()
            };
            slot.invalidation_reason = reason.map(str::to_owned);
            slot.conflicting = conflicting;
            let r = evaluate(&state, &ReadinessThresholds::default());
            assert!(!r.ready);
            assert!(
                r.reasons[0].contains(&format!("invalidated ({named})")),
                "{r:?}"
            );
        }
    }

    #[test]
    fn a_failover_slot_without_a_persistent_standby_copy_is_not_ready() {
        let mut state = good();
        let SlotObservation::Seen(slot) = &mut state.slot else {
            unreachable!()
        };
        slot.failover_ready = Some(false);
        slot.failover_lacking = vec!["127.0.0.1:5433: no synchronized copy yet".into()];
        let r = evaluate(&state, &ReadinessThresholds::default());
        assert!(!r.ready);
        assert!(
            r.reasons[0].contains("127.0.0.1:5433: no synchronized copy yet"),
            "{r:?}"
        );
        assert!(
            r.reasons[0].contains("sync_replication_slots = on"),
            "{r:?}"
        );
        for ready in [Some(true), None] {
            let SlotObservation::Seen(slot) = &mut state.slot else {
                unreachable!()
            };
            slot.failover_ready = ready;
            assert!(evaluate(&state, &ReadinessThresholds::default()).ready);
        }
    }

    #[test]
    fn invalidation_remedies_name_the_cause_and_the_settings_that_prevent_it() {
        let rows = remedy::invalidated_slot("rows_removed");
        assert!(rows.contains("invalidation_reason rows_removed"), "{rows}");
        assert!(
            rows.contains("hot_standby_feedback = on on the standby"),
            "{rows}"
        );
        assert!(rows.contains("primary_slot_name"), "{rows}");
        let level = remedy::invalidated_slot("wal_level_insufficient");
        assert!(
            level.contains("wal_level = logical on the primary"),
            "{level}"
        );
        let pg16 = remedy::invalidated_slot("conflict with recovery");
        for part in [
            "conflicting = true",
            "hot_standby_feedback",
            "wal_level = logical",
        ] {
            assert!(pg16.contains(part), "{pg16}");
        }
        assert!(pg16.contains("outbox-relay backfill --since"), "{pg16}");
    }

    #[test]
    fn healthy_state_is_ready_without_warnings() {
        let r = evaluate(&good(), &ReadinessThresholds::default());
        assert_eq!(
            r,
            Readiness {
                ready: true,
                reasons: vec![],
                warnings: vec![]
            }
        );
        // An unpolled slot does not block readiness.
        let state = HealthSnapshot {
            slot: SlotObservation::Unknown,
            ..good()
        };
        assert!(evaluate(&state, &ReadinessThresholds::default()).ready);
    }

    #[test]
    fn each_failed_condition_is_a_reason() {
        let limits = ReadinessThresholds::default();
        let cases: Vec<(HealthSnapshot, &str)> = vec![
            (
                HealthSnapshot {
                    streaming: false,
                    ..good()
                },
                "not streaming",
            ),
            (
                HealthSnapshot {
                    producer_connected: false,
                    ..good()
                },
                "not connected to any broker",
            ),
            (
                HealthSnapshot {
                    starting: Some("starting: start-up waits: Postgres at u".into()),
                    ..good()
                },
                "start-up waits: Postgres at u",
            ),
            (
                HealthSnapshot {
                    ack_staleness: Duration::from_secs(61),
                    ..good()
                },
                "deliveries are stuck",
            ),
            (
                HealthSnapshot {
                    slot: slot((1 << 30) + 1, WalStatus::Reserved, None),
                    ..good()
                },
                "bytes behind",
            ),
            (
                HealthSnapshot {
                    slot: slot(0, WalStatus::Lost, None),
                    ..good()
                },
                "'lost'",
            ),
            (
                HealthSnapshot {
                    slot: SlotObservation::Missing,
                    ..good()
                },
                "does not exist",
            ),
            (
                HealthSnapshot {
                    cleanup: CleanupBacklog {
                        rows: 20,
                        full: true,
                        held: 1,
                        ..CleanupBacklog::default()
                    },
                    ..good()
                },
                "reading the WAL is paused",
            ),
            (
                HealthSnapshot {
                    cleanup: CleanupBacklog {
                        held: 1,
                        failing: true,
                        ..CleanupBacklog::default()
                    },
                    cleanup_held_for: Duration::from_secs(61),
                    ..good()
                },
                "the deletes fail",
            ),
        ];
        for (state, needle) in cases {
            let r = evaluate(&state, &limits);
            assert!(!r.ready, "{state:?}");
            assert_eq!(r.reasons.len(), 1, "{r:?}");
            assert!(r.reasons[0].contains(needle), "{r:?}");
        }
        let all_bad = HealthSnapshot {
            starting: Some("starting: start-up waits: Kafka at k:9092 does not answer".into()),
            streaming: false,
            producer_connected: false,
            ack_staleness: Duration::from_secs(3600),
            slot: slot(u64::MAX, WalStatus::Lost, None),
            cleanup: CleanupBacklog {
                full: true,
                held: 1,
                ..CleanupBacklog::default()
            },
            cleanup_held_for: Duration::from_secs(3600),
            credentials: Some(CredentialHealth {
                expires: Some(SystemTime::UNIX_EPOCH),
                failing: Some(FetchFailure {
                    since: SystemTime::UNIX_EPOCH,
                    why: "STS unreachable".to_owned(),
                }),
            }),
            wall_clock: SystemTime::UNIX_EPOCH + Duration::from_secs(60),
            schema_registry: Some("events wait for the Schema Registry".into()),
        };
        let reasons = evaluate(&all_bad, &limits).reasons;
        assert_eq!(reasons.len(), 10, "{reasons:?}");
        // What start-up waits for comes first.
        assert!(reasons[0].contains("Kafka at k:9092"), "{reasons:?}");
        // Rows held back for less than the limit are not yet a reason.
        let held = HealthSnapshot {
            cleanup: CleanupBacklog {
                held: 1,
                ..CleanupBacklog::default()
            },
            cleanup_held_for: Duration::from_secs(60),
            ..good()
        };
        assert!(evaluate(&held, &limits).ready);
    }

    #[test]
    fn failing_aws_credentials_warn_and_are_a_reason_once_expired() {
        let now = good().wall_clock;
        let minute = Duration::from_secs(60);
        let failing = Some(FetchFailure {
            since: now - minute,
            why: "STS: AccessDenied".to_owned(),
        });
        // (expires, failing, a reason, a warning): one row per case.
        let cases = [
            (Some(now + minute), None, false, false),
            (None, failing.clone(), false, true),
            (Some(now + minute), failing.clone(), false, true),
            (Some(now), failing.clone(), true, false),
            (Some(now - minute), failing.clone(), true, false),
            // Expired but fetched again since: nothing to say.
            (Some(now - minute), None, false, false),
        ];
        for (expires, failing, reason, warning) in cases {
            let credentials = Some(CredentialHealth {
                expires,
                failing: failing.clone(),
            });
            let state = HealthSnapshot {
                credentials,
                ..good()
            };
            let r = evaluate(&state, &ReadinessThresholds::default());
            let case = format!("{expires:?} {failing:?}: {r:?}");
            assert_eq!(!r.ready, reason, "{case}");
            assert_eq!(r.warnings.len(), usize::from(warning), "{case}");
            for text in r.reasons.iter().chain(&r.warnings) {
                assert!(text.contains("STS: AccessDenied"), "{case}");
                assert!(text.contains("docs/operations.md"), "{case}");
            }
        }
    }

    #[test]
    fn limits_are_exclusive_and_configurable() {
        let limits = ReadinessThresholds {
            max_slot_lag_bytes: 100,
            max_ack_staleness: Duration::from_secs(2),
            min_safe_wal_size: 10,
        };
        let at_limit = HealthSnapshot {
            ack_staleness: Duration::from_secs(2),
            slot: slot(100, WalStatus::Reserved, Some(10)),
            ..good()
        };
        let r = evaluate(&at_limit, &limits);
        assert!(r.ready && r.warnings.is_empty(), "{r:?}");
        let over = HealthSnapshot {
            ack_staleness: Duration::from_millis(2001),
            slot: slot(101, WalStatus::Reserved, Some(9)),
            ..good()
        };
        let r = evaluate(&over, &limits);
        assert_eq!(r.reasons.len(), 2, "{r:?}");
        assert!(
            r.reasons[0].contains("--ready-max-ack-staleness 2s"),
            "{r:?}"
        );
        assert!(
            r.reasons[1].contains("--ready-max-slot-lag-bytes 100"),
            "{r:?}"
        );
        assert_eq!(r.warnings.len(), 1);
        assert!(r.warnings[0].contains("safe_wal_size"), "{r:?}");
    }

    #[test]
    fn wal_retention_problems_warn_with_a_remedy_but_stay_ready() {
        let limits = ReadinessThresholds::default();
        for (status, needle) in [
            (WalStatus::Extended, "'extended'"),
            (WalStatus::Unreserved, "'unreserved'"),
        ] {
            let state = HealthSnapshot {
                slot: slot(0, status, None),
                ..good()
            };
            let r = evaluate(&state, &limits);
            assert!(r.ready, "{r:?}");
            assert_eq!(r.warnings.len(), 1, "{r:?}");
            assert!(r.warnings[0].contains(needle), "{r:?}");
            assert!(r.warnings[0].contains("max_slot_wal_keep_size"), "{r:?}");
        }
        let low = HealthSnapshot {
            slot: slot(0, WalStatus::Reserved, Some(1024)),
            ..good()
        };
        let r = evaluate(&low, &limits);
        assert!(r.ready);
        assert!(r.warnings[0].contains("only 1024 bytes"), "{r:?}");
    }

    #[test]
    fn staleness_is_measured_from_the_oldest_in_flight_event() {
        let health = Health::new(ReadinessThresholds::default());
        let t0 = Instant::now();
        assert_eq!(health.snapshot(t0).ack_staleness, Duration::ZERO);
        let progress = Progress {
            oldest_in_flight: Some(t0),
            ..Progress::default()
        };
        health.set_progress(progress);
        let later = t0 + Duration::from_secs(5);
        let staleness = health.snapshot(later).ack_staleness;
        assert!(
            staleness >= Duration::from_secs(5) && staleness < Duration::from_millis(5001),
            "{staleness:?}"
        );
        health.set_progress(Progress::default());
        assert_eq!(health.snapshot(later).ack_staleness, Duration::ZERO);
    }

    #[test]
    fn wal_status_round_trips() {
        for s in ["reserved", "extended", "unreserved", "lost"] {
            assert_eq!(WalStatus::parse(Some(s)).as_str(), s);
        }
        assert_eq!(WalStatus::parse(None), WalStatus::Unknown);
    }
}
