//! `--shards K`: K shard relays drain each round's backlog one after the other.

use std::ops::RangeInclusive;
use std::process::{Command, Stdio};
use std::thread;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use outbox_relay::outbox::Shard;

use super::Bench;
use crate::figures::projection::{ShardDrain, ShardRound};
use crate::figures::report::{Report, per_million};
use crate::pg::{PUBLICATION, SLOT_RELAY, end_of_load};
use crate::relay_process::RelayRun;
use crate::workload::{BACKLOG_TX_ROWS, backlog_key, load_backlog};

impl Bench {
    /// `--shards K`: each round loads N rows, then K shard relays (1: one relay without
    /// `--shard`) drain them one after the other, each shard's walsender decoding all of the
    /// WAL and sending only its rows. Reports each process's CPU per event of the whole
    /// outbox and the drain K+1 cores would reach.
    pub(super) async fn shards(&mut self, count: u32) -> Result<()> {
        let n = self.args.events;
        let shards = shards_of(count);
        println!(
            "\n== Shards: {n} events, {BACKLOG_TX_ROWS} per transaction, drained by {count} \
             shard(s) one after the other, {} round(s) ==",
            self.args.rounds
        );
        self.set_up_shards(&shards)?;
        let mut rounds = Vec::new();
        for round in 0..self.args.rounds {
            rounds.push(self.shard_round(round, &shards).await?);
        }
        let median = ShardRound::typical(&rounds);
        println!(
            "projected drain on {} cores from each process's median CPU: {:.0} events/s \
             ({:.0} by the busiest process alone). The shards drained one after the other: this \
             machine's {} cores cannot show the wall time of K relays and K walsenders running \
             at once, so the figure is the CPU each needs",
            count + 1,
            median.projected(n),
            median.projected_by_busiest(n),
            thread::available_parallelism().map_or(0, |n| n.get())
        );
        report_shards(&mut self.report, count, &rounds, &median, n);
        Ok(())
    }

    /// The shards' publications and slots, before any row, so that every slot sees them all.
    fn set_up_shards(&self, shards: &[Option<Shard>]) -> Result<()> {
        for shard in shards.iter().flatten() {
            let status = Command::new(&self.relay_bin)
                .args(["setup", "--postgres-url", &self.pg.url()])
                .args(["--slot", SLOT_RELAY, "--publication", PUBLICATION])
                .args(["--shard", &shard.to_string(), "--log-level", "warn"])
                // setup records the slot in the Kafka lineage topic.
                .args(["--kafka-brokers", &self.broker.bootstrap_servers()])
                .stdout(Stdio::null())
                .status()
                .context("run outbox-relay setup")?;
            if !status.success() {
                bail!("outbox-relay setup --shard {shard} failed ({status})");
            }
        }
        Ok(())
    }

    /// Loads round `round`'s N rows, then drains them with each shard in turn.
    async fn shard_round(&mut self, round: u64, shards: &[Option<Shard>]) -> Result<ShardRound> {
        let n = self.args.events;
        load_backlog(&self.pg, round * n, n).await?;
        let end = end_of_load(&self.control).await?;
        let limit = Duration::from_secs(120 + n / 2_000);
        let mut drains = Vec::new();
        for &shard in shards {
            let owned = owned_events(shard, round * n + 1..=(round + 1) * n);
            let before = self.broker_records().await?;
            let drain = self
                .drain_relay(end, before + owned as i64, limit, &RelayRun::plain(shard))
                .await?;
            println!(
                "round {} shard {}: {owned} events; CPU per M events of the outbox: relay \
                 {:.2} s, its walsender {:.2} s; drained in {:.2} s",
                round + 1,
                shard.map_or("0/1".to_owned(), |s| s.to_string()),
                per_million(drain.cpu_s, n),
                per_million(drain.walsender_cpu_s, n),
                drain.wall.as_secs_f64()
            );
            drains.push(ShardDrain {
                shard,
                owned,
                relay_s: drain.cpu_s,
                walsender_s: drain.walsender_cpu_s,
                wall_s: drain.wall.as_secs_f64(),
            });
        }
        let round = ShardRound { drains };
        println!(
            "projected drain on {} cores: {:.0} events/s (busiest process {:.2} s, all {:.2} s \
             of CPU per M events)",
            shards.len() + 1,
            round.projected(n),
            per_million(round.busiest_s(), n),
            per_million(round.total_s(), n)
        );
        Ok(round)
    }
}

/// K shards, or for 1 the relay without `--shard`.
fn shards_of(count: u32) -> Vec<Option<Shard>> {
    match count {
        1 => vec![None],
        _ => (0..count)
            .map(|index| Some(Shard { index, count }))
            .collect(),
    }
}

/// Backlog rows `rows` whose key hashes to `shard` (all of them without one).
fn owned_events(shard: Option<Shard>, rows: RangeInclusive<u64>) -> u64 {
    let Some(shard) = shard else {
        return rows.count() as u64;
    };
    let owned = rows
        .map(backlog_key)
        .filter(|key| shard.owns(Some(key.as_bytes()), None))
        .count();
    owned as u64
}

/// Each process's median figures, the projections from them, and every round's own.
fn report_shards(r: &mut Report, count: u32, rounds: &[ShardRound], median: &ShardRound, n: u64) {
    r.add("shards", count);
    r.add("events", n);
    r.add("shard_rounds", rounds.len());
    for d in &median.drains {
        let index = d.shard.map_or(0, |s| s.index);
        r.add(&format!("shard{index}_events"), d.owned);
        r.add_f(
            &format!("shard{index}_relay_cpu_per_m_s"),
            per_million(d.relay_s, n),
            3,
        );
        r.add_f(
            &format!("shard{index}_walsender_cpu_per_m_s"),
            per_million(d.walsender_s, n),
            3,
        );
        r.add_f(&format!("shard{index}_wall_s"), d.wall_s, 3);
    }
    r.add_f(
        "shard_projected_busiest_events_per_s",
        median.projected_by_busiest(n),
        0,
    );
    r.add_f(
        "shard_busiest_cpu_per_m_s",
        per_million(median.busiest_s(), n),
        3,
    );
    r.add_f(
        "shard_total_cpu_per_m_s",
        per_million(median.total_s(), n),
        3,
    );
    r.add_f("shard_projected_events_per_s", median.projected(n), 0);
    let each = rounds
        .iter()
        .map(|round| format!("{:.0}", round.projected(n)));
    r.add("shard_projected_rounds", each.collect::<Vec<_>>().join(","));
}
