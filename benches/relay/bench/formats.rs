//! `--formats`: the relay's CPU per event with Avro keys and values through a Schema Registry,
//! against the relay's own format, drain by drain from one slot.

use std::time::Duration;

use anyhow::{Context, Result};

use super::Bench;
use crate::figures::report::per_million;
use crate::pg::{advance_reference, end_of_load};
use crate::registry::Registry;
use crate::relay_process::RelayRun;
use crate::workload::{BACKLOG_TX_ROWS, load_backlog};

/// The formats compared, in the order of a round's first drain.
const FORMATS: [&str; 2] = ["relay format", "avro"];

impl Bench {
    /// Each round drains N rows with the relay's own format and N with Avro keys and values,
    /// alternating which goes first; the Avro relay's ids are cached after its first event
    /// per subject (the registry counts its requests).
    pub(super) async fn formats(&mut self) -> Result<()> {
        let n = self.args.events;
        let rounds = self.args.rounds;
        println!(
            "\n== Formats: {n} events per drain, {BACKLOG_TX_ROWS} per transaction, the relay's \
             format and Avro alternately, {rounds} round(s) =="
        );
        let registry = Registry::start_on(0).await.context("start the registry")?;
        let url = registry.url();
        let avro = RelayRun {
            extra_args: [
                "--key-converter",
                "avro",
                "--value-converter",
                "avro",
                "--schema-registry-url",
                &url,
            ]
            .map(str::to_owned)
            .to_vec(),
            ..RelayRun::plain(None)
        };
        let runs = [RelayRun::plain(None), avro];
        let mut cpu = [Vec::new(), Vec::new()];
        let mut loaded = 0;
        for round in 0..rounds {
            let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
            for format in order {
                load_backlog(&self.pg, loaded, n).await?;
                loaded += n;
                let end = end_of_load(&self.control).await?;
                // The reference slot is not drained in this mode: it must not hold the WAL.
                advance_reference(&self.control).await?;
                let before = self.broker_records().await?;
                let limit = Duration::from_secs(120 + n / 2_000);
                let drain =
                    (self.drain_relay(end, before + n as i64, limit, &runs[format])).await?;
                let per_m = per_million(drain.cpu_s, n);
                cpu[format].push(per_m);
                println!(
                    "round {} {}: {:.2} s ({:.0} events/s); relay CPU/M events {per_m:.2} s",
                    round + 1,
                    FORMATS[format],
                    drain.wall.as_secs_f64(),
                    n as f64 / drain.wall.as_secs_f64(),
                );
            }
        }
        let ratios: Vec<f64> = cpu[1].iter().zip(&cpu[0]).map(|(a, r)| a / r).collect();
        let requests = registry.requests();
        println!(
            "relay CPU/M events: relay format {:.2} s, avro {:.2} s (medians); avro / relay \
             format per round: {}; median {:.2}; registry requests: {requests} for {} avro events",
            median(&cpu[0]),
            median(&cpu[1]),
            listed(&ratios),
            median(&ratios),
            n * rounds
        );
        let r = &mut self.report;
        r.add("events", n);
        r.add("format_rounds", rounds);
        r.add_f("relay_cpu_per_m_s", median(&cpu[0]), 3);
        r.add_f("avro_cpu_per_m_s", median(&cpu[1]), 3);
        r.add("avro_vs_relay_cpu_rounds", listed(&ratios));
        r.add_f("avro_vs_relay_cpu", median(&ratios), 3);
        r.add("registry_requests", requests);
        Ok(())
    }
}

/// The middle value (the upper one of an even count); NaN for none.
fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(f64::NAN)
}

fn listed(values: &[f64]) -> String {
    let listed: Vec<String> = values.iter().map(|v| format!("{v:.3}")).collect();
    listed.join(",")
}
