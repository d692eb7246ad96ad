//! Ordering and acknowledgement: the only code that moves the slot.
//!
//! # Invariants
//! 1. Every committed transaction enters the [`AckTracker`] in commit order,
//!    even one with no outbox rows; the frontier is the end LSN of the longest
//!    fully delivered prefix, and only the frontier is reported to Postgres.
//! 2. A keepalive's position is acknowledged only when nothing is in flight
//!    and no transaction is open; otherwise an idle outbox would pin WAL.
//! 3. Backpressure is a chain: when the in-flight caps are reached the
//!    pipeline stops reading the stream, pgwire-replication's bounded channel
//!    fills, and TCP flow control slows the walsender. Memory stays bounded
//!    however large one transaction is; the channel's read-ahead (two rows)
//!    is reserved out of the byte cap.
//! 4. A delivery that fails for good is never acknowledged: the relay stops,
//!    and a restart replays from the confirmed position (at-least-once).
//! 5. Under `--cleanup delete`, the outbox rows of the transactions a frontier
//!    covers are deleted before that frontier is reported (see [`cleanup`]).
//!
//! Records are enqueued to the producer in stream order, which for pgoutput
//! is commit order, so with the idempotent producer each partition receives
//! events in commit order, and so does each aggregate (one key, one partition).

pub mod ack;

mod exactly_once;
mod poison;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use pgwire_replication::ReplicationEvent;
use tokio::sync::mpsc;

use crate::config::Config;
use crate::lsn::Lsn;
use crate::observability::health::Health;
use crate::observability::observer::PipelineObserver;
use crate::outbox::{BindError, EventMapper, OutboxRecord, values};
use crate::pgoutput::{self, DecodeError, Message};
use crate::sink::{Delivery, Sink, SinkError};
use crate::source::cleanup::Cleanup;
use crate::source::setup::SlotState;
use crate::source::{PublicationCheck, Recovery, ServerId, Source, SourceError, Stream};
use ack::{AckError, AckTracker, Ticket};
use poison::Poison;

/// Process exit codes, distinct per failure class so a supervisor can tell
/// them apart.
pub mod exit_code {
    /// A flag, the environment or the producer configuration is invalid; fix the configuration.
    pub const CONFIG: u8 = 2;
    /// Postgres refused in a way a retry will not fix (unreachable at start-up,
    /// authentication, privileges, wal_level, missing table/column, slot or
    /// publication mismatch, dropped slot).
    pub const POSTGRES: u8 = 3;
    /// Kafka failed permanently (delivery timed out, producer fenced or unusable).
    pub const KAFKA: u8 = 4;
    /// An event cannot be delivered under `--on-poison fail` (or its table no
    /// longer fits the mapping).
    pub const POISON: u8 = 5;
    /// The dead-letter topic refused a dead-letter record for a reason about
    /// the record (under `--on-poison dead-letter`): dead-lettering it again
    /// would loop.
    pub const DEAD_LETTER: u8 = 6;
    /// The slot is missing where this relay streamed before (a failover to a
    /// server without it, or a dropped slot): events may have been skipped.
    /// Start once with `--allow-new-slot`, then run `outbox-relay backfill`.
    pub const SLOT_LOST: u8 = 7;
    /// The replication stream broke protocol rules (a bug: please report).
    pub const INTERNAL: u8 = 70;
}

