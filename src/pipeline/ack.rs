//! PURE: the ack frontier.
//!
//! Every event handed to Kafka gets a ticket, its number in stream order; acks come back in any
//! order. The tracker keeps a window of delivered flags from the oldest undelivered ticket on,
//! and a FIFO of committed transactions with the ticket that ends each. The frontier is the end
//! LSN of the longest fully delivered prefix. Transactions without events merge into the entry
//! before them, so the FIFO is as long as the transactions with events in flight, and every
//! operation is O(1) amortised. What the tracker keeps of a sent event (`T`) is the caller's,
//! and so is the clock: it is told when each event was handed over.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use crate::lsn::Lsn;
use crate::sink::Ticket;

/// The stream broke the pgoutput protocol's framing: stop rather than guess.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AckError {
    /// A Begin arrived while a transaction was open.
    #[error("transaction {new} began while transaction {open} was still open")]
    NestedBegin {
        /// Commit LSN of the open transaction.
        open: Lsn,
        /// Commit LSN of the one that began.
        new: Lsn,
    },
    /// An event or Commit arrived with no transaction open.
    #[error("{what} outside a transaction")]
    NoTransaction {
        /// What arrived: an event, a Commit.
        what: &'static str,
    },
    /// A commit ended at or before the frontier or a previous commit.
    #[error("commit end {end} is not after the previous position {previous}")]
    NonMonotonicCommit {
        /// The frontier or the previous commit's end.
        previous: Lsn,
        /// This commit's end LSN.
        end: Lsn,
    },
    /// An ack for a ticket that is not in flight (unknown, or acked twice).
    #[error("delivery report for ticket {0} which is not in flight")]
    UnknownTicket(u64),
}

/// One ticket: where its event came from, for errors, and its delivery.
#[derive(Debug)]
struct Slot<T> {
    commit_lsn: Lsn,
    table: Arc<str>,
    bytes: usize,
    delivered: bool,
    /// The caller's record of the hand-over to the producer, and when it was, until the ack.
    sent: Option<(T, Instant)>,
}

/// Committed transactions up to `end_lsn`: done once every ticket below `end_seq` is.
#[derive(Debug)]
struct Committed {
    end_seq: u64,
    end_lsn: Lsn,
}

/// Tracks in-flight events, each with a `T` from its hand-over to its ack, and computes the
/// ack frontier.
#[derive(Debug)]
pub struct AckTracker<T> {
    /// Every ticket below this is delivered; the window holds the rest.
    base: u64,
    window: VecDeque<Slot<T>>,
    committed: VecDeque<Committed>,
    /// The open transaction's commit LSN.
    open: Option<Lsn>,
    frontier: Lsn,
    last_end: Lsn,
    in_flight_bytes: usize,
    in_flight_events: usize,
}

impl<T> AckTracker<T> {
    /// Starts at the slot's confirmed position; the frontier never goes below it.
    pub fn new(confirmed: Lsn) -> Self {
        AckTracker {
            base: 0,
            window: VecDeque::new(),
            committed: VecDeque::new(),
            open: None,
            frontier: confirmed,
            last_end: confirmed,
            in_flight_bytes: 0,
            in_flight_events: 0,
        }
    }

    fn next_seq(&self) -> u64 {
        self.base + self.window.len() as u64
    }

    /// The ticket the next event takes.
    pub fn next_ticket(&self) -> Ticket {
        Ticket(self.next_seq())
    }

    /// Every ticket below this one is acknowledged.
    pub fn acked_below(&self) -> Ticket {
        Ticket(self.base)
    }

    /// A transaction begins; `commit_lsn` is pgoutput's `final_lsn`.
    pub fn begin(&mut self, commit_lsn: Lsn) -> Result<(), AckError> {
        if let Some(open) = self.open {
            return Err(AckError::NestedBegin {
                open,
                new: commit_lsn,
            });
        }
        self.open = Some(commit_lsn);
        Ok(())
    }

