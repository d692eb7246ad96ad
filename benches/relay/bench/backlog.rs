//! Part 1, the backlog drain: rounds of N rows drained by `pg_recvlogical` and by the
//! relay, the median round reported.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use super::Bench;
use crate::figures::report::per_million;
use crate::figures::rounds::Round;
use crate::pg::{end_of_load, query_text};
use crate::workload::{BACKLOG_TX_ROWS, load_backlog};

impl Bench {
    pub(super) async fn backlog(&mut self) -> Result<()> {
        let n = self.args.events;
        let rounds = self.args.rounds;
        println!(
            "\n== 1. Backlog drain: {n} events, {BACKLOG_TX_ROWS} per transaction, {rounds} round(s) =="
        );
        let mut results = Vec::new();
        for round in 0..rounds {
            results.push(self.drain_round(round).await?);
        }
        // The median round by ratio: on two shared cores one round can land in
        // a slow regime (see docs/benchmark.md), so one round is not the figure.
        let mut by_ratio: Vec<&Round> = results.iter().collect();
        by_ratio.sort_by(|a, b| a.ratio().total_cmp(&b.ratio()));
        let Some(median) = by_ratio.get(by_ratio.len() / 2).copied() else {
            bail!("no drain round ran");
        };
        let list = |f: &dyn Fn(&Round) -> f64| {
            results
                .iter()
                .map(|r| format!("{:.3}", f(r)))
                .collect::<Vec<_>>()
                .join(",")
        };
        let (reference, relay) = (&median.reference, &median.relay);
        let ref_rate = n as f64 / reference.wall.as_secs_f64();
        let relay_rate = n as f64 / relay.wall.as_secs_f64();
        let broker_rate = relay
            .broker_wall
            .map_or(f64::NAN, |w| n as f64 / w.as_secs_f64());
        if rounds > 1 {
            println!(
                "median round {}: relay / pg_recvlogical {:.2}; all rounds: {}",
                median.index + 1,
                median.ratio(),
                list(&|r| r.ratio())
            );
        }

        let r = &mut self.report;
        r.add("events", n);
        r.add("drain_rounds", rounds);
        r.add("drain_median_round", median.index + 1);
        r.add_f("load_s", median.load.as_secs_f64(), 2);
        r.add("payload_avg_bytes", &median.avg_payload);
        r.add_f("ref_s", reference.wall.as_secs_f64(), 3);
        r.add_f("ref_events_per_s", ref_rate, 0);
        r.add_f("ref_cpu_per_m_s", per_million(reference.client_cpu_s, n), 3);
        r.add_f(
            "ref_walsender_cpu_per_m_s",
            per_million(reference.walsender_cpu_s, n),
            3,
        );
        r.add_f("relay_startup_ms", relay.startup.as_secs_f64() * 1e3, 1);
        r.add_f("relay_s", relay.wall.as_secs_f64(), 3);
        r.add_f("relay_events_per_s", relay_rate, 0);
        r.add_f(
            "relay_broker_s",
            relay.broker_wall.map_or(f64::NAN, |w| w.as_secs_f64()),
            3,
        );
        r.add_f("relay_broker_events_per_s", broker_rate, 0);
        r.add_f("drain_ratio", relay_rate / ref_rate, 3);
        r.add_f("drain_ratio_broker", broker_rate / ref_rate, 3);
        r.add("drain_ratio_rounds", list(&|r| r.ratio()));
        r.add_f("relay_cpu_per_m_s", per_million(relay.cpu_s, n), 3);
        r.add(
            "relay_cpu_per_m_s_rounds",
            list(&|r| per_million(r.relay.cpu_s, n)),
        );
        r.add_f(
            "relay_walsender_cpu_per_m_s",
            per_million(relay.walsender_cpu_s, n),
            3,
        );
        r.add(
            "relay_walsender_cpu_per_m_s_rounds",
            list(&|r| per_million(r.relay.walsender_cpu_s, n)),
        );
        r.add(
            "relay_cpu_vs_ref_walsender_rounds",
            list(&|r| r.relay.cpu_s / r.reference.walsender_cpu_s),
        );
        r.add_f("bench_cpu_per_m_s", per_million(relay.bench_cpu_s, n), 3);
        r.add_f(
            "relay_rss_mib",
            results.iter().map(|r| r.relay.rss_mib).fold(0.0, f64::max),
            1,
        );
        Ok(())
    }

    /// One round: load N more rows (both slots see them), drain the reference
    /// slot with `pg_recvlogical`, then the relay's slot with a fresh relay.
    async fn drain_round(&mut self, index: u64) -> Result<Round> {
        let n = self.args.events;
        if self.args.rounds > 1 {
            println!("-- round {} --", index + 1);
        }
        let t = Instant::now();
        load_backlog(&self.pg, index * n, n).await?;
        let load = t.elapsed();
        let end = end_of_load(&self.control).await?;
        let avg_payload = query_text(
            &self.control,
            "SELECT round(avg(octet_length(payload::text)))::text FROM public.outbox",
        )
        .await?
        .unwrap_or_default();
        println!(
            "loaded in {:.1} s ({:.0} rows/s), average payload {avg_payload} bytes, end LSN {end}",
            load.as_secs_f64(),
            n as f64 / load.as_secs_f64()
        );
        let limit = Duration::from_secs(120 + n / 2_000);

        let reference = self.drain_reference(end, limit).await?;
        let ref_rate = n as f64 / reference.wall.as_secs_f64();
        println!(
            "pg_recvlogical: {:.2} s, {ref_rate:.0} events/s; CPU/M events: pg_recvlogical {:.2} s + walsender {:.2} s",
            reference.wall.as_secs_f64(),
            per_million(reference.client_cpu_s, n),
            per_million(reference.walsender_cpu_s, n)
        );

        let before = self.broker_records().await?;
        let relay = self
            .drain_relay(end, before + n as i64, limit, None)
            .await?;
        let relay_rate = n as f64 / relay.wall.as_secs_f64();
        let broker_rate = relay
            .broker_wall
            .map_or(f64::NAN, |w| n as f64 / w.as_secs_f64());
        println!(
            "relay: start-up {:.1} ms; broker had all {n} after {:.2} s ({broker_rate:.0} events/s); \
             slot confirmed at the end after {:.2} s ({relay_rate:.0} events/s)",
            relay.startup.as_secs_f64() * 1e3,
            relay.broker_wall.map_or(f64::NAN, |w| w.as_secs_f64()),
            relay.wall.as_secs_f64()
        );
        println!(
            "relay / pg_recvlogical: {:.2} (to slot confirmed), {:.2} (to broker has all)",
            relay_rate / ref_rate,
            broker_rate / ref_rate
        );
        println!(
            "CPU/M events: relay {:.2} s; its walsender {:.2} s; bench process (mock broker, pollers) {:.2} s",
            per_million(relay.cpu_s, n),
            per_million(relay.walsender_cpu_s, n),
            per_million(relay.bench_cpu_s, n)
        );
        println!(
            "relay CPU / the CPU of pg_recvlogical's walsender: {:.2}",
            relay.cpu_s / reference.walsender_cpu_s
        );
        println!("relay peak RSS (VmHWM): {:.1} MiB", relay.rss_mib);
        Ok(Round {
            index,
            load,
            avg_payload,
            reference,
            relay,
        })
    }
}
