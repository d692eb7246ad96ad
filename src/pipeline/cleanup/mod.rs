//! `--cleanup delete`, owned by the pipeline: which outbox rows may be deleted ([`Ledger`]:
//! the rows waiting, and when a held one is tried again), the rows' keys ([`tables`]), handing
//! them to the [`Deleter`] in batches, and how far the slot may move. Only the delete itself
//! is the Postgres side's, behind its [`Deleter`] trait ([`crate::source::deleter`]).
//!
//! A row may be deleted once everything it held reached Kafka: its event, and every event
//! before it, was acknowledged. A dead-letter record counts when it carries the payload (an
//! unmappable row's is its raw value); one without it (`outbox.payload.omitted`: the payload
//! is what the broker refused) keeps the row in the table, with a warning and
//! [`m::CLEANUP_KEPT_ROWS_TOTAL`]. Deleting a row before its transaction's commit arrives
//! loses nothing: the WAL keeps the insert, and a replay sends the event again and finds
//! nothing to delete; so one huge transaction's rows go while it streams.
//!
//! Invariant 5: the slot moves past a transaction only once all its rows, and all rows before
//! them, are gone. A row another session holds keeps the slot (and Postgres' WAL) before its
//! transaction while streaming goes on; at `--max-in-flight-events` rows from it on, reading
//! pauses (invariant 3). A delete is one future polled beside the stream and the delivery
//! reports, never awaited alone, so a slow or blocked delete holds up neither streaming nor a
//! shutdown; what a stop leaves undeleted is replayed, and deleted, after the restart.

mod ledger;
pub mod tables;

use std::collections::HashMap;
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use tokio::time::Instant;

use super::{Pipeline, RelayError};
use crate::lsn::Lsn;
use crate::observability::Chain;
use crate::observability::health::CleanupBacklog;
use crate::observability::metrics as m;
use crate::outbox::{DeadLetterInfo, OutboxRecord};
use crate::sink::exactly_once::ReadBack;
use crate::sink::{Sink, Ticket};
use crate::source::Source;
use crate::source::deleter::{DeleteFailure, Deleter, Table};

pub(crate) use ledger::Ledger;
pub use tables::Row;
use tables::Tables;

/// `--cleanup delete` in the pipeline: the tables' keys, the rows waiting, the deleter, and the
/// delete under way.
pub struct Cleanup {
    pub(super) tables: Tables,
    pub(super) ledger: Ledger<Row>,
    /// Taken while a batch is being deleted.
    deleter: Option<Box<dyn Deleter>>,
    /// The batch being deleted, which returns the deleter.
    deleting: Option<BoxFuture<'static, Deleted>>,
}

/// A batch's outcome, with the deleter and the batch.
pub(super) type Deleted = (
    Box<dyn Deleter>,
    Vec<(u64, Row)>,
    Result<Vec<usize>, DeleteFailure>,
);

impl Cleanup {
    /// `tables` deleted from by `deleter`.
    pub fn with(tables: Vec<Table>, deleter: Box<dyn Deleter>) -> Self {
        Cleanup {
            tables: Tables::new(tables),
            ledger: Ledger::new(Lsn::ZERO, usize::MAX, Duration::ZERO),
            deleter: Some(deleter),
            deleting: None,
        }
    }

    /// Ready for a slot confirmed at `confirmed`: reading pauses at `limit` rows waiting
    /// (`--max-in-flight-events`), and a row waits up to `interval` (`--status-interval`) for
    /// others to share its statement.
    pub(super) fn resuming(mut self, confirmed: Lsn, limit: usize, interval: Duration) -> Self {
        self.ledger = Ledger::new(confirmed, limit, interval);
        self
    }

    /// Starts deleting the next batch, if one is due.
    fn hand_over(&mut self, acked_below: Ticket, force: bool) {
        let batch = self.ledger.batch(acked_below.0, Instant::now(), force);
        if batch.is_empty() {
            return;
        }
        let Some(mut deleter) = self.deleter.take() else {
            return;
        };
        self.deleting = Some(
            async move {
                let outcome = delete(&mut *deleter, &batch).await;
                (deleter, batch, outcome)
            }
            .boxed(),
        );
    }
}

/// Deletes `rows` with `deleter`, one statement per table; returns the positions in `rows` of
/// those left in place.
async fn delete(
    deleter: &mut dyn Deleter,
    rows: &[(u64, Row)],
) -> Result<Vec<usize>, DeleteFailure> {
    let mut by_table: HashMap<&str, (&Table, Vec<usize>)> = HashMap::new();
    for (n, (_, (table, _))) in rows.iter().enumerate() {
        by_table
            .entry(table.name())
            .or_insert((table, Vec::new()))
            .1
            .push(n);
    }
    let mut held = Vec::new();
    for (table, positions) in by_table.into_values() {
        let keys: Vec<&str> = positions.iter().map(|&n| rows[n].1.1.as_str()).collect();
        let left = deleter.delete(table, &keys).await?;
        held.extend(left.into_iter().filter_map(|i| positions.get(i).copied()));
    }
    Ok(held)
}

