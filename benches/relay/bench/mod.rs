//! The bench itself: one Postgres, one mock cluster, and the parts run against them.

mod backlog;
mod drains;
mod formats;
mod large;
mod shards;
mod steady;

use std::path::PathBuf;
use std::thread;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::binaries::{pg_recvlogical, relay_binary};
use crate::figures::report::Report;
use crate::flags::Args;
use crate::kafka::{Broker, start_broker};
use crate::pg::{create_objects, query_text};
use crate::postgres::{PgCluster, PgOptions};
use crate::procfs::{clock_tick, load_average};
use crate::workload::EVENT_TYPES;

/// What every part runs against, and what they have measured so far.
struct Bench {
    args: Args,
    pg: PgCluster,
    /// The bench's own session: loads, slot positions, walsender pids.
    control: tokio_postgres::Client,
    broker: Broker,
    relay_bin: PathBuf,
    recvlogical: PathBuf,
    /// Seconds per /proc clock tick.
    tick: f64,
    report: Report,
    /// Every relay's spawn to "streaming".
    startups: Vec<Duration>,
}

/// Runs the parts `args` asks for and prints the `bench:` line.
pub(crate) async fn run(args: Args) -> Result<()> {
    let mut bench = Bench::start(args).await?;
    if let Some(count) = bench.args.shards {
        bench.shards(count).await?;
    } else if bench.args.formats {
        bench.formats().await?;
    } else {
        bench.backlog().await?;
        bench.steady().await?;
        if bench.args.skip_large {
            println!("\n== 3. Large transaction: skipped ==");
        } else {
            bench.large().await?;
        }
    }
    bench.finish();
    Ok(())
}

impl Bench {
    /// Postgres with the outbox, its publication and both slots, and the mock cluster.
    async fn start(args: Args) -> Result<Bench> {
        let relay_bin = relay_binary()?;
        let recvlogical = pg_recvlogical()?;
        println!(
            "outbox-relay benchmark{}: relay {}, {}",
            if args.quick { " (quick)" } else { "" },
            relay_bin.display(),
            recvlogical.display()
        );

        let pg = tokio::task::spawn_blocking(start_postgres)
            .await
            .context("start Postgres")?;
        let control = pg.client().await;
        let version = query_text(&control, "SHOW server_version")
            .await?
            .unwrap_or_default();
        create_objects(&control).await?;
        let broker = start_broker(args.brokers, args.partitions)?;
        println!(
            "PostgreSQL {version} on 127.0.0.1:{}; mock Kafka {}: {} broker(s), {} topics x {} \
             partitions",
            pg.port(),
            broker.bootstrap_servers(),
            args.brokers,
            EVENT_TYPES.len(),
            args.partitions
        );

        let mut bench = Bench {
            args,
            pg,
            control,
            broker,
            relay_bin,
            recvlogical,
            tick: clock_tick(),
            report: Report::default(),
            startups: Vec::new(),
        };
        bench.report_setting(&version);
        Ok(bench)
    }

    /// The `bench:` line's first keys: the machine and the settings.
    fn report_setting(&mut self, version: &str) {
        let r = &mut self.report;
        r.add(
            "cpus",
            thread::available_parallelism().map_or(0, |n| n.get()),
        );
        r.add("postgres", version.split_whitespace().next().unwrap_or("?"));
        r.add("loadavg_start", load_average());
        r.add("delivery", &self.args.delivery);
        r.add("cleanup", &self.args.cleanup);
        r.add("brokers", self.args.brokers);
        r.add("partitions", self.args.partitions);
    }

    /// The `bench:` line's last keys, then the line.
    fn finish(&mut self) {
        let max_startup = self.startups.iter().max().copied().unwrap_or_default();
        self.report
            .add_f("relay_startup_max_ms", max_startup.as_secs_f64() * 1e3, 1);
        self.report.add("loadavg_end", load_average());
        println!("\n{}", self.report.line());
    }

    /// CPU seconds of `ticks` of /proc's clock.
    fn cpu_s(&self, ticks: u64) -> f64 {
        ticks as f64 * self.tick
    }
}

/// A throwaway cluster for the bench: the integration tests' harness, without the
/// background work that would land inside one drain and not another.
fn start_postgres() -> PgCluster {
    PgCluster::start_with(PgOptions {
        extra_conf: vec![
            // Keep checkpoints out of the measurements.
            ("max_wal_size".into(), "8GB".into()),
            ("checkpoint_timeout".into(), "1h".into()),
            // And autovacuum: it wakes at random moments to vacuum the
            // freshly loaded outbox and takes a core from whichever drain
            // is running then.
            ("autovacuum".into(), "off".into()),
        ],
        extra_hba: Vec::new(),
        major: None,
    })
}