    /// An event of the open transaction, from outbox `table`, is about to go to the producer.
    pub fn push(&mut self, bytes: usize, table: &Arc<str>) -> Result<Ticket, AckError> {
        let Some(commit_lsn) = self.open else {
            return Err(AckError::NoTransaction { what: "an event" });
        };
        let ticket = Ticket(self.next_seq());
        self.window.push_back(Slot {
            commit_lsn,
            table: Arc::clone(table),
            bytes,
            delivered: false,
            sent: None,
        });
        self.in_flight_bytes += bytes;
        self.in_flight_events += 1;
        self.check();
        Ok(ticket)
    }

    /// The open transaction committed, ending at `end_lsn`.
    pub fn commit(&mut self, end_lsn: Lsn) -> Result<(), AckError> {
        self.open
            .take()
            .ok_or(AckError::NoTransaction { what: "a commit" })?;
        if end_lsn <= self.last_end {
            return Err(AckError::NonMonotonicCommit {
                previous: self.last_end,
                end: end_lsn,
            });
        }
        self.last_end = end_lsn;
        let end_seq = self.next_seq();
        // No event since the previous entry: done exactly when it is, so extend it.
        match self.committed.back_mut() {
            Some(last) if last.end_seq == end_seq => last.end_lsn = end_lsn,
            _ => self.committed.push_back(Committed { end_seq, end_lsn }),
        }
        self.advance();
        Ok(())
    }

    /// The stream broke mid-transaction: forget the open transaction. Its events stay in
    /// flight, and its replay cannot be confirmed before them: its tickets come after theirs.
    pub fn abandon_open(&mut self) {
        self.open = None;
    }

    /// The stream resumes at `to`, before the last transaction received (a promoted server
    /// whose WAL may not reach that far): nothing from the old server may move the frontier
    /// past `to`, since the new server's transactions from there are still to come.
    pub fn rewind(&mut self, to: Lsn) {
        self.last_end = self.last_end.min(to);
        self.frontier = self.frontier.min(to);
        for tx in &mut self.committed {
            tx.end_lsn = tx.end_lsn.min(to);
        }
        self.check();
    }

    /// Where a new stream starts: the end of the last transaction received or keepalive confirmed.
    pub fn resume_lsn(&self) -> Lsn {
        self.last_end
    }

    /// The window index of `ticket`, delivered or not.
    fn index(&self, ticket: Ticket) -> Option<usize> {
        let idx = usize::try_from(ticket.0.checked_sub(self.base)?).ok()?;
        (idx < self.window.len()).then_some(idx)
    }

    /// The commit LSN and outbox table of a ticket in the window, for errors.
    pub fn origin(&self, ticket: Ticket) -> Option<(Lsn, &Arc<str>)> {
        let slot = &self.window[self.index(ticket)?];
        Some((slot.commit_lsn, &slot.table))
    }

    /// The slot of `ticket` while it awaits its ack.
    fn undelivered(&mut self, ticket: Ticket) -> Option<&mut Slot<T>> {
        let idx = self.index(ticket)?;
        Some(&mut self.window[idx]).filter(|slot| !slot.delivered)
    }

    /// `ticket` was handed to the producer `now`; `sent` is returned with its ack.
    pub fn sent(&mut self, ticket: Ticket, sent: T, now: Instant) {
        if let Some(slot) = self.undelivered(ticket) {
            slot.sent = Some((sent, now));
        }
    }

    /// When the oldest unacknowledged event was handed over (`/readyz`'s staleness).
    pub fn oldest_sent(&self) -> Option<Instant> {
        // An acked slot's record is cleared.
        self.window.iter().find_map(|s| Some(s.sent.as_ref()?.1))
    }

    /// The broker acknowledged `ticket`: what [`AckTracker::sent`] recorded for it, with its size.
    pub fn ack(&mut self, ticket: Ticket) -> Result<Option<(T, usize)>, AckError> {
        let slot = self
            .undelivered(ticket)
            .ok_or(AckError::UnknownTicket(ticket.0))?;
        slot.delivered = true;
        let sent = slot.sent.take().map(|(sent, _)| (sent, slot.bytes));
        self.in_flight_bytes -= slot.bytes;
        self.in_flight_events -= 1;
        while self.window.front().is_some_and(|s| s.delivered) {
            self.window.pop_front();
            self.base += 1;
        }
        self.advance();
        Ok(sent)
    }

