//! The stream loop: (re)connecting with capped exponential backoff, standby takeover, a
//! promotion's rewind, and reading under the in-flight caps until shutdown.

use std::time::Duration;

use futures_util::FutureExt;
use tokio::time::Instant;

use super::{Pipeline, RelayError, cleanup, decide};
use crate::lsn::Lsn;
use crate::observability::Chain;
use crate::sink::exactly_once::ReadBack;
use crate::sink::{Delivery, Sink};
use crate::source::{Recovery, Source, SourceError, Stream};

/// Most events taken from the stream's channel in one step, so deliveries and shutdown are
/// looked at between them.
const BUFFERED_EVENTS_PER_STEP: usize = 64;

impl<S: Source, K: Sink + ReadBack> Pipeline<S, K> {
    /// Connects and streams; on a transient failure reconnects, keeping deliveries and tracker.
    pub(super) async fn run_streams(&mut self) -> Result<(), RelayError> {
        let flags = &self.config.flags;
        let mut retry = Retry::new(flags.reconnect_backoff_min, flags.reconnect_backoff_max);
        loop {
            let start = self.tracker.resume_lsn();
            let acked = self.reportable();
            // A stop does not wait for a connection attempt (up to 30 s on an unanswering host).
            let started = tokio::select! {
                biased;
                () = &mut self.shutdown => {
                    self.begin_shutdown();
                    return Ok(());
                }
                started = self.source.start(start, acked) => started,
            };
            let stream = match started {
                Ok(stream) => stream,
                Err(e) => {
                    let wait = match e.recovery() {
                        Recovery::Fatal => return Err(self.fatal_source(e).await),
                        Recovery::Standby => self.standing_by(&mut retry, &e),
                        Recovery::Reconnect => self.not_started(&mut retry, &e),
                    };
                    if self.handle_deliveries(Some(wait)).await? {
                        return Ok(());
                    }
                    continue;
                }
            };
            self.started(stream, start, acked, retry.attempt, retry.standby)
                .await;
            retry.streaming();
            let error = match self.stream_until_shutdown().await {
                Err(RelayError::Source(e)) => e,
                other => return other,
            };
            if self.stream_broke(error, &mut retry).await? {
                return Ok(());
            }
        }
    }

    /// Another process holds the slot: waits as a standby (saying so the first time).
    fn standing_by(&self, retry: &mut Retry, error: &SourceError) -> Duration {
        if !retry.standby {
            tracing::warn!(
                slot = %self.config.flags.slot,
                error = %Chain(error),
                retry_every = %humantime::format_duration(retry.max),
                "the slot is in use by another process (another relay?): waiting as a standby \
                 and taking over when it is released"
            );
        }
        retry.standing_by()
    }

    /// The stream could not be (re)connected: waits, longer each time.
    fn not_started(&self, retry: &mut Retry, error: &SourceError) -> Duration {
        let wait = retry.failed();
        tracing::warn!(
            attempt = retry.attempt,
            error = %Chain(error),
            retry_in = %humantime::format_duration(wait),
            "cannot (re)connect the replication stream; retrying"
        );
        wait
    }

    /// The stream broke with `error`: a fatal one stops the relay; else the open transaction is
    /// abandoned (replayed after the reconnect) while deliveries go on. Returns whether to stop.
    async fn stream_broke(
        &mut self,
        error: SourceError,
        retry: &mut Retry,
    ) -> Result<bool, RelayError> {
        if error.recovery() == Recovery::Fatal {
            return Err(self.fatal_source(error).await);
        }
        if self.stop_by.is_some() {
            // Stopping anyway: the open transaction is replayed after restart.
            tracing::warn!(error = %Chain(&error), "replication stream broke while stopping");
            // The final frontier is confirmed on a new session.
            self.stream = None;
            return Ok(true);
        }
        self.summary.reconnects += 1;
        let wait = retry.broke();
        tracing::warn!(
            error = %Chain(&error),
            frontier = %self.tracker.frontier(),
            in_flight = self.tracker.window_len(),
            retry_in = %humantime::format_duration(wait),
            "replication stream broke; reconnecting (in-flight deliveries continue)"
        );
        self.stream = None;
        self.observer.streaming(false);
        metrics::counter!(crate::observability::metrics::RECONNECTS_TOTAL).increment(1);
        self.tracker.abandon_open();
        if let Some(cleanup) = self.cleanup.as_mut() {
            cleanup.ledger.abandon_open();
        }
        if self.exactly_once.is_some() {
            // The replay must be checked against tails with everything sent before the break.
            if self.handle_deliveries(None).await? {
                return Ok(true);
            }
            self.refresh_exactly_once().await;
        }
        self.handle_deliveries(Some(wait)).await
    }

