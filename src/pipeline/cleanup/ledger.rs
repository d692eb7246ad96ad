//! PURE: the rows of relayed events waiting to be deleted, and when a held or failed row is
//! tried again ([`retry_after`]); time is an input.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use crate::lsn::Lsn;
use crate::observability::health::CleanupBacklog;

/// Most rows handed to the deleter at once; as many waiting are deleted at once.
const BATCH: usize = 1000;

/// Where a row is.
#[derive(Debug)]
enum State<R> {
    /// Not handed to the deleter yet.
    Waiting(R),
    /// In the batch being deleted.
    Handed,
    /// Left in place by a delete (held by another session, or the delete failed).
    Held(R),
    /// Deleted, or kept in the table for good.
    Gone,
}

/// PURE: the rows of relayed events waiting to be deleted, by ticket, with the transactions
/// they belong to, in the spirit of [`crate::pipeline::ack::AckTracker`]; time is an input.
#[derive(Debug)]
pub(crate) struct Ledger<R> {
    /// From the oldest row not gone on, by ticket.
    rows: VecDeque<(u64, State<R>)>,
    /// Committed transactions not yet clear: end LSN, and the ticket after their last row.
    /// Transactions without rows merge into the entry before them.
    commits: VecDeque<(Lsn, u64)>,
    /// The ticket after the last row registered.
    next: u64,
    /// The ticket after the last committed transaction's rows: rows from it on are open.
    committed: u64,
    /// Rows from this ticket on were never handed over.
    fresh: u64,
    /// Every row of a transaction ending at or before this is gone.
    cleared: Lsn,
    held: usize,
    held_since: Option<Instant>,
    /// Failed deletes in a row.
    failures: u32,
    in_flight: bool,
    /// When waiting rows go even if fewer than a batch.
    due: Option<Instant>,
    /// When held rows are tried again.
    retry_at: Option<Instant>,
    /// `--max-in-flight-events`: reading pauses at this many rows.
    limit: usize,
    /// `--status-interval`: how long a row may wait for others to share its statement.
    interval: Duration,
}

impl<R> Ledger<R> {
    /// Nothing waiting; the slot is confirmed at `confirmed`.
    pub(crate) fn new(confirmed: Lsn, limit: usize, interval: Duration) -> Self {
        Ledger {
            rows: VecDeque::new(),
            commits: VecDeque::new(),
            next: 0,
            committed: 0,
            fresh: 0,
            cleared: confirmed,
            held: 0,
            held_since: None,
            failures: 0,
            in_flight: false,
            due: None,
            retry_at: None,
            limit,
            interval,
        }
    }

    /// A row of the open transaction, whose event takes `ticket`; with nothing waiting, every
    /// transaction up to `received` (the end of the last one received) is clear.
    pub(crate) fn row(&mut self, ticket: u64, row: R, received: Lsn) {
        if self.rows.is_empty() {
            self.cleared = self.cleared.max(received);
        }
        self.rows.push_back((ticket, State::Waiting(row)));
        self.next = ticket + 1;
        self.check();
    }

    /// The open transaction committed, ending at `end`.
    pub(crate) fn commit(&mut self, end: Lsn) {
        match self.commits.back_mut() {
            Some(last) if last.1 == self.next => last.0 = end,
            _ => self.commits.push_back((end, self.next)),
        }
        self.committed = self.next;
        self.advance();
    }

    /// The open transaction will be replayed from its start, its rows under new tickets.
    pub(crate) fn abandon_open(&mut self) {
        while let Some((ticket, state)) = self.rows.back()
            && *ticket >= self.committed
        {
            self.held -= usize::from(matches!(state, State::Held(_)));
            self.rows.pop_back();
        }
        self.next = self.committed;
        self.advance();
    }

    /// The stream resumes at `to`, before the last transaction received (a promotion): as
    /// [`crate::pipeline::ack::AckTracker::rewind`], nothing from the old server clears past `to`.
    pub(crate) fn rewind(&mut self, to: Lsn) {
        self.cleared = self.cleared.min(to);
        for (end, _) in &mut self.commits {
            *end = (*end).min(to);
        }
    }

