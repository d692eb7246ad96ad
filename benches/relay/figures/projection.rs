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

    /// Each process's median over `rounds`: a drain in the slow regime (docs/benchmark.md) moves a
    /// round's busiest process, not this.
    pub(crate) fn typical(rounds: &[ShardRound]) -> ShardRound {
        let median = |mut values: Vec<f64>| {
            values.sort_by(f64::total_cmp);
            values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
        };
        let first = rounds.first().map_or(&[][..], |r| &r.drains[..]);
        let drains = first.iter().enumerate().map(|(i, d)| ShardDrain {
            relay_s: median(rounds.iter().map(|r| r.drains[i].relay_s).collect()),
            walsender_s: median(rounds.iter().map(|r| r.drains[i].walsender_s).collect()),
            wall_s: median(rounds.iter().map(|r| r.drains[i].wall_s).collect()),
            ..*d
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