    /// A keepalive reported the server's WAL end. Confirming it when nothing is in flight or
    /// open keeps an idle outbox from pinning WAL.
    pub fn keepalive(&mut self, wal_end: Lsn) {
        if self.is_idle() && wal_end > self.frontier {
            self.frontier = wal_end;
            self.last_end = self.last_end.max(wal_end);
        }
        self.check();
    }

    fn advance(&mut self) {
        while let Some(tx) = self.committed.front()
            && tx.end_seq <= self.base
        {
            self.frontier = self.frontier.max(tx.end_lsn);
            self.committed.pop_front();
        }
        self.check();
    }

    /// The ledger's invariants, after every change in debug builds, so the simulation stops at
    /// the step that broke one. O(1): the counts are recounted in small windows only.
    fn check(&self) {
        let (front, back) = (self.committed.front(), self.committed.back());
        let (frontier, last_end) = (self.frontier, self.last_end);
        debug_assert!(
            frontier <= last_end,
            "frontier {frontier} past the last end {last_end}"
        );
        debug_assert!(
            front.is_none_or(|f| frontier <= f.end_lsn && f.end_seq > self.base),
            "the oldest committed entry is already covered by frontier {frontier}"
        );
        debug_assert!(
            front.zip(back).is_none_or(|(f, b)| f.end_lsn <= b.end_lsn
                && b.end_lsn <= last_end
                && b.end_seq <= self.next_seq()),
            "commit ends out of order, or past the last end {last_end}"
        );
        let undelivered = self.window.iter().filter(|s| !s.delivered);
        let (events, bytes) = (self.in_flight_events, self.in_flight_bytes);
        debug_assert!(
            self.window.front().is_none_or(|s| !s.delivered)
                && self.window.is_empty() == (events == 0)
                && events <= self.window.len()
                && (events > 0 || bytes == 0)
                && (self.window.len() > 64
                    || (
                        undelivered.clone().count(),
                        undelivered.map(|s| s.bytes).sum()
                    ) == (events, bytes)),
            "{events} events, {bytes} bytes in flight disagree with a window of {}",
            self.window.len()
        );
    }

    /// The highest LSN safe to report to Postgres as flushed.
    pub fn frontier(&self) -> Lsn {
        self.frontier
    }

    /// Events handed to the producer and not yet acknowledged.
    pub fn in_flight_events(&self) -> usize {
        self.in_flight_events
    }

    /// Tickets from the oldest unacknowledged one on: an O(1) bound of the in-flight count.
    pub fn window_len(&self) -> usize {
        self.window.len()
    }

    /// Key and value bytes handed to the producer and not yet acknowledged.
    pub fn in_flight_bytes(&self) -> usize {
        self.in_flight_bytes
    }

    /// No transaction open, nothing in flight, nothing waiting to be confirmed.
    pub fn is_idle(&self) -> bool {
        self.open.is_none() && self.window.is_empty() && self.committed.is_empty()
    }