    /// The row of `ticket` stays in the table for good; whether there is one.
    pub(crate) fn keep(&mut self, ticket: u64) -> bool {
        let Some(i) = self.position(ticket) else {
            return false;
        };
        let state = std::mem::replace(&mut self.rows[i].1, State::Gone);
        self.held -= usize::from(matches!(state, State::Held(_)));
        self.advance();
        matches!(state, State::Waiting(_) | State::Held(_))
    }

    fn position(&self, ticket: u64) -> Option<usize> {
        self.rows.binary_search_by_key(&ticket, |(t, _)| *t).ok()
    }

    /// The next batch for the deleter when one is due at `now` (`force`: now, however few):
    /// rows whose events, and all before them, were acknowledged (tickets below
    /// `acked_below`), and held rows when their retry is due.
    pub(crate) fn batch(&mut self, acked_below: u64, now: Instant, force: bool) -> Vec<(u64, R)> {
        if self.in_flight {
            return Vec::new();
        }
        let start = self.rows.partition_point(|(t, _)| *t < self.fresh);
        let end = self.rows.partition_point(|(t, _)| *t < acked_below);
        let waiting = end.saturating_sub(start);
        let retry = self.held > 0 && (force || self.retry_at.is_some_and(|at| at <= now));
        // A full batch, or a full ledger, goes at once.
        if waiting > 0 && !retry && !force && waiting < BATCH && !self.full() {
            let due = *self.due.get_or_insert(now + self.interval);
            if now < due {
                return Vec::new();
            }
        }
        if waiting == 0 && !retry {
            // The rows it was set for went another way (abandoned, kept): nothing is due.
            self.due = None;
            return Vec::new();
        }
        let mut batch = Vec::new();
        let mut take = |(ticket, state): &mut (u64, State<R>), from_held: bool| {
            let row = match std::mem::replace(state, State::Handed) {
                State::Waiting(row) if !from_held => row,
                State::Held(row) if from_held => row,
                other => {
                    *state = other;
                    return;
                }
            };
            batch.push((*ticket, row));
        };
        if retry {
            self.rows.iter_mut().for_each(|row| take(row, true));
            self.held = 0;
            self.retry_at = None;
        }
        let fresh = self.rows.range_mut(start..end).take(BATCH);
        let mut last = None;
        for row in fresh {
            last = Some(row.0);
            take(row, false);
        }
        if let Some(last) = last {
            self.fresh = last + 1;
        }
        self.due = None;
        self.in_flight = !batch.is_empty();
        self.check();
        batch
    }

    /// What the deleter did with `batch` at `now`: `held` lists the positions of the rows it
    /// left in place; a failure left them all. Returns how many rows it deleted.
    pub(crate) fn done<E>(
        &mut self,
        batch: Vec<(u64, R)>,
        held: &Result<Vec<usize>, E>,
        now: Instant,
    ) -> usize {
        self.in_flight = false;
        let mut deleted = 0;
        for (n, (ticket, row)) in batch.into_iter().enumerate() {
            // Gone when its transaction was abandoned meanwhile.
            let Some(i) = self.position(ticket) else {
                continue;
            };
            let left = held.as_ref().map_or(true, |held| held.contains(&n));
            self.rows[i].1 = match left {
                true => State::Held(row),
                false => State::Gone,
            };
            self.held += usize::from(left);
            deleted += usize::from(!left);
        }
        self.failures = match held {
            Ok(_) => 0,
            Err(_) => self.failures + 1,
        };
        match self.held {
            0 => self.held_since = None,
            _ => {
                self.held_since.get_or_insert(now);
                self.retry_at = Some(now + retry_after(self.failures));
            }
        }
        self.advance();
        deleted
    }

    /// How many rows a delete left in place.
    pub(crate) fn held(&self) -> usize {
        self.held
    }