    /// A stream came up at `start` (asked for) after `attempt` failures.
    async fn started(
        &mut self,
        stream: S::Stream,
        start: Lsn,
        acked: Lsn,
        attempt: u64,
        standby: bool,
    ) {
        let at = stream.started_at();
        if at < start {
            tracing::warn!(
                slot = %self.config.flags.slot,
                from = ?self.server,
                to = ?stream.server(),
                received = %start,
                lsn = %at,
                "reconnected to another server or timeline (a promotion): resuming from the \
                 slot's confirmed position there, not after the last transaction received \
                 from the old one"
            );
            self.tracker.rewind(at);
            if let Some(cleanup) = self.cleanup.as_mut() {
                cleanup.ledger.rewind(at);
            }
            self.reported = self.reported.min(at);
            self.guard.checked = self.guard.checked.min(at);
            // A check begun on the old server covers positions of its timeline.
            self.checking = None;
        }
        let server = stream.server();
        let new_source = (self.exactly_once.as_mut())
            .is_some_and(|eo| eo.follow(&server.system_id, server.timeline));
        self.server = Some(stream.server().clone());
        self.stream = Some(stream);
        self.observer.streaming(true);
        let what = match (standby, attempt) {
            (true, _) => {
                "slot released by its previous holder: this relay is now active and streaming"
            }
            (false, 0) => "streaming from the slot's confirmed position",
            (false, _) => "reconnected: streaming resumes after the last transaction received",
        };
        let tables: Vec<_> = self.config.tables.iter().map(ToString::to_string).collect();
        tracing::info!(
            slot = %self.config.flags.slot,
            publication = %self.config.flags.publication,
            tables = %tables.join(","),
            lsn = %start,
            frontier = %acked,
            attempts = attempt,
            "{what}"
        );
        if standby || new_source {
            // After a takeover: the active relay wrote past the WAL end seen at start-up, and
            // its records are not another writer's.
            self.refresh_exactly_once().await;
        }
    }

    /// Has exactly-once read the tails again before the next record, against the WAL end now.
    async fn refresh_exactly_once(&mut self) {
        if let Some(eo) = self.exactly_once.as_mut() {
            eo.reset(self.source.wal_end().await);
        }
    }

    // `&mut`: the pipeline future must stay `Send`, and `Pipeline` is not `Sync`.
    async fn fatal_source(&mut self, e: SourceError) -> RelayError {
        if e.is_slot_dropped() {
            RelayError::SlotDropped {
                slot: self.config.flags.slot.clone(),
                frontier: self.tracker.frontier(),
            }
        } else {
            RelayError::Source(self.source.explain(e).await)
        }
    }

