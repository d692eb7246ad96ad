//! The stream loop: (re)connecting with capped exponential backoff, standby
//! takeover, a promotion's rewind, and reading under the in-flight caps until
//! shutdown (which reads on to the open transaction's commit).

use std::time::Duration;

use super::{Pipeline, RelayError};
use crate::sink::Sink;
use crate::source::{Recovery, Source, SourceError, Stream};

impl<S: Source, K: Sink> Pipeline<S, K> {
    /// Connects, streams, and on a transient failure reconnects with capped
    /// exponential backoff, keeping in-flight deliveries and the tracker.
    pub(super) async fn run_streams(&mut self) -> Result<(), RelayError> {
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
                        self.checked = self.checked.min(stream.started_at());
                    }
                    let new_source = self
                        .exactly_once
                        .as_mut()
                        .is_some_and(|eo| eo.follow(stream.server()));
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
                    if standby || new_source {
                        // A standby: the active relay wrote past the WAL end
                        // seen at start-up, and its records are not another
                        // writer's.
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
    pub(super) async fn refresh_exactly_once(&mut self) {
        if self.exactly_once.is_none() {
            return;
        }
        let wal_end = self.source.wal_end().await;
        if let Some(eo) = self.exactly_once.as_mut() {
            eo.reset(wal_end);
        }
    }

    // `&mut`: the pipeline future must stay `Send`, and `Pipeline` is not `Sync`.
    pub(super) async fn fatal_source(&mut self, e: SourceError) -> RelayError {
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
    pub(super) async fn pause(&mut self, duration: Duration) -> Result<bool, RelayError> {
        let deadline = tokio::time::Instant::now() + duration;
        self.handle_deliveries(Some(deadline)).await
    }

    /// Streams until shutdown. A shutdown in the middle of a transaction keeps
    /// reading to its commit (within `--shutdown-timeout`): stopping before it
    /// would leave the frontier before the transaction and a restart would
    /// send all of it again.
    pub(super) async fn stream_until_shutdown(&mut self) -> Result<(), RelayError> {
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
            let check_at =
                (self.unverified() > self.checked).then_some(self.next_publication_check);
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

    /// Waits until every in-flight record is acknowledged. Returns whether
    /// shutdown was requested meanwhile.
    pub(super) async fn drain_in_flight(&mut self) -> Result<bool, RelayError> {
        self.handle_deliveries(None).await
    }

    /// Processes delivery reports until `deadline` passes or, without one,
    /// until nothing is in flight. Returns whether shutdown was requested.
    async fn handle_deliveries(
        &mut self,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<bool, RelayError> {
        while deadline.is_some() || self.tracker.window_len() > 0 {
            tokio::select! {
                biased;
                () = &mut self.shutdown, if !self.shutting_down => {
                    self.begin_shutdown();
                    return Ok(true);
                }
                Some(delivery) = self.deliveries.recv() => self.on_delivery(delivery).await?,
                () = sleep_until_some(deadline), if deadline.is_some() => return Ok(false),
            }
        }
        Ok(false)
    }
}

/// Sleeps until `at`; never resolves for `None` (a disabled `select!` branch).
async fn sleep_until_some(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
