//! Pacing the replication reads while the stream is behind.
//!
//! The walsender flushes every message it decodes to the socket. A relay that keeps up with it
//! finds the socket empty after each message, parks, and is woken by the next one: a thread
//! wake-up per event, which costs more CPU than the event itself (docs/benchmark.md). While the
//! stream drains a backlog, the walsender sending transactions [`BEHIND`] or more after their
//! commit, reading each message the moment it arrives wins no latency worth that: after a wait,
//! the pipeline naps for [`NAP`], and its next reads find what was sent meanwhile in the socket
//! buffer, a burst without wake-ups. A stream keeping up with its commits never naps, even when
//! a busy moment puts one transaction tens of milliseconds behind: its latency is the point.
//!
//! The nap blocks the thread on purpose: on a tokio timer the runtime would still wake for every
//! segment arriving on the replication socket, only to find nobody waiting for it. The
//! replication reader, the pipeline and the HTTP endpoint share the thread; a nap delays each by
//! at most [`NAP`], and librdkafka's threads carry on. Memory stays bounded: what arrives
//! meanwhile waits in the kernel's socket buffer, and the walsender stops when that is full.
//!
//! Whether a wait parked the thread is judged by the clock, which a loaded machine (or a debug
//! build) misreads: a hand-over between tasks can take longer than [`PARKED`] there. So a nap
//! follows at least [`BURST`] messages since the last one: whatever the clock says, the naps
//! cannot hold the relay below [`BURST`] messages per [`NAP`], faster than a walsender sends.
//!
//! A shard's relay (`--shard I/K`) naps after every wait that parked. Its walsender decodes all
//! of the WAL and sends it a K-th of the rows, so the relay has K times the headroom the floor
//! protects; with the floor it would read many of a shard's sparser messages one at a time, a
//! wake-up each, paid in its walsender's kernel time (docs/benchmark.md, "Where a walsender's
//! CPU goes"). Whatever the clock says, a nap follows a wait for the replication reader, which
//! then hands over what one read of the socket took (up to 128 KiB): more per [`NAP`] than a
//! walsender sends a shard (about 20 KB per millisecond at K=4 in the bench).

use std::time::{Duration, Instant};

/// How far behind its commit the walsender must send a transaction for the pipeline to nap: a
/// backlog, not the tail of a steady stream (whose commit → ack p99.9 stays well below it).
pub(super) const BEHIND: Duration = Duration::from_millis(250);
/// How long a nap lasts: about 100 messages at the walsender's pace.
pub(super) const NAP: Duration = Duration::from_millis(1);
/// A wait at least this long parked the thread: a buffered message arrives within microseconds.
const PARKED: Duration = Duration::from_micros(20);
/// WAL messages between two naps, at least: a walsender sends about this many per [`NAP`].
pub(super) const BURST: u32 = 100;

/// When to nap: the decisions, without the clock or the sleep.
#[derive(Debug)]
pub(super) struct Pacer {
    behind: bool,
    waiting_since: Option<Instant>,
    nap_due: bool,
    /// Messages since the last nap.
    since_nap: u32,
    /// Messages between two naps, at least: [`BURST`], or 1 for a shard.
    burst: u32,
}

impl Pacer {
    /// The pacer of a relay of the whole outbox, or of one shard of it (`sharded`).
    pub(super) fn new(sharded: bool) -> Self {
        Pacer {
            behind: false,
            waiting_since: None,
            nap_due: false,
            since_nap: 0,
            burst: if sharded { 1 } else { BURST },
        }
    }

    /// A message of the open transaction was sent `lag_us` after its commit (both on the
    /// server's clock, so no clock skew enters).
    pub(super) fn sent(&mut self, lag_us: i64) {
        self.behind = lag_us >= BEHIND.as_micros() as i64;
        self.nap_due &= self.behind;
        self.since_nap = self.since_nap.saturating_add(1);
    }

    /// Whether the stream is behind: only then is the clock read.
    pub(super) fn behind(&self) -> bool {
        self.behind
    }