    /// Whether a transaction is open.
    pub fn in_transaction(&self) -> bool {
        self.open.is_some()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn table() -> Arc<str> {
        Arc::from("public.outbox")
    }

    fn tx(t: &mut AckTracker<()>, commit: u64, events: usize, end: u64) -> Vec<Ticket> {
        t.begin(Lsn(commit)).unwrap();
        let tickets = (0..events).map(|_| t.push(10, &table()).unwrap()).collect();
        t.commit(Lsn(end)).unwrap();
        tickets
    }

    #[test]
    fn frontier_waits_for_every_event_of_a_transaction() {
        let mut t = AckTracker::new(Lsn(100));
        let a = tx(&mut t, 110, 3, 120);
        assert_eq!(t.frontier(), Lsn(100));
        t.ack(a[0]).unwrap();
        t.ack(a[2]).unwrap();
        assert_eq!(t.frontier(), Lsn(100));
        t.ack(a[1]).unwrap();
        assert_eq!(t.frontier(), Lsn(120));
        assert!(t.is_idle());
        assert_eq!(t.in_flight_bytes(), 0);
    }

    #[test]
    fn out_of_order_acks_across_transactions_keep_the_prefix_rule() {
        let mut t = AckTracker::new(Lsn(0));
        let a = tx(&mut t, 10, 2, 20);
        let b = tx(&mut t, 30, 1, 40);
        let c = tx(&mut t, 50, 2, 60);
        // The later transactions are fully acked first: nothing moves.
        t.ack(c[1]).unwrap();
        t.ack(c[0]).unwrap();
        t.ack(b[0]).unwrap();
        assert_eq!(t.frontier(), Lsn(0));
        t.ack(a[1]).unwrap();
        assert_eq!(t.frontier(), Lsn(0));
        // The last missing ack releases all three at once.
        t.ack(a[0]).unwrap();
        assert_eq!(t.frontier(), Lsn(60));
    }

    #[test]
    fn empty_transactions_advance_only_behind_a_delivered_prefix() {
        let mut t = AckTracker::new(Lsn(0));
        // Leading empty transaction: confirmed at once.
        tx(&mut t, 5, 0, 8);
        assert_eq!(t.frontier(), Lsn(8));
        let a = tx(&mut t, 10, 1, 20);
        // An empty transaction behind an undelivered one must wait.
        tx(&mut t, 30, 0, 40);
        assert_eq!(t.frontier(), Lsn(8));
        t.ack(a[0]).unwrap();
        assert_eq!(t.frontier(), Lsn(40));
    }

    #[test]
    fn a_rewind_after_a_promotion_keeps_the_old_servers_positions_out_of_the_frontier() {
        let mut t = AckTracker::new(Lsn(100));
        // The old primary: a transaction in flight, then (idle) a keepalive
        // beyond what the standby received.
        let old = tx(&mut t, 110, 1, 120);
        t.ack(old[0]).unwrap();
        t.keepalive(Lsn(500));
        assert_eq!(t.frontier(), Lsn(500));
        let late = tx(&mut t, 510, 1, 520);
        // The new primary's slot is confirmed at 120: resume there.
        t.rewind(Lsn(120));
        assert_eq!((t.frontier(), t.resume_lsn()), (Lsn(120), Lsn(120)));
        // Its first transaction ends below the old keepalive and is accepted.
        let new = tx(&mut t, 130, 1, 140);
        // The old server's late transaction, delivered, cannot carry the
        // frontier past the new server's undelivered one.
        t.ack(late[0]).unwrap();
        assert_eq!(t.frontier(), Lsn(120));
        t.ack(new[0]).unwrap();
        assert_eq!(t.frontier(), Lsn(140));
    }

    #[test]
    fn keepalive_advances_only_when_idle() {
        let mut t = AckTracker::<()>::new(Lsn(100));
        t.keepalive(Lsn(150));
        assert_eq!(t.frontier(), Lsn(150));
        // Never backwards.
        t.keepalive(Lsn(120));
        assert_eq!(t.frontier(), Lsn(150));
        // Open transaction: a keepalive cannot confirm past its events.
        t.begin(Lsn(200)).unwrap();
        t.keepalive(Lsn(300));
        assert_eq!(t.frontier(), Lsn(150));
        let e = t.push(1, &table()).unwrap();
        t.commit(Lsn(210)).unwrap();
        // Committed but undelivered: still pinned.
        t.keepalive(Lsn(300));
        assert_eq!(t.frontier(), Lsn(150));
        t.ack(e).unwrap();
        assert_eq!(t.frontier(), Lsn(210));
        t.keepalive(Lsn(300));
        assert_eq!(t.frontier(), Lsn(300));
    }

    #[test]
    fn a_failed_event_pins_the_frontier_forever() {
        let mut t = AckTracker::new(Lsn(0));
        let a = tx(&mut t, 10, 2, 20);
        let b = tx(&mut t, 30, 1, 40);
        t.ack(a[0]).unwrap();
        t.ack(b[0]).unwrap();
        // a[1] never acks (its delivery failed): nothing past it is confirmed.
        for wal in [50, 60, 70] {
            t.keepalive(Lsn(wal));
        }
        assert_eq!(t.frontier(), Lsn(0));
        assert_eq!(t.origin(a[1]), Some((Lsn(10), &table())));
        assert_eq!(t.origin(b[0]), Some((Lsn(30), &table())));
        assert_eq!(t.in_flight_events(), 1);
    }

    #[test]
    fn protocol_violations_are_errors() {
        let mut t = AckTracker::<()>::new(Lsn(100));
        assert!(matches!(
            t.push(1, &table()),
            Err(AckError::NoTransaction { .. })
        ));
        assert!(matches!(
            t.commit(Lsn(1)),
            Err(AckError::NoTransaction { .. })
        ));
        t.begin(Lsn(110)).unwrap();
        assert!(matches!(
            t.begin(Lsn(111)),
            Err(AckError::NestedBegin { .. })
        ));
        let e = t.push(1, &table()).unwrap();
        assert!(matches!(
            t.commit(Lsn(90)),
            Err(AckError::NonMonotonicCommit { .. })
        ));
        t.begin(Lsn(110)).unwrap();
        t.commit(Lsn(120)).unwrap();
        t.ack(e).unwrap();
        assert_eq!(t.ack(e).err(), Some(AckError::UnknownTicket(e.0)));
        assert_eq!(t.ack(Ticket(99)).err(), Some(AckError::UnknownTicket(99)));
    }

    #[test]
    fn a_broken_transaction_is_replayed_behind_its_orphaned_events() {
        let mut t = AckTracker::new(Lsn(0));
        t.begin(Lsn(10)).unwrap();
        let orphan = t.push(1, &table()).unwrap();
        // The stream breaks mid-transaction and resumes after the last commit.
        t.abandon_open();
        assert_eq!(t.resume_lsn(), Lsn(0));
        assert_eq!(t.origin(orphan), Some((Lsn(10), &table())));
        // The replay sends the transaction again, whole.
        let replayed = tx(&mut t, 10, 1, 20);
        t.ack(replayed[0]).unwrap();
        assert_eq!(t.frontier(), Lsn(0), "the orphan is still in flight");
        t.ack(orphan).unwrap();
        assert_eq!(t.frontier(), Lsn(20));
        assert_eq!(t.resume_lsn(), Lsn(20));
    }

    #[test]
    fn event_less_transactions_behind_a_stuck_event_collapse_into_one_entry() {
        let mut t = AckTracker::new(Lsn(0));
        let stuck = tx(&mut t, 10, 1, 20);
        // An hour of other applications' transactions while the event is stuck.
        for i in 0..100_000u64 {
            tx(&mut t, 30 + 10 * i, 0, 35 + 10 * i);
        }
        assert_eq!(t.committed.len(), 1, "one entry, not one per transaction");
        assert_eq!(t.frontier(), Lsn(0));
        // A transaction with an event starts a new entry; empty ones after it join it.
        let next = tx(&mut t, 2_000_000, 1, 2_000_010);
        tx(&mut t, 2_000_020, 0, 2_000_030);
        assert_eq!(t.committed.len(), 2);
        assert_eq!(t.origin(next[0]), Some((Lsn(2_000_000), &table())));
        assert_eq!(t.origin(stuck[0]), Some((Lsn(10), &table())));
        t.ack(stuck[0]).unwrap();
        // The collapsed entry releases its highest end.
        assert_eq!(t.frontier(), Lsn(35 + 10 * 99_999));
        t.ack(next[0]).unwrap();
        assert_eq!(t.frontier(), Lsn(2_000_030));
        assert!(t.is_idle());
    }

    #[test]
    fn an_orphaned_event_keeps_the_next_empty_transaction_separate() {
        let mut t = AckTracker::new(Lsn(0));
        let first = tx(&mut t, 5, 1, 8);
        t.begin(Lsn(10)).unwrap();
        let orphan = t.push(1, &table()).unwrap();
        t.abandon_open();
        // The replayed transaction (here without events) must wait for the orphan.
        tx(&mut t, 10, 0, 20);
        assert_eq!(t.committed.len(), 2);
        t.ack(first[0]).unwrap();
        assert_eq!(t.frontier(), Lsn(8));
        t.ack(orphan).unwrap();
        assert_eq!(t.frontier(), Lsn(20));
    }

    #[test]
    fn in_flight_counts_and_bytes() {
        let mut t = AckTracker::<()>::new(Lsn(0));
        t.begin(Lsn(1)).unwrap();
        let a = t.push(100, &table()).unwrap();
        let b = t.push(50, &table()).unwrap();
        assert_eq!(t.in_flight_bytes(), 150);
        assert_eq!(t.window_len(), 2);
        t.ack(b).unwrap();
        assert_eq!(t.in_flight_bytes(), 100);
        assert_eq!(t.in_flight_events(), 1);
        assert_eq!(t.window_len(), 2);
        t.ack(a).unwrap();
        assert_eq!(t.window_len(), 0);
        assert!(t.in_transaction());
    }

    #[test]
    fn out_of_order_acks_keep_the_oldest_event_as_the_staleness_origin() {
        let mut t = AckTracker::new(Lsn(1));
        t.begin(Lsn(10)).unwrap();
        let t0 = Instant::now();
        let handed: Vec<_> = (0..3).map(|i| t0 + Duration::from_secs(i)).collect();
        for (n, &at) in handed.iter().enumerate() {
            let ticket = t.push(10, &table()).unwrap();
            t.sent(ticket, n, at);
        }
        t.commit(Lsn(11)).unwrap();
        assert_eq!(t.oldest_sent(), Some(handed[0]));
        assert_eq!(t.ack(Ticket(1)).unwrap(), Some((1, 10)));
        assert_eq!(t.oldest_sent(), Some(handed[0]));
        assert!(t.ack(Ticket(1)).is_err(), "twice: refused");
        t.ack(Ticket(0)).unwrap();
        assert_eq!(
            t.oldest_sent(),
            Some(handed[2]),
            "the oldest left is the third"
        );
        assert_eq!((t.in_flight_events(), t.in_flight_bytes()), (1, 10));
        t.ack(Ticket(2)).unwrap();
        assert_eq!(t.oldest_sent(), None);
        assert_eq!(t.frontier(), Lsn(11));
    }

    #[test]
    fn a_record_for_an_acknowledged_ticket_is_not_kept_as_the_staleness_origin() {
        let mut t = AckTracker::new(Lsn(1));
        t.begin(Lsn(10)).unwrap();
        // The first event (an unmapped row being dead-lettered) holds the window open.
        let held = t.push(0, &table()).unwrap();
        let acked = t.push(10, &table()).unwrap();
        t.ack(acked).unwrap();
        // A record arriving after the ack is of nothing in flight.
        t.sent(acked, "late", Instant::now());
        assert_eq!(t.window_len(), 2);
        assert_eq!(t.oldest_sent(), None);
        t.ack(held).unwrap();
        assert_eq!(t.window_len(), 0);
    }

    #[test]
    fn a_broken_invariant_stops_the_step_that_shows_it() {
        type Corruption = fn(&mut AckTracker<()>);
        let corruptions: [(&str, Corruption); 3] = [
            ("frontier 0/1F4 past the last end", |t| {
                t.frontier = Lsn(500)
            }),
            ("commit ends out of order", |t| {
                t.committed.push_back(Committed {
                    end_seq: 1,
                    end_lsn: Lsn(400),
                })
            }),
            ("disagree with a window of 2", |t| t.in_flight_bytes += 1),
        ];
        for (expected, corrupt) in corruptions {
            let step = std::panic::catch_unwind(|| {
                let mut t = AckTracker::<()>::new(Lsn(0));
                t.begin(Lsn(10)).unwrap();
                t.push(10, &table()).unwrap();
                t.push(10, &table()).unwrap();
                corrupt(&mut t);
                t.commit(Lsn(20)).unwrap();
            });
            let panic = step.err().and_then(|p| p.downcast::<String>().ok());
            assert!(
                panic.as_ref().is_some_and(|m| m.contains(expected)),
                "{expected}: {panic:?}"
            );
        }
    }
}
