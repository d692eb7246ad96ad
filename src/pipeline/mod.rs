//! Ordering and acknowledgement: the only code that moves the slot.
//!
//! # Invariants
//! 1. Every committed transaction enters the [`AckTracker`] in commit order, even one without
//!    outbox rows; only the frontier, the end LSN of the longest fully delivered prefix, is
//!    reported to Postgres.
//! 2. A keepalive's position is acknowledged only when nothing is in flight and no transaction
//!    is open; otherwise an idle outbox would pin WAL.
//! 3. Backpressure is a chain: at the in-flight caps the pipeline stops reading, the
//!    replication channel fills and TCP slows the walsender, so memory stays bounded however
//!    large a transaction is (the stream's read-ahead of `READ_AHEAD` rows is reserved out of the
//!    byte cap).
//! 4. A delivery that fails for good is never acknowledged: the relay stops, and a restart
//!    replays from the confirmed position (at-least-once).
//! 5. Under `--cleanup delete`, the rows a frontier covers are deleted before it is reported;
//!    a row is deleted only once everything it held reached Kafka ([`cleanup`]).
//!
//! Records are enqueued in stream order, commit order for pgoutput, so with the idempotent
//! producer each partition, and so each aggregate (one key), receives events in commit order.

pub mod ack;

pub mod cleanup;
mod decide;
mod error;
mod events;
mod pace;
mod register;
mod stream;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::config::{self, Config};
use crate::lsn::Lsn;
use crate::observability::Chain;
use crate::observability::health::Health;
use crate::observability::observer::{PipelineObserver, Sent};
use crate::outbox::EventMapper;
use crate::sink::exactly_once::{ExactlyOnce, Position, ReadBack};
use crate::sink::{Delivery, Sink, Ticket};
use crate::source::{ServerId, Source, Stream};
use crate::startup::Started;
use ack::{AckError, AckTracker};
use cleanup::Cleanup;
use decide::ReadGate;
use register::Registering;

pub use error::{RelayError, exit_code};

/// What a clean shutdown reports.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    /// The final ack frontier, reported to Postgres.
    pub frontier: Lsn,
    /// Events the broker acknowledged this run, dead-lettered ones included.
    pub events_acked: u64,
    /// Events dead-lettered this run.
    pub dead_lettered: u64,
    /// Events still unacknowledged when the shutdown timeout ran out.
    pub abandoned: usize,
    /// Times the replication stream was re-established.
    pub reconnects: u64,
}

/// The running relay: source, tracker and sink.
pub struct Pipeline<S: Source, K: Sink + ReadBack> {
    config: Config,
    source: S,
    stream: Option<S::Stream>,
    sink: Arc<K>,
    deliveries: mpsc::UnboundedReceiver<Delivery>,
    tracker: AckTracker<Sent>,
    tx: OpenTx,
    routing: Routing,
    guard: PublicationGuard,
    checking: Checking<S::Check>,
    gate: ReadGate,
    /// Naps between reads while the stream is behind, so the socket wakes the thread less.
    pacer: pace::Pacer,
    shutdown: Pin<Box<dyn Future<Output = ()> + Send>>,
    /// Set at shutdown: when reading to the open commit and the drain must both be done.
    stop_by: Option<Instant>,
    /// The last position confirmed to the stream.
    reported: Lsn,
    /// The server and timeline the last stream ran on.
    server: Option<ServerId>,
    summary: Summary,
    exactly_once: Option<ExactlyOnce>,
    /// `--cleanup delete`: relayed rows are deleted before the slot moves past them.
    cleanup: Option<Cleanup>,
    /// Records waiting for Schema Registry ids.
    registering: Registering,
    observer: PipelineObserver,
}

/// The open transaction, or the last one.
#[derive(Default)]
struct OpenTx {
    commit_lsn: Lsn,
    /// Unix microseconds: commit-to-ack latencies are a few milliseconds.
    commit_time_us: i64,
    /// Its outbox events so far.
    events: u32,
    /// The last event's change LSN and index there (exactly-once positions).
    last: Option<(Lsn, u32)>,
}