    /// Whether no row was left in place since the last time none was.
    pub(crate) fn none_held(&self) -> bool {
        self.held_since.is_none()
    }

    /// How long held rows wait before they are tried again, after the failures so far.
    pub(crate) fn retry_in(&self) -> Duration {
        retry_after(self.failures)
    }

    /// The first row left in place.
    pub(crate) fn first_held(&self) -> Option<&R> {
        self.rows.iter().find_map(|(_, s)| match s {
            State::Held(row) => Some(row),
            _ => None,
        })
    }

    /// Drops gone rows from the front and clears the transactions before the first left.
    fn advance(&mut self) {
        while self
            .rows
            .front()
            .is_some_and(|(_, s)| matches!(s, State::Gone))
        {
            self.rows.pop_front();
        }
        let first = self.rows.front().map_or(u64::MAX, |(t, _)| *t);
        while let Some(&(end, end_ticket)) = self.commits.front()
            && end_ticket <= first
        {
            self.cleared = self.cleared.max(end);
            self.commits.pop_front();
        }
        self.check();
    }

    /// The highest position the slot may take, while rows wait.
    pub(crate) fn cleared(&self) -> Option<Lsn> {
        (!self.rows.is_empty()).then_some(self.cleared)
    }

    /// Whether reading must pause until rows go.
    pub(crate) fn full(&self) -> bool {
        self.rows.len() >= self.limit
    }

    /// When [`Ledger::batch`] may have rows to hand over without anything else happening.
    pub(crate) fn wake(&self) -> Option<Instant> {
        let retry = self.retry_at.filter(|_| self.held > 0);
        let at = [self.due, retry].into_iter().flatten().min();
        at.filter(|_| !self.in_flight)
    }

    /// Whether a batch is being deleted, or rows whose events were all acknowledged wait.
    pub(crate) fn busy(&self, acked_below: u64) -> bool {
        self.in_flight
            || self
                .rows
                .iter()
                .any(|(t, s)| *t < acked_below && matches!(s, State::Waiting(_)))
    }

    /// For readiness and metrics.
    pub(crate) fn backlog(&self) -> CleanupBacklog {
        CleanupBacklog {
            rows: self.rows.len(),
            full: self.full(),
            held: self.held,
            held_since: self.held_since.map(Instant::into_std),
            failing: self.failures > 0,
        }
    }

    /// The ledger's invariants, after every change in debug builds (the simulation stops at the
    /// step that broke one); recounted in small ledgers only, to stay O(1).
    fn check(&self) {
        let front = self.rows.front();
        let back = self.rows.back();
        debug_assert!(
            front.is_none_or(|(_, s)| !matches!(s, State::Gone)),
            "a gone row at the front"
        );
        debug_assert!(
            back.is_none_or(|(t, _)| *t < self.next),
            "a row past the last ticket {}",
            self.next
        );
        debug_assert!(
            self.commits
                .front()
                .is_none_or(|(_, end)| front.is_some_and(|(t, _)| end > t)),
            "a transaction whose rows are all gone is not cleared"
        );
        debug_assert!(
            self.rows.len() > 64
                || (self
                    .rows
                    .iter()
                    .zip(self.rows.iter().skip(1))
                    .all(|(a, b)| a.0 < b.0)
                    && self
                        .commits
                        .iter()
                        .zip(self.commits.iter().skip(1))
                        .all(|(a, b)| a < b)
                    && self
                        .rows
                        .iter()
                        .filter(|(_, s)| matches!(s, State::Held(_)))
                        .count()
                        == self.held),
            "rows or commits out of order, or {} held rows miscounted",
            self.held
        );
    }
}