    /// Streams until shutdown. A shutdown mid-transaction reads on to its commit (within
    /// `--shutdown-timeout`): stopping before it, a restart would send all of it again.
    async fn stream_until_shutdown(&mut self) -> Result<(), RelayError> {
        loop {
            if self.stop_by.is_some() && !self.tracker.in_transaction() {
                return Ok(());
            }
            let can_read = self.can_read();
            let stop_by = self.stop_by;
            let cleanup_due = self.cleanup.as_ref().and_then(|c| c.ledger.wake());
            // Checked at the status interval while there is something new to confirm.
            let check_at = (self.checking.is_none() && self.unverified() > self.guard.checked)
                .then_some(self.guard.next_check);
            let Some(stream) = self.stream.as_mut() else {
                return Ok(());
            };
            // While the stream is behind, a wait that parked is followed by a nap (see `pace`).
            let pace = can_read && stop_by.is_none() && self.pacer.behind();
            if pace {
                if let Some(nap) = self.pacer.nap() {
                    std::thread::sleep(nap);
                }
                self.pacer.waiting(std::time::Instant::now());
            }
            let deleting = self.cleanup.as_mut();
            tokio::select! {
                biased;
                () = &mut self.shutdown, if self.stop_by.is_none() => self.shutdown_requested(),
                () = sleep_until_some(stop_by) => {
                    self.shutdown_timed_out();
                    return Ok(());
                }
                Some(delivery) = self.deliveries.recv() => {
                    if pace {
                        self.pacer.woke(std::time::Instant::now());
                    }
                    self.on_deliveries(delivery).await?;
                }
                done = cleanup::deleted(deleting) => self.on_deleted(done)?,
                outcome = self.registering.next(), if self.registering.active() => {
                    self.on_registered(outcome).await?;
                }
                event = stream.recv(), if can_read => {
                    if pace {
                        self.pacer.woke(std::time::Instant::now());
                    }
                    self.on_event(event?).await?;
                    self.on_buffered_events().await?;
                }
                () = sleep_until_some(cleanup_due) => {}
                () = sleep_until_some(check_at) => {
                    let candidate = self.unverified();
                    self.checking = Some((candidate, self.source.check_publication()));
                }
                (candidate, check) = checked(&mut self.checking) => {
                    self.publication_check_done(candidate, check)?;
                }
            }
            self.hand_over(false);
            self.report_frontier();
        }
    }

    /// SIGINT or SIGTERM: reads on to the open transaction's commit, if one is open.
    fn shutdown_requested(&mut self) {
        self.begin_shutdown();
        if self.tracker.in_transaction() {
            tracing::info!(
                lsn = %self.tx.commit_lsn,
                sent = self.tx.events,
                "shutdown requested: reading to the open transaction's commit, then waiting for \
                 in-flight deliveries"
            );
        } else {
            tracing::info!("shutdown requested: stopped reading, waiting for in-flight deliveries");
        }
    }

    /// `--shutdown-timeout` ran out before the open transaction's commit arrived.
    fn shutdown_timed_out(&self) {
        tracing::warn!(
            lsn = %self.tx.commit_lsn,
            sent = self.tx.events,
            frontier = %self.tracker.frontier(),
            "--shutdown-timeout ran out before the open transaction's commit arrived: that \
             transaction (its events sent so far included) and everything after the frontier \
             will be sent again after restart"
        );
    }

    /// `delivery`, and every delivery report already waiting.
    async fn on_deliveries(&mut self, delivery: Delivery) -> Result<(), RelayError> {
        self.on_delivery(delivery).await?;
        while let Ok(delivery) = self.deliveries.try_recv() {
            self.on_delivery(delivery).await?;
        }
        Ok(())
    }

    /// A publication check of the frontier `candidate` came back; the next one is due at the
    /// status interval, or later while checks cannot run.
    fn publication_check_done(
        &mut self,
        candidate: Lsn,
        check: S::Check,
    ) -> Result<(), RelayError> {
        self.checking = None;
        // A check that could not run is retried with back-off.
        self.guard.unchecked = match self.publication_checked(candidate, check)? {
            true => 0,
            false => self.guard.unchecked.saturating_add(1),
        };
        let interval = self.config.flags.status_interval;
        let wait = decide::next_publication_check(self.guard.unchecked, interval);
        self.guard.next_check = Instant::now() + wait;
        Ok(())
    }

    /// Whether to read on: room under the in-flight caps, and (`--cleanup delete`) in the
    /// ledger of rows to delete.
    fn can_read(&self) -> bool {
        let (window, bytes) = (self.tracker.window_len(), self.tracker.in_flight_bytes());
        self.gate.open(window, bytes) && !self.cleanup.as_ref().is_some_and(|c| c.ledger.full())
    }

