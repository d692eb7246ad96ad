//! `--shards`: the drain K shards would reach on K+1 cores, from the CPU each process used.

use outbox_relay::outbox::Shard;

/// One shard's drain of a round's backlog: its processes' CPU seconds.
#[derive(Clone, Copy)]
pub(crate) struct ShardDrain {
    pub(crate) shard: Option<Shard>,
    /// Events of the backlog whose key hashes to the shard.
    pub(crate) owned: u64,
    pub(crate) relay_s: f64,
    pub(crate) walsender_s: f64,
    /// Wall time of the drain: the walsender's pace, unless the relay held it back.
    pub(crate) wall_s: f64,
}

/// One `--shards` round: each shard drained the same backlog.
pub(crate) struct ShardRound {
    pub(crate) drains: Vec<ShardDrain>,
}

impl ShardRound {
    /// CPU seconds of the busiest process (a relay or a walsender).
    pub(crate) fn busiest_s(&self) -> f64 {
        let cpu = self.drains.iter().flat_map(|d| [d.relay_s, d.walsender_s]);
        cpu.fold(0.0, f64::max)
    }

    /// CPU seconds of every relay and walsender.
    pub(crate) fn total_s(&self) -> f64 {
        self.drains.iter().map(|d| d.relay_s + d.walsender_s).sum()
    }

    /// Each process's median over `rounds`: a drain in the slow regime (docs/benchmark.md)
    /// moves a round's busiest process, not this. The shards and their events are the first
    /// round's (every round drains the same shards).
    pub(crate) fn typical(rounds: &[ShardRound]) -> ShardRound {
        let Some(first) = rounds.first() else {
            return ShardRound { drains: Vec::new() };
        };
        let drains = first.drains.iter().enumerate().map(|(i, drain)| {
            let this_process = || rounds.iter().map(move |round| &round.drains[i]);
            ShardDrain {
                relay_s: median(this_process().map(|d| d.relay_s)),
                walsender_s: median(this_process().map(|d| d.walsender_s)),
                wall_s: median(this_process().map(|d| d.wall_s)),
                ..*drain
            }
        });
        ShardRound {
            drains: drains.collect(),
        }
    }

    /// The drain rate on K+1 cores: bounded by the busiest process (one core each at
    /// most) and by all their CPU shared by K+1 cores.
    pub(crate) fn projected(&self, events: u64) -> f64 {
        let cores = (self.drains.len() + 1) as f64;
        events as f64 / self.busiest_s().max(self.total_s() / cores)
    }

    /// The drain rate by the busiest process alone (the projection): each process
    /// on a core of its own.
    pub(crate) fn projected_by_busiest(&self, events: u64) -> f64 {
        events as f64 / self.busiest_s()
    }
}

/// The middle value (the upper of the two middle ones for an even count); NaN of none.
fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut values: Vec<f64> = values.collect();
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}