impl OpenTx {
    /// The position of its next event, the change at `change`: the WAL's, so a replay gives
    /// it again whatever the relay is configured to relay. Only a multi-insert (`COPY`) logs
    /// several events, all of one table, at one position.
    fn next_position(&mut self, change: Lsn) -> Position {
        let index = match self.last {
            Some((at, index)) if at == change => index.saturating_add(1),
            _ => 0,
        };
        self.last = Some((change, index));
        self.events = self.events.saturating_add(1);
        Position {
            lsn: self.commit_lsn,
            change,
            index,
        }
    }

    /// The commit time in Unix milliseconds (Kafka timestamps).
    fn commit_time_ms(&self) -> i64 {
        self.commit_time_us.div_euclid(1000)
    }
}

/// What routing needs beside the mapper: the relations that are not outbox tables.
struct Routing {
    mapper: EventMapper,
    /// `FOR ALL TABLES`: inserts into other tables are expected and skipped.
    all_tables: bool,
    /// Relations that are neither outbox tables nor partitions of one.
    foreign: HashMap<u32, String>,
    /// UPDATE/DELETE messages on outbox tables (ignored).
    non_insert_changes: u64,
    warned_non_transactional: bool,
}

/// PostgreSQL 18 decodes on past a dropped publication, skipping its rows: only a position a
/// check covered may be reported there.
struct PublicationGuard {
    /// The frontier before the last check that found the publication intact.
    checked: Lsn,
    /// Whether reports wait for checks (PostgreSQL 18 and later).
    checked_only: bool,
    next_check: Instant,
    /// Checks in a row that could not run: they are retried with back-off.
    unchecked: u32,
}

