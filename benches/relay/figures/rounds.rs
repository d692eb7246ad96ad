//! A backlog round's drains: the reference's and the relay's, of the same WAL.

use std::time::Duration;

/// One backlog round: the same WAL drained by `pg_recvlogical` and by the relay.
pub(crate) struct Round {
    pub(crate) index: u64,
    pub(crate) load: Duration,
    pub(crate) avg_payload: String,
    pub(crate) reference: RefDrain,
    pub(crate) relay: RelayDrain,
}

impl Round {
    /// relay events/s over `pg_recvlogical` events/s (to slot confirmed).
    pub(crate) fn ratio(&self) -> f64 {
        self.reference.wall.as_secs_f64() / self.relay.wall.as_secs_f64()
    }
}

/// One drain of a slot by `pg_recvlogical`.
pub(crate) struct RefDrain {
    pub(crate) wall: Duration,
    pub(crate) client_cpu_s: f64,
    pub(crate) walsender_cpu_s: f64,
}

/// One drain of a slot by the relay.
pub(crate) struct RelayDrain {
    pub(crate) wall: Duration,
    pub(crate) broker_wall: Option<Duration>,
    pub(crate) startup: Duration,
    pub(crate) cpu_s: f64,
    pub(crate) walsender_cpu_s: f64,
    pub(crate) rss_mib: f64,
    pub(crate) bench_cpu_s: f64,
}
