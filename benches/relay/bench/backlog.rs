//! Part 1, the backlog drain: rounds of N rows drained by `pg_recvlogical` and by the
//! relay, the median round reported.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use super::Bench;
use crate::figures::report::{Report, per_million};
use crate::figures::rounds::{Round, each_round, events_per_s};
use crate::pg::{end_of_load, query_text};
use crate::relay_process::RelayRun;
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
        let Some(median) = Round::median(&results) else {
            bail!("no drain round ran");
        };
        if rounds > 1 {
            println!(
                "median round {}: relay / pg_recvlogical {:.2}; all rounds: {}",
                median.index + 1,
                median.ratio(),
                each_round(&results, Round::ratio)
            );
        }
        report_backlog(&mut self.report, &results, median, n);
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
            events_per_s(n, load)
        );
        let limit = Duration::from_secs(120 + n / 2_000);

        let reference = self.drain_reference(end, limit).await?;
        println!(
            "pg_recvlogical: {:.2} s, {:.0} events/s; CPU/M events: pg_recvlogical {:.2} s + walsender {:.2} s",
            reference.wall.as_secs_f64(),
            reference.events_per_s(n),
            per_million(reference.client_cpu_s, n),
            per_million(reference.walsender_cpu_s, n)
        );

        let before = self.broker_records().await?;
        let relay = self
            .drain_relay(end, before + n as i64, limit, &RelayRun::plain(None))
            .await?;
        let round = Round {
            index,
            load,
            avg_payload,
            reference,
            relay,
        };
        print_relay_drain(&round, n);
        Ok(round)
    }
}

/// A round's relay lines, beside the reference's.
fn print_relay_drain(round: &Round, n: u64) {
    let relay = &round.relay;
    println!(
        "relay: start-up {:.1} ms; broker had all {n} after {:.2} s ({:.0} events/s); \
         slot confirmed at the end after {:.2} s ({:.0} events/s)",
        relay.startup.as_secs_f64() * 1e3,
        relay.broker_s(),
        relay.broker_events_per_s(n),
        relay.wall.as_secs_f64(),
        relay.events_per_s(n)
    );
    println!(
        "relay / pg_recvlogical: {:.2} (to slot confirmed), {:.2} (to broker has all)",
        round.ratio(),
        round.broker_ratio()
    );
    println!(
        "CPU/M events: relay {:.2} s; its walsender {:.2} s; bench process (mock broker, pollers) {:.2} s",
        per_million(relay.cpu_s, n),
        per_million(relay.walsender_cpu_s, n),
        per_million(relay.bench_cpu_s, n)
    );
    println!(
        "relay CPU / the CPU of pg_recvlogical's walsender: {:.2}",
        round.relay_cpu_vs_ref_walsender()
    );
    println!("relay peak RSS (VmHWM): {:.1} MiB", relay.rss_mib);
}

/// The backlog's keys: the median round in full, every round's ratios and CPU figures.
fn report_backlog(r: &mut Report, rounds: &[Round], median: &Round, n: u64) {
    let reference = &median.reference;
    let relay = &median.relay;
    r.add("events", n);
    r.add("drain_rounds", rounds.len());
    r.add("drain_median_round", median.index + 1);
    r.add_f("load_s", median.load.as_secs_f64(), 2);
    r.add("payload_avg_bytes", &median.avg_payload);
    r.add_f("ref_s", reference.wall.as_secs_f64(), 3);
    r.add_f("ref_events_per_s", reference.events_per_s(n), 0);
    r.add_f("ref_cpu_per_m_s", per_million(reference.client_cpu_s, n), 3);
    r.add_f(
        "ref_walsender_cpu_per_m_s",
        per_million(reference.walsender_cpu_s, n),
        3,
    );
    r.add_f("relay_startup_ms", relay.startup.as_secs_f64() * 1e3, 1);
    r.add_f("relay_s", relay.wall.as_secs_f64(), 3);
    r.add_f("relay_events_per_s", relay.events_per_s(n), 0);
    r.add_f("relay_broker_s", relay.broker_s(), 3);
    r.add_f("relay_broker_events_per_s", relay.broker_events_per_s(n), 0);
    r.add_f("drain_ratio", median.ratio(), 3);
    r.add_f("drain_ratio_broker", median.broker_ratio(), 3);
    r.add("drain_ratio_rounds", each_round(rounds, Round::ratio));
    r.add_f("relay_cpu_per_m_s", per_million(relay.cpu_s, n), 3);
    r.add(
        "relay_cpu_per_m_s_rounds",
        each_round(rounds, |round| per_million(round.relay.cpu_s, n)),
    );
    r.add_f(
        "relay_walsender_cpu_per_m_s",
        per_million(relay.walsender_cpu_s, n),
        3,
    );
    r.add(
        "relay_walsender_cpu_per_m_s_rounds",
        each_round(rounds, |round| per_million(round.relay.walsender_cpu_s, n)),
    );
    r.add(
        "relay_cpu_vs_ref_walsender_rounds",
        each_round(rounds, Round::relay_cpu_vs_ref_walsender),
    );
    r.add_f("bench_cpu_per_m_s", per_million(relay.bench_cpu_s, n), 3);
    r.add_f("relay_rss_mib", Round::peak_rss_mib(rounds), 1);
}