/// The delete under way, if any: resolves when it is done; never without one.
pub(super) async fn deleted(cleanup: Option<&mut Cleanup>) -> Deleted {
    match cleanup.and_then(|c| c.deleting.as_mut()) {
        Some(deleting) => deleting.await,
        None => std::future::pending().await,
    }
}

impl<S: Source, K: Sink + ReadBack> Pipeline<S, K> {
    /// Hands the deleter the next batch, if one is due (`force`: now).
    pub(super) fn hand_over(&mut self, force: bool) {
        let acked_below = self.tracker.acked_below();
        if let Some(cleanup) = self.cleanup.as_mut() {
            cleanup.hand_over(acked_below, force);
        }
    }

    /// A batch was deleted, or not: a permanent failure stops the relay.
    pub(super) fn on_deleted(
        &mut self,
        (deleter, batch, outcome): Deleted,
    ) -> Result<(), RelayError> {
        let Some(cleanup) = self.cleanup.as_mut() else {
            return Ok(());
        };
        cleanup.deleting = None;
        cleanup.deleter = Some(deleter);
        let newly = cleanup.ledger.none_held();
        let deleted = cleanup.ledger.done(batch, &outcome, Instant::now());
        metrics::counter!(m::CLEANUP_DELETED_ROWS_TOTAL).increment(deleted as u64);
        let held = cleanup.ledger.held();
        match outcome {
            Err(failure) if failure.permanent => {
                return Err(RelayError::Cleanup {
                    frontier: self.reportable(),
                    source: failure,
                });
            }
            Err(failure) => tracing::warn!(
                table = %failure.table,
                error = %Chain(&failure.source),
                rows = held,
                retry_in = %humantime::format_duration(cleanup.ledger.retry_in()),
                "--cleanup delete: cannot delete relayed rows; retrying. The slot is not moved \
                 past their transactions meanwhile"
            ),
            Ok(_) if held > 0 && newly => {
                let first = cleanup.ledger.first_held();
                let (table, key) = first.map_or(("", ""), |(t, k)| (t.name(), k.as_str()));
                tracing::warn!(
                    rows = held,
                    table = %table,
                    key = %key,
                    "--cleanup delete: rows are held by another session (an open transaction \
                     locked, updated or deleted them); retrying every second. The slot is not \
                     moved past their transactions meanwhile, and reading pauses once \
                     --max-in-flight-events rows wait"
                );
            }
            Ok(_) => {}
        }
        Ok(())
    }

    /// Under `--cleanup delete`, the row of the event with `ticket` stays in the table: its
    /// dead-letter `record` does not carry all it held.
    pub(super) fn keep_row(
        &mut self,
        ticket: Ticket,
        record: &OutboxRecord,
        info: &DeadLetterInfo,
    ) {
        let Some(cleanup) = self.cleanup.as_mut() else {
            return;
        };
        if cleanup.ledger.keep(ticket.0) {
            metrics::counter!(m::CLEANUP_KEPT_ROWS_TOTAL).increment(1);
            tracing::warn!(
                lsn = %info.lsn,
                id = %record.id_text(),
                table = %info.table,
                why = %info.payload_omitted.as_deref().unwrap_or_default(),
                "--cleanup delete: keeping the outbox row: its event was dead-lettered without \
                 its payload, so the row holds the only copy. Delete it yourself once handled"
            );
        }
    }

    /// At shutdown: hands over and waits for what may be deleted now, until `deadline`; rows
    /// held by another session are left to the replay after restart.
    pub(super) async fn drain_cleanup(&mut self, deadline: Instant) -> Result<(), RelayError> {
        let acked_below = self.tracker.acked_below().0;
        while self
            .cleanup
            .as_ref()
            .is_some_and(|c| c.ledger.busy(acked_below))
        {
            self.hand_over(true);
            match tokio::time::timeout_at(deadline, deleted(self.cleanup.as_mut())).await {
                Ok(done) => self.on_deleted(done)?,
                Err(_) => break,
            }
        }
        Ok(())
    }

    /// The cleanup's backlog for the observer, if cleanup.
    pub(super) fn cleanup_backlog(&self) -> Option<CleanupBacklog> {
        self.cleanup.as_ref().map(|c| c.ledger.backlog())
    }
}