    /// The nap due before the next wait, if the last one parked and a burst came since the last.
    pub(super) fn nap(&mut self) -> Option<Duration> {
        let due = std::mem::take(&mut self.nap_due) && self.since_nap >= self.burst;
        if due {
            self.since_nap = 0;
        }
        due.then_some(NAP)
    }

    /// The pipeline waits for input, reading allowed, from `now`.
    pub(super) fn waiting(&mut self, now: Instant) {
        self.waiting_since = Some(now);
    }

    /// Input arrived at `now` after [`Pacer::waiting`].
    pub(super) fn woke(&mut self, now: Instant) {
        if let Some(since) = self.waiting_since.take() {
            self.nap_due |= self.behind && now.saturating_duration_since(since) >= PARKED;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pacer behind, a burst after its last nap.
    fn behind() -> Pacer {
        let mut pacer = Pacer::new(false);
        for _ in 0..BURST {
            pacer.sent(BEHIND.as_micros() as i64);
        }
        pacer
    }

    #[test]
    fn a_wait_that_parked_while_behind_is_followed_by_a_nap() {
        let mut pacer = behind();
        let t = Instant::now();
        assert_eq!(pacer.nap(), None);
        pacer.waiting(t);
        pacer.woke(t + Duration::from_millis(2));
        assert_eq!(pacer.nap(), Some(NAP));
        // One nap per parked wait.
        assert_eq!(pacer.nap(), None);
    }

    #[test]
    fn naps_are_a_burst_apart_however_long_each_wait_seemed() {
        let mut pacer = behind();
        let t = Instant::now();
        let mut naps = 0;
        // Every message after a wait the clock calls parked, as on a starved machine.
        for i in 0..10 * BURST {
            pacer.sent(BEHIND.as_micros() as i64);
            pacer.waiting(t);
            pacer.woke(t + Duration::from_millis(1));
            naps += u32::from(pacer.nap().is_some());
            assert!(naps <= i / BURST + 1, "{naps} naps after {i} messages");
        }
        assert_eq!(naps, 10);
    }

    #[test]
    fn a_shard_naps_after_every_wait_that_parked_while_behind() {
        let t = Instant::now();
        let park = |pacer: &mut Pacer| {
            pacer.sent(BEHIND.as_micros() as i64);
            pacer.waiting(t);
            pacer.woke(t + Duration::from_millis(1));
            pacer.nap()
        };
        let (mut shard, mut whole) = (Pacer::new(true), Pacer::new(false));
        for _ in 0..3 {
            assert_eq!(park(&mut shard), Some(NAP));
            // The whole outbox's relay waits for a burst first.
            assert_eq!(park(&mut whole), None);
        }
        // A shard's stream that caught up naps no more than any other.
        shard.sent(0);
        shard.waiting(t);
        shard.woke(t + Duration::from_millis(1));
        assert_eq!(shard.nap(), None);
        // Nor does a wait that found a message buffered.
        shard.sent(BEHIND.as_micros() as i64);
        shard.waiting(t);
        shard.woke(t + Duration::from_micros(3));
        assert_eq!(shard.nap(), None);
    }

    #[test]
    fn a_message_already_buffered_is_no_reason_to_nap() {
        let mut pacer = behind();
        let t = Instant::now();
        pacer.waiting(t);
        pacer.woke(t + Duration::from_micros(3));
        assert_eq!(pacer.nap(), None);
    }

    #[test]
    fn a_stream_keeping_up_with_its_commits_never_naps() {
        let mut pacer = Pacer::new(false);
        pacer.sent(BEHIND.as_micros() as i64 - 1);
        assert!(!pacer.behind());
        let t = Instant::now();
        pacer.waiting(t);
        pacer.woke(t + Duration::from_millis(50));
        assert_eq!(pacer.nap(), None);
        // Nor does one that caught up before the nap was taken.
        let mut pacer = behind();
        pacer.waiting(t);
        pacer.woke(t + Duration::from_millis(50));
        pacer.sent(0);
        assert_eq!(pacer.nap(), None);
    }
}
