//! A backlog round's drains, the reference's and the relay's of the same WAL, and the
//! ratios between them that the bench reports.

use std::time::Duration;

/// One backlog round: the same WAL drained by `pg_recvlogical` and by the relay.
pub(crate) struct Round {
    pub(crate) index: u64,
    pub(crate) load: Duration,
    pub(crate) avg_payload: String,
    pub(crate) reference: RefDrain,
    pub(crate) relay: RelayDrain,
}

/// One drain of a slot by `pg_recvlogical`.
pub(crate) struct RefDrain {
    pub(crate) wall: Duration,
    pub(crate) client_cpu_s: f64,
    pub(crate) walsender_cpu_s: f64,
}

/// One drain of a slot by the relay.
pub(crate) struct RelayDrain {
    /// From spawn to the slot confirmed at the end.
    pub(crate) wall: Duration,
    /// From spawn to the broker holding every record (`None`: not seen in time).
    pub(crate) broker_wall: Option<Duration>,
    pub(crate) startup: Duration,
    pub(crate) cpu_s: f64,
    pub(crate) walsender_cpu_s: f64,
    pub(crate) rss_mib: f64,
    /// The bench's own process meanwhile: mostly the mock broker.
    pub(crate) bench_cpu_s: f64,
}

pub(crate) fn events_per_s(events: u64, wall: Duration) -> f64 {
    events as f64 / wall.as_secs_f64()
}

impl RefDrain {
    pub(crate) fn events_per_s(&self, events: u64) -> f64 {
        events_per_s(events, self.wall)
    }
}

impl RelayDrain {
    /// To the slot confirmed at the end.
    pub(crate) fn events_per_s(&self, events: u64) -> f64 {
        events_per_s(events, self.wall)
    }

    /// Seconds until the broker held every record; NaN if it was not seen to.
    pub(crate) fn broker_s(&self) -> f64 {
        self.broker_wall.map_or(f64::NAN, |w| w.as_secs_f64())
    }

    /// To the broker holding every record; NaN if it was not seen to.
    pub(crate) fn broker_events_per_s(&self, events: u64) -> f64 {
        self.broker_wall
            .map_or(f64::NAN, |wall| events_per_s(events, wall))
    }
}

impl Round {
    /// The relay's events/s (to the slot confirmed) over `pg_recvlogical`'s: the drain
    /// target is at least 0.9.
    pub(crate) fn ratio(&self) -> f64 {
        self.reference.wall.as_secs_f64() / self.relay.wall.as_secs_f64()
    }

    /// The relay's events/s to the broker holding them all over `pg_recvlogical`'s.
    pub(crate) fn broker_ratio(&self) -> f64 {
        self.reference.wall.as_secs_f64() / self.relay.broker_s()
    }

    /// The relay's CPU over the CPU of the walsender `pg_recvlogical` drove on the same
    /// WAL: issue 22's goal is at most 0.5 in every round.
    pub(crate) fn relay_cpu_vs_ref_walsender(&self) -> f64 {
        self.relay.cpu_s / self.reference.walsender_cpu_s
    }

    /// The round with the median ratio (the upper of the two middle ones for an even
    /// count): on two shared cores one round can land in the slow regime
    /// (docs/benchmark.md), so one round is not the figure.
    pub(crate) fn median(rounds: &[Round]) -> Option<&Round> {
        let mut by_ratio: Vec<&Round> = rounds.iter().collect();
        by_ratio.sort_by(|a, b| a.ratio().total_cmp(&b.ratio()));
        by_ratio.get(by_ratio.len() / 2).copied()
    }

    /// The relay's largest peak RSS over the rounds, in MiB.
    pub(crate) fn peak_rss_mib(rounds: &[Round]) -> f64 {
        rounds.iter().map(|r| r.relay.rss_mib).fold(0.0, f64::max)
    }
}

/// One figure of every round, in round order, with three decimals: the `*_rounds` keys.
pub(crate) fn each_round(rounds: &[Round], figure: impl Fn(&Round) -> f64) -> String {
    rounds
        .iter()
        .map(|r| format!("{:.3}", figure(r)))
        .collect::<Vec<_>>()
        .join(",")
}
