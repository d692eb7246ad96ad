//! The steady phase: the writer's schedule, and each commit's time until the slot was
//! confirmed past it.

use std::time::{Duration, Instant};

use outbox_relay::lsn::Lsn;

/// Most transactions per second the steady writer commits (one every 10 ms).
const MAX_TX_PER_S: u64 = 100;

/// `--rate` for `--duration` as transactions on a fixed schedule: at most 100 a second, so
/// a higher rate is written in batches (5,000 events/s: 100 transactions of 50).
pub(crate) struct SteadySchedule {
    pub(crate) tx_per_s: u64,
    /// Rows per transaction.
    pub(crate) batch: u64,
    /// Between the starts of two transactions.
    pub(crate) interval: Duration,
    /// Transactions in all.
    pub(crate) txs: u64,
}

impl SteadySchedule {
    pub(crate) fn new(rate: u64, duration: Duration) -> SteadySchedule {
        let tx_per_s = rate.clamp(1, MAX_TX_PER_S);
        SteadySchedule {
            tx_per_s,
            batch: (rate / tx_per_s).max(1),
            interval: Duration::from_secs(1) / u32::try_from(tx_per_s).unwrap_or(1),
            txs: tx_per_s * duration.as_secs(),
        }
    }

    /// Events per second as written: `--rate` rounded down to whole rows per transaction.
    pub(crate) fn rate(&self) -> u64 {
        self.batch * self.tx_per_s
    }

    pub(crate) fn events(&self) -> u64 {
        self.txs * self.batch
    }

    /// When transaction `i` (from 0) is due, after the first.
    pub(crate) fn due(&self, i: u64) -> Duration {
        self.interval * u32::try_from(i).unwrap_or(u32::MAX)
    }

    /// The first row of transaction `i`; its rows are `first_row(i)..first_row(i + 1)`.
    pub(crate) fn first_row(&self, i: u64) -> u64 {
        i * self.batch
    }
}

/// One steady transaction: when its `COMMIT` was sent, and the WAL's end after it.
pub(crate) struct Commit {
    pub(crate) at: Instant,
    pub(crate) lsn: Lsn,
}

/// A position the slot was first seen confirmed at, by the 2 ms poller.
pub(crate) struct Confirmation {
    pub(crate) at: Instant,
    pub(crate) lsn: Lsn,
}

/// commit → slot confirmed, per transaction.
pub(crate) struct ConfirmLatencies {
    /// Ascending.
    pub(crate) sorted: Vec<Duration>,
    /// Transactions no poll saw confirmed.
    pub(crate) unconfirmed: usize,
}

/// Each commit's time until the first poll that saw the slot confirmed at or past it.
/// `confirmations` ascend by position (the poller keeps only advances).
pub(crate) fn commit_to_confirmed(
    commits: &[Commit],
    confirmations: &[Confirmation],
) -> ConfirmLatencies {
    let mut sorted = Vec::with_capacity(commits.len());
    let mut unconfirmed = 0;
    for commit in commits {
        let first_past = confirmations.partition_point(|c| c.lsn < commit.lsn);
        match confirmations.get(first_past) {
            Some(confirmation) => sorted.push(confirmation.at.saturating_duration_since(commit.at)),
            None => unconfirmed += 1,
        }
    }
    sorted.sort();
    ConfirmLatencies {
        sorted,
        unconfirmed,
    }
}