/// A publication check in flight beside the stream: the frontier it covers, and the check.
type Checking<C> = Option<(Lsn, BoxFuture<'static, C>)>;

impl<S: Source, K: Sink + ReadBack> Pipeline<S, K> {
    /// A pipeline resuming from the slot's confirmed position as start-up found it (`slot`).
    /// Make it after the metrics recorder is installed: its metric handles bind when it is
    /// made.
    pub fn new(
        config: Config,
        source: S,
        sink: Arc<K>,
        deliveries: mpsc::UnboundedReceiver<Delivery>,
        health: Arc<Health>,
        slot: &Started,
        cleanup: Option<Cleanup>,
    ) -> Self {
        let confirmed = slot.confirmed_flush;
        let connect = config.mapping.connect.as_ref();
        let ids = connect.map(|c| c.registry.ids.clone()).unwrap_or_default();
        let limit = config.flags.max_in_flight_events;
        let interval = config.flags.status_interval;
        Pipeline {
            routing: Routing {
                mapper: config.event_mapper(),
                all_tables: slot.publication.all_tables,
                foreign: HashMap::new(),
                non_insert_changes: 0,
                warned_non_transactional: false,
            },
            exactly_once: (config.flags.delivery == config::Delivery::ExactlyOnce).then(|| {
                ExactlyOnce::new(
                    config.flags.slot.clone(),
                    config.flags.exactly_once_fallback,
                )
            }),
            gate: ReadGate {
                max_events: config.flags.max_in_flight_events,
                max_bytes: config.flags.max_in_flight_bytes,
                largest: 0,
            },
            pacer: pace::Pacer::new(config.flags.shard.is_some()),
            tracker: AckTracker::new(confirmed),
            reported: confirmed,
            guard: PublicationGuard {
                checked: confirmed,
                // Before 18, pgoutput fails the stream on a missing publication.
                checked_only: slot.publication.server_version >= 180_000,
                next_check: Instant::now(),
                unchecked: 0,
            },
            checking: None,
            server: None,
            config,
            source,
            stream: None,
            sink,
            deliveries,
            shutdown: Box::pin(std::future::pending()),
            stop_by: None,
            tx: OpenTx::default(),
            summary: Summary::default(),
            cleanup: cleanup.map(|cleanup| cleanup.resuming(confirmed, limit, interval)),
            registering: Registering::new(ids),
            observer: PipelineObserver::with_health(health),
        }
    }

    /// Resolves Schema Registry ids through `registry` (avro converters).
    pub fn with_registry(
        mut self,
        registry: Arc<dyn crate::sink::registry::SchemaRegistry>,
    ) -> Self {
        self.registering = self.registering.with_registry(registry);
        self
    }

    /// Streams until `shutdown` or a fatal error, then drains in-flight deliveries (up to
    /// `--shutdown-timeout`) and confirms the frontier.
    pub async fn run(
        mut self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<Summary, RelayError> {
        self.shutdown = Box::pin(shutdown);
        let outcome = self.run_streams().await;
        let summary = self.finish(outcome.is_ok()).await;
        outcome.map(|()| summary)
    }

    fn begin_shutdown(&mut self) {
        self.stop_by = Some(Instant::now() + self.config.flags.shutdown_timeout);
    }

    /// The frontier as [`decide::reportable`] holds it back.
    fn reportable(&self) -> Lsn {
        let guard = &self.guard;
        let checked = guard.checked_only.then_some(guard.checked);
        decide::reportable(self.unverified(), None, checked)
    }

    /// The frontier held back for cleanup only: what a publication check would cover.
    fn unverified(&self) -> Lsn {
        let cleared = self.cleanup.as_ref().and_then(|c| c.ledger.cleared());
        decide::reportable(self.tracker.frontier(), cleared, None)
    }

    /// Checks that the publication still exists, is the same one and covers the outbox tables;
    /// then the frontier from before the check may be reported: all up to it was decoded
    /// before any drop committed. False (confirming nothing) when the check cannot run.
    async fn check_publication(&mut self) -> Result<bool, RelayError> {
        let candidate = self.unverified();
        let check = self.source.check_publication().await;
        self.publication_checked(candidate, check)
    }

    /// A check that began with `candidate` as the frontier came back.
    fn publication_checked(&mut self, candidate: Lsn, check: S::Check) -> Result<bool, RelayError> {
        if !self.source.publication_checked(check)? {
            return Ok(false);
        }
        self.guard.checked = self.guard.checked.max(candidate);
        Ok(true)
    }

    /// Reports the frontier, as far as the deletes allow.
    fn report_frontier(&mut self) {
        let frontier = self.observe();
        if frontier > self.reported
            && let Some(stream) = &self.stream
        {
            stream.ack(frontier);
            self.reported = frontier;
        }
    }

    /// Publishes the step's progress (metrics, [`Health`]); returns the reportable frontier.
    fn observe(&mut self) -> Lsn {
        let frontier = self.reportable();
        if let Some(backlog) = self.cleanup_backlog() {
            self.observer.cleanup(backlog);
        }
        self.observer.step(
            frontier,
            self.tracker.in_flight_events(),
            self.tracker.in_flight_bytes(),
            self.tracker.oldest_sent(),
        );
        frontier
    }

    /// A session only to confirm `frontier`, for a stop that came while reconnecting: what
    /// was acknowledged meanwhile would otherwise be sent again after restart.
    async fn reopen(&mut self, frontier: Lsn, timeout: Duration) -> Option<S::Stream> {
        let from = self.tracker.resume_lsn();
        let error = match tokio::time::timeout(timeout, self.source.start(from, frontier)).await {
            Ok(Ok(stream)) => return Some(stream),
            Ok(Err(e)) => Chain(&e).to_string(),
            Err(_) => format!("no session within {}", humantime::format_duration(timeout)),
        };
        tracing::warn!(%frontier, %error, "cannot reconnect to confirm the final frontier");
        None
    }

    /// The broker acknowledged `ticket`.
    fn acked(&mut self, ticket: Ticket) -> Result<(), AckError> {
        let sent = self.tracker.ack(ticket)?;
        self.observer.event_acked(sent);
        self.summary.events_acked += 1;
        Ok(())
    }

    /// Until `deadline`, waits for the deliveries still in flight (and, after a clean stop, the
    /// records waiting for Schema Registry ids), acknowledging each one delivered; stops early
    /// once nothing more can arrive. After a stop for an error, or once a delivery fails,
    /// the waiting records are not handed over: one may follow a refused event of its key.
    async fn drain_in_flight(&mut self, deadline: Instant, clean: bool) {
        if !clean {
            self.registering.halt();
        }
        while self.tracker.window_len() > 0 && Instant::now() < deadline {
            let wait = Instant::now() + Duration::from_millis(100);
            let delivered = tokio::select! {
                delivered = tokio::time::timeout_at(wait.min(deadline), self.deliveries.recv()) => delivered,
                outcome = self.registering.next(), if self.registering.active() => {
                    if let Err(error) = self.on_registered(outcome).await {
                        tracing::warn!(error = %Chain(&error), "events waiting for the Schema Registry are not sent");
                        break;
                    }
                    continue;
                }
            };
            match delivered {
                Ok(Some(delivery)) => {
                    // A failure is already reported, or replayed after restart.
                    if delivery.outcome.is_err() {
                        self.registering.halt();
                    } else if self.acked(delivery.ticket).is_ok() {
                        self.observe();
                    }
                }
                Ok(None) => break,
                // Nothing for a while, and librdkafka holds nothing either:
                // the rest was never handed over (e.g. a poison event).
                Err(_)
                    if self.sink.in_flight() == 0
                        && self.deliveries.is_empty()
                        && (self.registering.len() == 0 || self.registering.halted()) =>
                {
                    break;
                }
                Err(_) => {}
            }
        }
    }

    /// Waits up to the shutdown timeout for in-flight deliveries, then reports the final
    /// frontier and closes the stream; after a clean stop that came while the stream was down
    /// (reconnecting), on a session opened for it.
    async fn finish(mut self, clean: bool) -> Summary {
        self.observer.streaming(false);
        let deadline = self
            .stop_by
            .unwrap_or_else(|| Instant::now() + self.config.flags.shutdown_timeout);
        self.drain_in_flight(deadline, clean).await;
        // Deletes what may go now, within the deadline; the rest is replayed after restart.
        if let Err(error) = self.drain_cleanup(deadline).await {
            tracing::error!(error = %Chain(&error), "--cleanup delete: stopping without deleting all relayed rows");
        }
        // A last check, so a clean stop confirms what it delivered.
        // A fresh check, covering all that was acknowledged (one in flight covers less).
        self.checking = None;
        let check = tokio::time::timeout(Duration::from_secs(5), self.check_publication());
        if let Ok(Err(error)) = check.await {
            tracing::warn!(error = %Chain(&error), "not confirming the final frontier");
        }
        self.report_frontier();
        let mut frontier = self.reportable();
        let close_timeout = self.config.flags.status_interval * 2 + Duration::from_secs(1);
        // Only a relay that streamed has anything to confirm (not a standby, say).
        if clean && self.stream.is_none() && self.server.is_some() {
            self.stream = self.reopen(frontier, close_timeout).await;
            if let Some(stream) = &self.stream {
                // After a promotion the frontier is the old timeline's: no further than the
                // slot there.
                frontier = frontier.min(stream.started_at());
                stream.ack(frontier);
            }
        }
        let abandoned = self.tracker.in_flight_events();
        if abandoned > 0 {
            tracing::warn!(
                in_flight = abandoned,
                "stopping with unacknowledged events; they will be sent again after restart"
            );
        }
        let acked = self.summary.events_acked;
        let dead_lettered = self.summary.dead_lettered;
        let ignored_updates_deletes = self.routing.non_insert_changes;
        match self.stream.take() {
            Some(stream) => {
                stream.close(frontier, close_timeout).await;
                tracing::info!(
                    %frontier, acked, dead_lettered, ignored_updates_deletes,
                    "stopped; slot confirmed up to the final frontier"
                );
            }
            None if self.server.is_none() => tracing::info!(%frontier, "stopped before streaming"),
            None => tracing::warn!(
                %frontier, acked, dead_lettered, ignored_updates_deletes,
                "stopped without confirming the final frontier (no replication session): the \
                 events after the slot's confirmed position will be sent again after restart"
            ),
        }
        Summary {
            frontier,
            abandoned,
            ..self.summary
        }
    }
}

#[cfg(test)]
mod tests;