/// Why the relay stopped.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// Postgres side.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// The slot was dropped while the relay was using it.
    #[error(
        "replication slot {slot:?} is missing on the server the relay (re)connected to: it was \
         dropped, or this server was promoted from a standby that did not have it (PostgreSQL 16 \
         or older, or a slot not synchronized with --slot-failover). The last acknowledged \
         position was {frontier}; events committed after it on the old server and before the \
         promotion were never relayed. No slot was created. Remedy: start the relay once with \
         --allow-new-slot (it creates a fresh slot and relays new events), then run \
         `outbox-relay backfill --since TIMESTAMP` with a time before the failover to re-publish \
         the rows the slot never saw (at-least-once: consumers may see duplicates)"
    )]
    SlotDropped {
        /// The slot.
        slot: String,
        /// The ack frontier at the time.
        frontier: Lsn,
    },
    /// librdkafka refused a record at enqueue time for a reason that is not the record's fault.
    #[error(
        "{source} (commit LSN {lsn}, table {table}); the slot was not moved past it. Check the \
         -X producer properties and the brokers, then restart: the relay resumes from the last \
         acknowledged transaction"
    )]
    Sink {
        /// Commit LSN of the event's transaction.
        lsn: Lsn,
        /// Outbox table.
        table: String,
        /// The refusal.
        #[source]
        source: SinkError,
    },
    /// The producer could not be created.
    #[error(transparent)]
    Producer(SinkError),
    /// The broker did not accept an event, for a reason that is not the event's fault.
    #[error(
        "delivery of event id {id} (commit LSN {lsn}) to topic {topic:?} failed: {error}. \
         The slot was not moved past it; fix the cause (brokers, ACLs, topic creation) and \
         restart: the relay resumes from the last acknowledged transaction"
    )]
    Delivery {
        /// Commit LSN of the event's transaction.
        lsn: Lsn,
        /// Event id.
        id: String,
        /// Topic.
        topic: String,
        /// librdkafka's error.
        error: rdkafka::error::KafkaError,
    },
    /// The outbox table's columns no longer fit the mapping.
    #[error("at commit LSN {lsn}: {source}. Nothing at or after this transaction was acknowledged")]
    Bind {
        /// Commit LSN of the transaction that announced the new layout.
        lsn: Lsn,
        /// The mismatch.
        #[source]
        source: BindError,
    },
    /// An event that can never be delivered, under `--on-poison fail`.
    #[error(
        "event id {id:?} from {table} (commit LSN {lsn}, topic {topic:?}) cannot be delivered: \
         {reason}. The slot was not moved past it, and a restart replays it: fix the cause (the \
         mapping flags, the producer's message.max.bytes, the topic), or divert such events with \
         --on-poison dead-letter --dead-letter-topic TOPIC; as a last resort, with the relay \
         stopped, advance the slot past this transaction with pg_replication_slot_advance (its \
         events are then lost)"
    )]
    Poison {
        /// Commit LSN.
        lsn: Lsn,
        /// Table.
        table: String,
        /// Event id (empty when NULL).
        id: String,
        /// Intended topic (empty when it could not be rendered).
        topic: String,
        /// What is wrong.
        reason: String,
    },
    /// A dead-letter record was refused for a reason about the record itself.
    #[error(
        "the dead-letter record for event id {id:?} (commit LSN {lsn}) was refused by topic \
         {topic:?}: {error}. It is not dead-lettered again (that would loop), and the slot was \
         not moved past it: fix the dead-letter topic (its max.message.bytes, its policy) or the \
         producer's -X properties, then restart"
    )]
    DeadLetter {
        /// Commit LSN of the event's transaction.
        lsn: Lsn,
        /// Event id.
        id: String,
        /// The dead-letter topic.
        topic: String,
        /// librdkafka's error.
        error: rdkafka::error::KafkaError,
    },
    /// Exactly-once delivery cannot be guaranteed.
    #[error(
        "at commit LSN {lsn}: {source}. Nothing past it was acknowledged; fix the topic, or \
         restart with --exactly-once-fallback at-least-once to accept possible duplicates"
    )]
    ExactlyOnce {
        /// Commit LSN of the event's transaction.
        lsn: Lsn,
        /// Why.
        #[source]
        source: crate::sink::exactly_once::TailError,
    },
    /// A WAL message did not decode.
    #[error("cannot decode the pgoutput message at WAL {lsn}: {source}")]
    Decode {
        /// Where.
        lsn: Lsn,
        /// What.
        #[source]
        source: DecodeError,
    },
    /// The stream violated transaction framing.
    #[error("replication stream out of order: {0}")]
    Protocol(#[from] AckError),
    /// The relay's publication sent an insert into a table it cannot map.
    #[error(
        "publication {publication:?} sent an insert into {table} (commit LSN {lsn}), which is \
         neither an outbox table (--table) nor a partition of one; nothing at or after this \
         transaction was acknowledged. Add the table with --table, or remove it with ALTER \
         PUBLICATION {publication} DROP TABLE {table};"
    )]
    UnmappedRelation {
        /// Commit LSN of the transaction.
        lsn: Lsn,
        /// The publication.
        publication: String,
        /// The table, as `schema.name`.
        table: String,
    },
}

impl RelayError {
    /// The process exit code for this failure.
    pub fn exit_code(&self) -> u8 {
        match self {
            RelayError::Producer(_)
            | RelayError::Source(SourceError::Tls(_))
            | RelayError::Source(SourceError::TlsHandshake { .. })
            | RelayError::Source(SourceError::ReplicationConnect { .. }) => exit_code::CONFIG,
            RelayError::Source(SourceError::Connect { source, .. })
                if source
                    .as_db_error()
                    .is_some_and(|db| db.code().code().starts_with("28")) =>
            {
                exit_code::CONFIG
            }
            RelayError::Source(SourceError::SlotLost { .. }) | RelayError::SlotDropped { .. } => {
                exit_code::SLOT_LOST
            }
            RelayError::Source(_) | RelayError::Decode { .. } => exit_code::POSTGRES,
            RelayError::Sink { .. }
            | RelayError::Delivery { .. }
            | RelayError::ExactlyOnce { .. } => exit_code::KAFKA,
            RelayError::Bind { .. } | RelayError::Poison { .. } => exit_code::POISON,
            RelayError::UnmappedRelation { .. } => exit_code::CONFIG,
            RelayError::DeadLetter { .. } => exit_code::DEAD_LETTER,
            RelayError::Protocol(_) => exit_code::INTERNAL,
        }
    }
}

/// What a clean shutdown reports.
#[derive(Debug, Clone)]
pub struct Summary {
    /// The final ack frontier (reported to Postgres).
    pub frontier: Lsn,
    /// Events the broker acknowledged this run (dead-lettered ones included).
    pub events_acked: u64,
    /// Events dead-lettered this run.
    pub dead_lettered: u64,
    /// Events still unacknowledged when the shutdown timeout ran out.
    pub abandoned: usize,
    /// Times the replication stream was re-established.
    pub reconnects: u64,
}