/// How long a held or failed row waits before it is tried again: a second, doubling after
/// each failed delete in a row, up to 30 s.
pub(crate) fn retry_after(failures: u32) -> Duration {
    Duration::from_secs(1 << failures.min(5)).min(Duration::from_secs(30))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    fn ledger() -> Ledger<&'static str> {
        Ledger::new(Lsn(100), 5, SECOND)
    }

    fn tickets(batch: &[(u64, &str)]) -> Vec<u64> {
        batch.iter().map(|(t, _)| *t).collect()
    }

    #[test]
    fn rows_go_once_acknowledged_and_the_slot_follows_the_deletes() {
        let now = Instant::now();
        let mut l = ledger();
        l.row(0, "a", Lsn(100));
        l.row(1, "b", Lsn(100));
        l.commit(Lsn(120));
        assert_eq!(l.cleared(), Some(Lsn(100)));
        // Nothing acknowledged: nothing to delete.
        assert!(l.batch(0, now, true).is_empty());
        // The first acknowledged: it waits a status interval for company.
        assert!(l.batch(1, now, false).is_empty());
        assert_eq!(l.wake(), Some(now + SECOND));
        let batch = l.batch(2, now + SECOND, false);
        assert_eq!(tickets(&batch), [0, 1]);
        assert_eq!(l.cleared(), Some(Lsn(100)), "not deleted yet");
        assert_eq!(l.done::<()>(batch, &Ok(vec![]), now), 2);
        assert_eq!(
            l.cleared(),
            None,
            "nothing waits: the frontier alone decides"
        );
    }

    #[test]
    fn a_held_row_holds_the_slot_before_its_transaction_while_the_rest_go() {
        let now = Instant::now();
        let mut l = ledger();
        l.row(0, "locked", Lsn(100));
        l.commit(Lsn(120));
        l.row(1, "b", Lsn(120));
        l.commit(Lsn(140));
        // A transaction without rows merges into the one before.
        l.commit(Lsn(150));
        let batch = l.batch(2, now, true);
        assert_eq!(l.done::<()>(batch, &Ok(vec![0]), now), 1);
        let backlog = l.backlog();
        assert_eq!((backlog.rows, backlog.held, backlog.failing), (2, 1, false));
        assert_eq!(l.cleared(), Some(Lsn(100)));
        // Retried a second later; still held.
        assert!(l.batch(2, now, false).is_empty());
        assert_eq!(l.wake(), Some(now + SECOND));
        let batch = l.batch(2, now + SECOND, false);
        assert_eq!(tickets(&batch), [0]);
        l.done::<()>(batch, &Ok(vec![0]), now + SECOND);
        assert_eq!(
            l.backlog().held_since,
            Some(now.into_std()),
            "held since the first time"
        );
        // Released: both transactions clear at once.
        let batch = l.batch(2, now + 2 * SECOND, false);
        l.done::<()>(batch, &Ok(vec![]), now + 2 * SECOND);
        assert_eq!(l.cleared(), None);
        assert_eq!(l.backlog(), CleanupBacklog::default());
    }

    #[test]
    fn failed_deletes_back_off_and_keep_every_row() {
        let now = Instant::now();
        let mut l = ledger();
        l.row(0, "a", Lsn(100));
        l.row(1, "b", Lsn(100));
        l.commit(Lsn(120));
        for (n, wait) in [(1u32, 2), (2, 4), (3, 8)] {
            let batch = l.batch(2, now, true);
            assert_eq!(tickets(&batch), [0, 1], "attempt {n}");
            assert_eq!(l.done(batch, &Err(()), now), 0);
            assert_eq!(l.wake(), Some(now + Duration::from_secs(wait)));
            assert!(l.backlog().failing);
            assert_eq!(l.cleared(), Some(Lsn(100)));
        }
        let batch = l.batch(2, now + Duration::from_secs(8), false);
        l.done::<()>(batch, &Ok(vec![]), now);
        assert!(!l.backlog().failing);
        assert_eq!(l.cleared(), None);
    }

    #[test]
    fn reading_pauses_at_the_limit_counting_gone_rows_behind_a_held_one() {
        let now = Instant::now();
        let mut l = ledger();
        for t in 0..5 {
            l.row(t, "r", Lsn(100));
            l.commit(Lsn(110 + 10 * t));
        }
        assert!(l.full());
        let batch = l.batch(5, now, false);
        assert_eq!(
            batch.len(),
            5,
            "a full ledger does not wait for the interval"
        );
        l.done::<()>(batch, &Ok(vec![0]), now);
        // Four deleted, but the slot waits for the first: the limit still holds.
        assert!(l.full());
        assert_eq!(l.cleared(), Some(Lsn(100)));
        let batch = l.batch(5, now + SECOND, false);
        l.done::<()>(batch, &Ok(vec![]), now);
        assert!(!l.full());
        assert_eq!(l.cleared(), None);
    }

    #[test]
    fn kept_rows_are_never_handed_over_and_do_not_hold_the_slot() {
        let now = Instant::now();
        let mut l = ledger();
        l.row(3, "big", Lsn(100));
        l.row(4, "small", Lsn(100));
        assert!(l.keep(3));
        assert!(!l.keep(3), "once");
        assert!(!l.keep(9), "no row");
        l.commit(Lsn(120));
        let batch = l.batch(5, now, true);
        assert_eq!(tickets(&batch), [4]);
        l.done::<()>(batch, &Ok(vec![]), now);
        assert_eq!(l.cleared(), None);
    }

    #[test]
    fn an_abandoned_transaction_drops_its_rows_and_ignores_their_late_outcome() {
        let now = Instant::now();
        let mut l = ledger();
        l.row(0, "a", Lsn(100));
        l.commit(Lsn(120));
        l.row(1, "open", Lsn(120));
        // Rows of the open transaction go once acknowledged, before its commit arrives.
        let batch = l.batch(2, now, true);
        assert_eq!(tickets(&batch), [0, 1]);
        l.abandon_open();
        l.done::<()>(batch, &Ok(vec![0, 1]), now);
        assert_eq!(l.backlog().held, 1, "the committed row only");
        // The replay registers the row again under a new ticket.
        l.row(5, "open", Lsn(120));
        l.commit(Lsn(130));
        let batch = l.batch(6, now + SECOND, false);
        assert_eq!(tickets(&batch), [0, 5]);
        l.done::<()>(batch, &Ok(vec![]), now);
        assert_eq!(l.cleared(), None);
    }

    #[test]
    fn a_due_time_does_not_outlive_the_rows_it_was_set_for() {
        let now = Instant::now();
        let mut l = ledger();
        l.row(0, "open", Lsn(100));
        assert!(l.batch(1, now, false).is_empty());
        assert_eq!(l.wake(), Some(now + SECOND));
        // Its transaction is replayed: no row waits, so no wake-up may stay due (the
        // pipeline's loop would spin on it).
        l.abandon_open();
        assert!(l.batch(1, now + SECOND, false).is_empty());
        assert_eq!(l.wake(), None);
    }

    #[test]
    fn with_nothing_waiting_the_slot_may_be_anywhere_the_frontier_is() {
        let mut l = ledger();
        l.commit(Lsn(110));
        assert_eq!(l.cleared(), None);
        // A row after a keepalive confirmed 200: the slot may stay there.
        l.row(0, "a", Lsn(200));
        assert_eq!(l.cleared(), Some(Lsn(200)));
    }

    #[test]
    fn a_batch_takes_at_most_a_thousand_rows_and_goes_at_once_when_full() {
        let now = Instant::now();
        let mut l = Ledger::new(Lsn(0), 5000, SECOND);
        for t in 0..1500 {
            l.row(t, "r", Lsn(0));
        }
        l.commit(Lsn(10));
        let batch = l.batch(1500, now, false);
        assert_eq!(batch.len(), 1000, "a full batch does not wait");
        assert!(l.batch(1500, now, true).is_empty(), "one at a time");
        l.done::<()>(batch, &Ok(vec![]), now);
        assert_eq!(l.batch(1500, now, true).len(), 500);
    }

    #[test]
    fn retries_back_off_to_thirty_seconds() {
        let waits: Vec<u64> = (0..8).map(|n| retry_after(n).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 30, 30, 30]);
    }
}