    /// Takes the events already waiting in the stream's channel (a step's worth at most) without
    /// a pass through the `select!` and the frontier report each: that pass costs as much as
    /// the event.
    async fn on_buffered_events(&mut self) -> Result<(), RelayError> {
        for _ in 0..BUFFERED_EVENTS_PER_STEP {
            if self.stop_by.is_some() || !self.can_read() {
                break;
            }
            let Some(Some(event)) = self.stream.as_mut().map(|s| s.recv().now_or_never()) else {
                break;
            };
            self.on_event(event?).await?;
        }
        Ok(())
    }

    /// Processes delivery reports for `wait` or, without it, until nothing is in flight.
    /// Returns whether shutdown was requested.
    async fn handle_deliveries(&mut self, wait: Option<Duration>) -> Result<bool, RelayError> {
        let deadline = wait.map(|wait| Instant::now() + wait);
        while deadline.is_some() || self.tracker.window_len() > 0 {
            tokio::select! {
                biased;
                () = &mut self.shutdown, if self.stop_by.is_none() => {
                    self.begin_shutdown();
                    return Ok(true);
                }
                Some(delivery) = self.deliveries.recv() => {
                    self.on_delivery(delivery).await?;
                    self.observe();
                }
                outcome = self.registering.next(), if self.registering.active() => {
                    self.on_registered(outcome).await?;
                    self.observe();
                }
                () = sleep_until_some(deadline) => return Ok(false),
            }
        }
        Ok(false)
    }
}

/// PURE: how long to wait before the next attempt to start the stream: from `min`, doubling
/// after each failed start up to `max`; a standby polls every `max`; a stream that came up
/// starts over at `min`.
#[derive(Debug)]
struct Retry {
    min: Duration,
    max: Duration,
    backoff: Duration,
    /// Failures since the stream last came up.
    attempt: u64,
    /// Another process holds the slot.
    standby: bool,
}

impl Retry {
    fn new(min: Duration, max: Duration) -> Self {
        Retry {
            min,
            max,
            backoff: min,
            attempt: 0,
            standby: false,
        }
    }

    /// The stream came up.
    fn streaming(&mut self) {
        self.backoff = self.min;
        self.attempt = 0;
        self.standby = false;
    }

    /// A start failed and may succeed later: the wait before the next.
    fn failed(&mut self) -> Duration {
        self.attempt += 1;
        let wait = self.backoff;
        self.backoff = (self.backoff * 2).min(self.max);
        wait
    }

    /// A start found the slot held by another process: the wait before the next poll.
    fn standing_by(&mut self) -> Duration {
        self.standby = true;
        self.max
    }

    /// A stream that was up broke: the wait before reconnecting.
    fn broke(&mut self) -> Duration {
        self.attempt += 1;
        self.backoff
    }
}

/// Sleeps until `at`; never resolves for `None` (a disabled `select!` branch).
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The publication check in flight, when there is one (it runs beside the stream, like a
/// delete: a round trip to the server holds up neither reading nor acknowledgements).
async fn checked<C>(checking: &mut super::Checking<C>) -> (Lsn, C) {
    match checking {
        Some((candidate, check)) => (*candidate, check.await),
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_back_off_doubling_to_the_cap_and_start_over_once_streaming() {
        let second = Duration::from_secs(1);
        let mut retry = Retry::new(second, 4 * second);
        let waits: Vec<Duration> = (0..4).map(|_| retry.failed()).collect();
        assert_eq!(waits, [second, 2 * second, 4 * second, 4 * second]);
        assert_eq!(retry.attempt, 4);
        // A standby polls at the cap, and says so once.
        assert_eq!(retry.standing_by(), 4 * second);
        assert!(retry.standby);
        retry.streaming();
        assert_eq!(retry.attempt, 0);
        assert!(!retry.standby);
        // A broken stream reconnects after the shortest wait, and counts the attempt.
        assert_eq!(retry.broke(), second);
        assert_eq!(retry.attempt, 1);
        assert_eq!(retry.failed(), second);
        assert_eq!(retry.broke(), 2 * second);
    }
}