/// Sleeps until `at`; never resolves for `None` (a disabled `select!` branch).
async fn sleep_until_some(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The shared mapper plus what the relay tells the operator about ignored changes.
struct Outbox {
    mapper: EventMapper,
    /// UPDATE/DELETE messages on outbox tables, which are ignored.
    non_insert_changes: u64,
    warned_non_transactional: bool,
    /// `FOR ALL TABLES`: inserts into other tables are expected and skipped.
    all_tables: bool,
    /// Relations that are neither outbox tables nor partitions of one.
    foreign: HashMap<u32, String>,
}

type Shutdown = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The running relay: source, tracker and sink.
pub struct Pipeline<S: Source, K: Sink> {
    config: Config,
    source: S,
    stream: Option<S::Stream>,
    sink: Arc<K>,
    deliveries: mpsc::UnboundedReceiver<Delivery>,
    tracker: AckTracker,
    outbox: Outbox,
    shutdown: Shutdown,
    shutting_down: bool,
    /// When shutdown was requested plus `--shutdown-timeout`: the end of
    /// reading to the open transaction's commit and of the drain together.
    stop_by: Option<tokio::time::Instant>,
    reported: Lsn,
    /// The highest position that may be reported: the frontier as it stood
    /// before the last check that found the publication intact (PostgreSQL 18
    /// decodes on without a dropped publication, skipping its rows).
    verified: Lsn,
    /// Whether a publication check has run (the first one runs at once).
    publication_checked: bool,
    next_publication_check: tokio::time::Instant,
    /// The server and timeline the last stream ran on.
    server: Option<ServerId>,
    commit_lsn: Lsn,
    /// In Unix microseconds: commit → ack latencies are a few milliseconds.
    commit_time_us: i64,
    events_acked: u64,
    dead_lettered: u64,
    reconnects: u64,
    /// Index of the next outbox event within the open transaction.
    tx_seq: u32,
    /// The largest recent WAL message (a maximum that decays by 1/64 per
    /// message, so one huge row does not throttle the rest of the run):
    /// read-ahead holds up to two messages, reserved out of the byte cap.
    largest_message: usize,
    exactly_once: Option<exactly_once::ExactlyOnce>,
    /// `--cleanup delete`.
    cleanup: Option<Cleanup>,
    observer: PipelineObserver,
}

impl<S: Source, K: Sink> Pipeline<S, K> {
    /// A pipeline resuming from `slot`'s confirmed position. Make it after
    /// the metrics recorder is installed: its metric handles bind to the
    /// recorder in place when it is made.
    pub fn new(
        config: Config,
        source: S,
        sink: Arc<K>,
        deliveries: mpsc::UnboundedReceiver<Delivery>,
        health: Arc<Health>,
        slot: &SlotState,
    ) -> Self {
        let confirmed = slot.confirmed_flush;
        Pipeline {
            outbox: Outbox {
                mapper: config.event_mapper(),
                non_insert_changes: 0,
                warned_non_transactional: false,
                all_tables: slot.all_tables,
                foreign: HashMap::new(),
            },
            tracker: AckTracker::new(confirmed),
            reported: confirmed,
            verified: confirmed,
            publication_checked: false,
            next_publication_check: tokio::time::Instant::now(),
            server: None,
            config,
            source,
            stream: None,
            sink,
            deliveries,
            shutdown: Box::pin(std::future::pending()),
            shutting_down: false,
            stop_by: None,
            commit_lsn: Lsn::ZERO,
            commit_time_us: 0,
            events_acked: 0,
            dead_lettered: 0,
            reconnects: 0,
            tx_seq: 0,
            largest_message: 0,
            exactly_once: None,
            cleanup: None,
            observer: PipelineObserver::with_health(health),
        }
    }

    /// `--cleanup delete`: relayed rows are deleted before the slot moves past them.
    pub fn with_cleanup(mut self, cleanup: Cleanup) -> Self {
        self.cleanup = Some(cleanup);
        self
    }

    /// `--delivery exactly-once`: records carry `source_id` and their
    /// position; `wal_end` is the WAL's end at start-up.
    pub fn with_exactly_once(mut self, source_id: String, wal_end: Lsn) -> Self {
        let fallback = self.config.exactly_once_fallback;
        self.exactly_once = Some(exactly_once::ExactlyOnce::new(source_id, fallback, wal_end));
        self
    }

    /// Streams until `shutdown` resolves or a fatal error, then drains
    /// in-flight deliveries (up to `--shutdown-timeout`) and confirms the frontier.
    pub async fn run(
        mut self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<Summary, RelayError> {
        self.shutdown = Box::pin(shutdown);
        let outcome = self.run_streams().await;
        let summary = self.finish().await;
        outcome.map(|()| summary)
    }

    /// The open transaction's commit time in Unix milliseconds (Kafka timestamps).
    fn commit_time_ms(&self) -> i64 {
        self.commit_time_us.div_euclid(1000)
    }

    /// Connects, streams, and on a transient failure reconnects with capped
    /// exponential backoff, keeping in-flight deliveries and the tracker.
    async fn run_streams(&mut self) -> Result<(), RelayError> {
        let (min_backoff, max_backoff) = self.config.reconnect_backoff;
        let mut backoff = min_backoff;
        let mut attempt: u64 = 0;
        let mut standby = false;
        loop {
            let start = self.tracker.resume_lsn();
            let acked = self.reportable();
            match self.source.start(start, acked).await {
                Ok(stream) => {
                    if stream.started_at() < start {
                        tracing::warn!(
                            slot = %self.config.slot,
                            from = ?self.server,
                            to = ?stream.server(),
                            received = %start,
                            lsn = %stream.started_at(),
                            "reconnected to another server or timeline (a promotion): resuming \
                             from the slot's confirmed position there, not after the last \
                             transaction received from the old one"
                        );
                        self.tracker.rewind(stream.started_at());
                        self.reported = self.reported.min(stream.started_at());
                        self.verified = self.verified.min(stream.started_at());
                    }
                    self.server = Some(stream.server().clone());
                    self.stream = Some(stream);
                    self.observer.streaming(true);
                    if attempt == 0 && !standby {
                        tracing::info!(
                            slot = %self.config.slot,
                            publication = %self.config.publication,
                            lsn = %start,
                            tables = %self.config.tables.iter().map(ToString::to_string).collect::<Vec<_>>().join(","),
                            "streaming from the slot's confirmed position"
                        );
                    } else {
                        tracing::info!(
                            slot = %self.config.slot,
                            lsn = %start,
                            frontier = %acked,
                            attempts = attempt,
                            "{}",
                            if standby {
                                "slot released by its previous holder: this relay is now active and streaming"
                            } else {
                                "reconnected: streaming resumes after the last transaction received"
                            }
                        );
                    }
                    if standby {
                        // The active relay wrote past the WAL end seen at
                        // start-up: its records are not another writer's.
                        self.refresh_exactly_once().await;
                    }
                    backoff = min_backoff;
                    attempt = 0;
                    standby = false;
                }
                Err(e) => {
                    let wait = match e.recovery() {
                        Recovery::Fatal => return Err(self.fatal_source(e).await),
                        Recovery::Standby => {
                            if !standby {
                                tracing::warn!(
                                    slot = %self.config.slot,
                                    error = %e,
                                    retry_every = %humantime::format_duration(max_backoff),
                                    "the slot is in use by another process (another relay?): \
                                     waiting as a standby and taking over when it is released"
                                );
                            }
                            standby = true;
                            max_backoff
                        }
                        Recovery::Reconnect => {
                            attempt += 1;
                            tracing::warn!(
                                attempt,
                                error = %e,
                                retry_in = %humantime::format_duration(backoff),
                                "cannot (re)connect the replication stream; retrying"
                            );
                            let wait = backoff;
                            backoff = (backoff * 2).min(max_backoff);
                            wait
                        }
                    };
                    if self.pause(wait).await? {
                        return Ok(());
                    }
                    continue;
                }
            }

            match self.stream_until_shutdown().await {
                Ok(()) => return Ok(()),
                // Stopping anyway: the open transaction is replayed after restart.
                Err(RelayError::Source(e))
                    if self.shutting_down && e.recovery() != Recovery::Fatal =>
                {
                    tracing::warn!(error = %e, "replication stream broke while stopping");
                    return Ok(());
                }
                Err(RelayError::Source(e)) if e.recovery() != Recovery::Fatal => {
                    self.reconnects += 1;
                    attempt += 1;
                    tracing::warn!(
                        error = %e,
                        frontier = %self.tracker.frontier(),
                        in_flight = self.tracker.window_len(),
                        retry_in = %humantime::format_duration(backoff),
                        "replication stream broke; reconnecting (in-flight deliveries continue)"
                    );
                    self.stream = None;
                    self.observer.streaming(false);
                    crate::observability::metrics::reconnected();
                    self.tracker.abandon_open();
                    if let Some(cleanup) = self.cleanup.as_mut() {
                        cleanup.abandon_open();
                    }
                    if self.exactly_once.is_some() {
                        // The replayed transaction must be checked against
                        // tails that include everything sent before the break.
                        if self.drain_in_flight().await? {
                            return Ok(());
                        }
                        self.refresh_exactly_once().await;
                    }
                    if self.pause(backoff).await? {
                        return Ok(());
                    }
                }
                Err(RelayError::Source(e)) => return Err(self.fatal_source(e).await),
                Err(e) => return Err(e),
            }
        }
    }

    /// Has exactly-once read the tails again before the next record, judged
    /// against the WAL's end now.
    async fn refresh_exactly_once(&mut self) {
        if self.exactly_once.is_none() {
            return;
        }
        let wal_end = self.source.wal_end().await;
        if let Some(eo) = self.exactly_once.as_mut() {
            eo.reset(wal_end);
        }
    }

    // `&mut`: the pipeline future must stay `Send`, and `Pipeline` is not `Sync`.
    async fn fatal_source(&mut self, e: SourceError) -> RelayError {
        if e.is_slot_dropped() {
            RelayError::SlotDropped {
                slot: self.config.slot.clone(),
                frontier: self.tracker.frontier(),
            }
        } else {
            RelayError::Source(self.source.explain(e).await)
        }
    }

    /// Waits `duration` while still processing delivery reports. Returns
    /// whether shutdown was requested.
    async fn pause(&mut self, duration: Duration) -> Result<bool, RelayError> {
        let deadline = tokio::time::Instant::now() + duration;
        loop {
            tokio::select! {
                biased;
                () = &mut self.shutdown, if !self.shutting_down => {
                    self.begin_shutdown();
                    return Ok(true);
                }
                Some(delivery) = self.deliveries.recv() => self.on_delivery(delivery).await?,
                () = tokio::time::sleep_until(deadline) => return Ok(false),
            }
        }
    }

    fn saw_message(&mut self, len: usize) {
        self.largest_message = len.max(self.largest_message - self.largest_message / 64);
    }

    fn begin_shutdown(&mut self) {
        self.shutting_down = true;
        self.stop_by = Some(tokio::time::Instant::now() + self.config.shutdown_timeout);
    }

    /// Streams until shutdown. A shutdown in the middle of a transaction keeps
    /// reading to its commit (within `--shutdown-timeout`): stopping before it
    /// would leave the frontier before the transaction and a restart would
    /// send all of it again.
    async fn stream_until_shutdown(&mut self) -> Result<(), RelayError> {
        loop {
            if self.shutting_down && !self.tracker.in_transaction() {
                return Ok(());
            }
            // Read-ahead (pgwire-replication's channel and its reader) holds up
            // to two messages beyond what is in flight; with nothing in flight,
            // read anyway so a row larger than the cap still goes through.
            let in_flight = self.tracker.in_flight_bytes();
            let can_read = self.tracker.window_len() < self.config.max_in_flight_events
                && (in_flight == 0
                    || in_flight.saturating_add(2 * self.largest_message)
                        < self.config.max_in_flight_bytes);
            let stop_by = self.stop_by;
            let frontier = self.tracker.frontier();
            let cleanup_due = self.cleanup.as_ref().and_then(|c| c.due(frontier));
            // Checked at the status interval while there is something new to confirm.
            let check_at = (self.unverified() > self.verified || !self.publication_checked)
                .then_some(self.next_publication_check);
            let Some(stream) = self.stream.as_mut() else {
                return Ok(());
            };
            tokio::select! {
                biased;
                () = &mut self.shutdown, if !self.shutting_down => {
                    self.begin_shutdown();
                    if self.tracker.in_transaction() {
                        tracing::info!(
                            lsn = %self.commit_lsn,
                            sent = self.tx_seq,
                            "shutdown requested: reading to the open transaction's commit, then \
                             waiting for in-flight deliveries"
                        );
                    } else {
                        tracing::info!("shutdown requested: stopped reading, waiting for in-flight deliveries");
                    }
                }
                () = async { if let Some(at) = stop_by { tokio::time::sleep_until(at).await } }, if stop_by.is_some() => {
                    tracing::warn!(
                        lsn = %self.commit_lsn,
                        sent = self.tx_seq,
                        frontier = %self.tracker.frontier(),
                        "--shutdown-timeout ran out before the open transaction's commit arrived: \
                         that transaction (its events sent so far included) and everything after \
                         the frontier will be sent again after restart"
                    );
                    return Ok(());
                }
                Some(delivery) = self.deliveries.recv() => {
                    self.on_delivery(delivery).await?;
                    while let Ok(delivery) = self.deliveries.try_recv() {
                        self.on_delivery(delivery).await?;
                    }
                }
                event = stream.recv(), if can_read => self.on_event(event?).await?,
                () = sleep_until_some(cleanup_due), if cleanup_due.is_some() => {}
                () = sleep_until_some(check_at), if check_at.is_some() => {
                    // A check that could not run is retried less often.
                    let wait = match self.check_publication().await? {
                        true => self.config.status_interval,
                        false => self.config.status_interval.max(Duration::from_secs(1)),
                    };
                    self.next_publication_check = tokio::time::Instant::now() + wait;
                }
            }
            self.report_frontier(false).await;
        }
    }

    /// The highest position that may be reported now: the ack frontier, held
    /// back under `--cleanup delete` until the rows it covers are deleted, and
    /// until a check of the publication that started after it was reached.
    fn reportable(&self) -> Lsn {
        self.unverified().min(self.verified)
    }

    fn unverified(&self) -> Lsn {
        let frontier = self.tracker.frontier();
        self.cleanup
            .as_ref()
            .map_or(frontier, |c| c.cleared().min(frontier))
    }

    /// Checks that the publication still exists, is the same one and covers
    /// the outbox tables; then the frontier as it stood before the check may be
    /// reported: everything up to it was decoded before any drop committed.
    /// A check that cannot run (the server unreachable) confirms nothing and
    /// returns false.
    async fn check_publication(&mut self) -> Result<bool, RelayError> {
        let candidate = self.unverified();
        let check = self.source.check_publication().await?;
        self.publication_checked |= check != PublicationCheck::Unknown;
        match check {
            PublicationCheck::Intact => self.verified = self.verified.max(candidate),
            PublicationCheck::NotNeeded => self.verified = Lsn(u64::MAX),
            PublicationCheck::Unknown => return Ok(false),
        }
        Ok(true)
    }

    /// Reports the frontier; under `--cleanup delete`, first deletes the rows
    /// it covers (`force`: now, else when a batch is full or due).
    async fn report_frontier(&mut self, force: bool) {
        if let Some(cleanup) = self.cleanup.as_mut() {
            cleanup
                .clear(self.tracker.frontier(), force, self.config.status_interval)
                .await;
        }
        let frontier = self.reportable();
        self.observer.frontier(frontier);
        if frontier > self.reported
            && let Some(stream) = &self.stream
        {
            stream.ack(frontier);
            self.reported = frontier;
        }
    }

    async fn on_delivery(&mut self, delivery: Delivery) -> Result<(), RelayError> {
        match delivery.outcome {
            Ok(_) => {
                self.observer.event_acked(delivery.ticket);
                self.tracker.ack(delivery.ticket)?;
                self.events_acked += 1;
                Ok(())
            }
            Err(failure) => {
                self.observer
                    .delivery_failed(delivery.ticket, &failure.error);
                let lsn = self
                    .tracker
                    .commit_lsn_of(delivery.ticket)
                    .unwrap_or(Lsn::ZERO);
                let table = self
                    .tracker
                    .table_of(delivery.ticket)
                    .map(ToString::to_string)
                    .unwrap_or_default();
                if !delivery.alone && crate::sink::is_batch_level(&failure.error) {
                    // The broker blamed the whole batch: only a record refused
                    // on its own is poison.
                    tracing::warn!(
                        lsn = %lsn,
                        id = %failure.id,
                        topic = %failure.topic,
                        error = %failure.error,
                        "the broker refused a batch; sending its records again one per batch"
                    );
                    let record = failure.to_record();
                    return match self.sink.send_alone(delivery.ticket, &record).await {
                        Ok(()) => Ok(()),
                        Err(SinkError::Enqueue {
                            poison: true,
                            source,
                            ..
                        }) => {
                            let poison = Poison::refused(record, source, lsn, table);
                            self.poison(delivery.ticket, poison).await
                        }
                        Err(source) => Err(RelayError::Sink { lsn, table, source }),
                    };
                }
                if crate::sink::is_poison(&failure.error) {
                    if self.config.dead_letter_topic.as_ref() == Some(&failure.topic) {
                        return Err(RelayError::DeadLetter {
                            lsn,
                            id: failure.id,
                            topic: failure.topic,
                            error: failure.error,
                        });
                    }
                    return self
                        .poison(delivery.ticket, Poison::rejected(failure, lsn, table))
                        .await;
                }
                tracing::error!(
                    lsn = %lsn,
                    id = %failure.id,
                    topic = %failure.topic,
                    error = %failure.error,
                    "delivery failed for good; stopping without acknowledging it"
                );
                Err(RelayError::Delivery {
                    lsn,
                    id: failure.id,
                    topic: failure.topic,
                    error: failure.error,
                })
            }
        }
    }

    async fn on_event(&mut self, event: ReplicationEvent) -> Result<(), RelayError> {
        self.observer.received(&event);
        match event {
            ReplicationEvent::Begin {
                final_lsn,
                commit_time_micros,
                ..
            } => {
                self.commit_lsn = final_lsn.into();
                self.commit_time_us = values::pg_micros_to_unix_micros(commit_time_micros);
                self.tx_seq = 0;
                self.tracker.begin(self.commit_lsn)?;
            }
            ReplicationEvent::Commit { end_lsn, .. } => {
                self.tracker.commit(end_lsn.into())?;
                if let Some(cleanup) = self.cleanup.as_mut() {
                    cleanup.commit(end_lsn.into(), self.config.status_interval);
                }
            }
            ReplicationEvent::KeepAlive { wal_end, .. } => {
                self.tracker.keepalive(wal_end.into());
            }
            ReplicationEvent::XLogData {
                wal_start, data, ..
            } => {
                self.saw_message(data.len());
                let message = pgoutput::decode(&data).map_err(|source| RelayError::Decode {
                    lsn: wal_start.into(),
                    source,
                })?;
                self.on_message(message).await?;
            }
            ReplicationEvent::Message {
                transactional,
                prefix,
                content,
                lsn,
            } => {
                self.saw_message(content.len());
                self.on_logical_message(transactional, &prefix, content, lsn.into())
                    .await?
            }
            ReplicationEvent::StoppedAt { .. } => {}
        }
        Ok(())
    }

    async fn on_message(&mut self, message: Message) -> Result<(), RelayError> {
        match message {
            Message::Relation(relation) => {
                let id = relation.id;
                let name = format!("{}.{}", relation.namespace, relation.name);
                // A partition arrives under its own name when the publication
                // lacks publish_via_partition_root: map it to its root.
                let root = if self
                    .outbox
                    .mapper
                    .is_outbox(&relation.namespace, &relation.name)
                {
                    None
                } else {
                    self.source.partition_root(id).await?
                };
                if let Some(cleanup) = self.cleanup.as_mut() {
                    cleanup
                        .relation(&relation, root.as_ref())
                        .map_err(|source| RelayError::Bind {
                            lsn: self.commit_lsn,
                            source,
                        })?;
                }
                self.outbox
                    .mapper
                    .relation(relation, root)
                    .map_err(|source| RelayError::Bind {
                        lsn: self.commit_lsn,
                        source,
                    })?;
                self.outbox.foreign.remove(&id);
                if let Some(table) = self.outbox.mapper.outbox_table(id) {
                    tracing::debug!(table = %table, relation = %name, relation_id = id, "bound outbox table");
                } else {
                    self.outbox.foreign.insert(id, name);
                }
            }
            Message::Insert { relation_id, new } => {
                if let Some(cleanup) = self.cleanup.as_mut() {
                    cleanup.row(relation_id, &new);
                }
                let commit_time_ms = self.commit_time_ms();
                match self.outbox.mapper.insert(relation_id, &new, commit_time_ms) {
                    Some((table, mapped)) => self.relay_event(mapped, table).await?,
                    // Never skip silently: only FOR ALL TABLES sends other tables' rows.
                    None if self.outbox.all_tables => {}
                    None => {
                        return Err(RelayError::UnmappedRelation {
                            lsn: self.commit_lsn,
                            publication: self.config.publication.clone(),
                            table: self
                                .outbox
                                .foreign
                                .get(&relation_id)
                                .cloned()
                                .unwrap_or_else(|| format!("relation OID {relation_id}")),
                        });
                    }
                }
            }
            Message::Update { relation_id, .. } | Message::Delete { relation_id, .. } => {
                if let Some(table) = self.outbox.mapper.outbox_table(relation_id) {
                    // Warn on the first one only; the count is reported at shutdown.
                    if self.outbox.non_insert_changes == 0 {
                        tracing::warn!(
                            table = %table,
                            lsn = %self.commit_lsn,
                            "ignoring UPDATE/DELETE on an outbox table: only inserts are relayed \
                             (create the publication WITH (publish = 'insert') to stop receiving them)"
                        );
                    }
                    self.outbox.non_insert_changes += 1;
                }
            }
            Message::Begin { .. }
            | Message::Commit { .. }
            | Message::Origin { .. }
            | Message::Type { .. }
            | Message::Truncate { .. }
            | Message::Message { .. } => {}
        }
        Ok(())
    }

    /// A logical decoding message: an outbox event when its prefix is one of
    /// `--message-prefix` and it was emitted inside a transaction.
    async fn on_logical_message(
        &mut self,
        transactional: bool,
        prefix: &str,
        content: bytes::Bytes,
        lsn: Lsn,
    ) -> Result<(), RelayError> {
        let commit_time_ms = self.commit_time_ms();
        let Some((source, mapped)) = self.outbox.mapper.message(prefix, &content, commit_time_ms)
        else {
            return Ok(());
        };
        if !transactional || !self.tracker.in_transaction() {
            if !self.outbox.warned_non_transactional {
                self.outbox.warned_non_transactional = true;
                tracing::warn!(
                    prefix,
                    lsn = %lsn,
                    "ignoring a non-transactional message with an outbox prefix: emit outbox \
                     events with pg_logical_emit_message(true, ...) inside the business transaction"
                );
            }
            return Ok(());
        }
        self.relay_event(mapped, source).await
    }

    /// Waits until every in-flight record is acknowledged. Returns whether
    /// shutdown was requested meanwhile.
    async fn drain_in_flight(&mut self) -> Result<bool, RelayError> {
        while self.tracker.window_len() > 0 {
            tokio::select! {
                biased;
                () = &mut self.shutdown, if !self.shutting_down => {
                    self.begin_shutdown();
                    return Ok(true);
                }
                Some(delivery) = self.deliveries.recv() => self.on_delivery(delivery).await?,
            }
        }
        Ok(false)
    }

    /// One outbox event (a row or a message) of the open transaction: the
    /// record it maps to, or why it does not map and what could be read of it.
    async fn relay_event(
        &mut self,
        mapped: Result<OutboxRecord, (crate::outbox::EventError, crate::outbox::RawParts)>,
        source: std::sync::Arc<str>,
    ) -> Result<(), RelayError> {
        // Every event takes a sequence number, mapped or not, so a replayed
        // transaction numbers its events the same way (exactly-once relies on it).
        let seq = self.tx_seq;
        self.tx_seq = self.tx_seq.saturating_add(1);
        match mapped {
            Ok(record) => self.enqueue(record, source, seq).await,
            Err((error, parts)) => {
                let poison = Poison::unmappable(
                    parts,
                    error,
                    self.commit_lsn,
                    source.to_string(),
                    self.commit_time_ms(),
                );
                let ticket = self.tracker.push(0, &source)?;
                self.poison(ticket, poison).await
            }
        }
    }

    /// Hands one record to the producer, in stream order.
    async fn enqueue(
        &mut self,
        record: OutboxRecord,
        table: std::sync::Arc<str>,
        seq: u32,
    ) -> Result<(), RelayError> {
        let record = match self.exactly_once.as_mut() {
            None => record,
            Some(eo) => {
                let position = crate::sink::exactly_once::Position {
                    lsn: self.commit_lsn,
                    seq,
                };
                match eo.prepare(&*self.sink, record, position).await {
                    Ok(Some(record)) => record,
                    Ok(None) => {
                        // Already in its partition from a previous run.
                        let ticket = self.tracker.push(0, &table)?;
                        self.tracker.ack(ticket)?;
                        return Ok(());
                    }
                    Err(source) => {
                        return Err(RelayError::ExactlyOnce {
                            lsn: self.commit_lsn,
                            source,
                        });
                    }
                }
            }
        };
        let ticket: Ticket = self.tracker.push(record.size(), &table)?;
        match self.sink.send(ticket, &record).await {
            Ok(()) => {
                self.observer
                    .event_sent(ticket, &record.topic, record.size(), self.commit_time_us);
                Ok(())
            }
            Err(SinkError::Enqueue {
                poison: true,
                source,
                ..
            }) => {
                let poison = Poison::refused(record, source, self.commit_lsn, table.to_string());
                self.poison(ticket, poison).await
            }
            Err(source) => Err(RelayError::Sink {
                lsn: self.commit_lsn,
                table: table.to_string(),
                source,
            }),
        }
    }

    /// An event that can never be delivered: dead-letter it under that
    /// policy (acknowledged when the dead-letter record is), else stop.
    async fn poison(&mut self, ticket: Ticket, poison: Poison) -> Result<(), RelayError> {
        let Some(topic) = self.config.dead_letter_topic.clone() else {
            tracing::error!(
                lsn = %poison.info.lsn,
                id = %poison.id_text(),
                table = %poison.info.table,
                topic = %poison.info.intended_topic.as_deref().unwrap_or(""),
                error = %poison.info.error,
                "event cannot be delivered; stopping before acknowledging it (--on-poison fail)"
            );
            return Err(poison.into_error());
        };
        tracing::warn!(
            lsn = %poison.info.lsn,
            id = %poison.id_text(),
            table = %poison.info.table,
            topic = %poison.info.intended_topic.as_deref().unwrap_or(""),
            error = %poison.info.error,
            dead_letter_topic = %topic,
            "event cannot be delivered; dead-lettering it"
        );
        let lsn = poison.info.lsn;
        let table = poison.info.table.clone();
        let id = poison.id_text();
        let record = poison.into_dead_letter(&topic);
        self.dead_lettered += 1;
        crate::observability::metrics::dead_lettered();
        match self.sink.send(ticket, &record).await {
            Ok(()) => Ok(()),
            Err(SinkError::Enqueue {
                poison: true,
                source,
                ..
            }) => Err(RelayError::DeadLetter {
                lsn,
                id,
                topic,
                error: source,
            }),
            Err(source) => Err(RelayError::Sink { lsn, table, source }),
        }
    }

    /// Stops reading, waits up to the shutdown timeout for in-flight
    /// deliveries, reports the final frontier and closes the stream.
    async fn finish(mut self) -> Summary {
        self.observer.streaming(false);
        let deadline = self
            .stop_by
            .unwrap_or_else(|| tokio::time::Instant::now() + self.config.shutdown_timeout);
        while self.tracker.window_len() > 0 && tokio::time::Instant::now() < deadline {
            let wait = tokio::time::Instant::now() + Duration::from_millis(100);
            match tokio::time::timeout_at(wait.min(deadline), self.deliveries.recv()).await {
                Ok(Some(delivery)) => {
                    // Only successes can move the frontier; a failure is
                    // already reported or will be replayed after restart.
                    if delivery.outcome.is_ok() && self.tracker.ack(delivery.ticket).is_ok() {
                        self.observer.event_acked(delivery.ticket);
                        self.events_acked += 1;
                    }
                }
                Ok(None) => break,
                // Nothing reported for a while: stop waiting once librdkafka
                // holds nothing either (what remains in the window was never
                // handed over, e.g. the poison event that stopped the relay).
                Err(_) if self.sink.in_flight() == 0 && self.deliveries.is_empty() => break,
                Err(_) => {}
            }
        }
        // A last check, so a clean stop confirms what it delivered.
        let check = tokio::time::timeout(Duration::from_secs(5), self.check_publication());
        if let Ok(Err(error)) = check.await {
            tracing::warn!(%error, "not confirming the final frontier");
        }
        self.report_frontier(true).await;
        let frontier = self.reportable();
        let abandoned = self.tracker.in_flight_events();
        if abandoned > 0 {
            tracing::warn!(
                in_flight = abandoned,
                "stopping with unacknowledged events; they will be sent again after restart"
            );
        }
        if let Some(stream) = self.stream.take() {
            stream
                .close(
                    frontier,
                    self.config.status_interval * 2 + Duration::from_secs(1),
                )
                .await;
        }
        tracing::info!(
            frontier = %frontier,
            acked = self.events_acked,
            dead_lettered = self.dead_lettered,
            ignored_updates_deletes = self.outbox.non_insert_changes,
            "stopped; slot confirmed up to the final frontier"
        );
        Summary {
            frontier,
            events_acked: self.events_acked,
            dead_lettered: self.dead_lettered,
            abandoned,
            reconnects: self.reconnects,
        }
    }
}
