//! End-to-end benchmark of the relay: `cargo bench --bench relay [-- FLAGS]`.
//!
//! It starts a throwaway Postgres (the integration tests' harness) and
//! librdkafka's in-process mock Kafka cluster, both on 127.0.0.1, and runs the
//! release `outbox-relay` binary as a subprocess, as users run it. Three parts:
//!
//! 1. **Backlog drain**, in rounds (median reported). Two slots see the same
//!    WAL: N outbox rows are loaded while neither is read. `pg_recvlogical` (pgoutput, to /dev/null)
//!    drains one: Postgres's own decode rate, the reference. The relay drains
//!    the other until the slot's `confirmed_flush_lsn` reaches the end, which it
//!    moves only after broker acks. CPU comes from `/proc/<pid>/stat` (relay,
//!    `pg_recvlogical`, and the walsender backend each drives), peak RSS from
//!    `VmHWM` in `/proc/<pid>/status`.
//! 2. **Steady rate.** A writer commits fixed-size transactions on a fixed
//!    schedule; latency is commit → broker ack from the relay's own
//!    `outbox_relay_commit_to_ack_seconds` histogram (read from its /metrics)
//!    and commit → slot confirmed (polled every 2 ms). No consumer reads the
//!    topics: the mock broker serves fetches by a linear scan of a partition's
//!    batches, which grows with the run and would take a core from the relay.
//! 3. **Large transaction.** One transaction of M rows, drained by
//!    `pg_recvlogical` and by a fresh relay: time and the relay's peak RSS.
//!
//! Output: human-readable lines, then one `bench: key=value ...` line with
//! every figure. The method and a sample run are in docs/benchmark.md.
//!
//! Flags (unknown ones, like cargo's `--bench`, are ignored): `--events N`,
//! `--rounds N` (backlog drains; the median is reported), `--brokers N` and
//! `--partitions N` (mock cluster shape), `--rate R`, `--duration S`, `--large-tx N`, `--skip-large`,
//! `--status-interval D`, `--cleanup none|delete` and `-X KEY=VALUE` (passed to the relay), `--quick`,
//! and `--shards K`: instead of the three parts, K shard relays (`--shard I/K`; 1: one relay
//! without it) drain each round's backlog one after the other, and the bench reports each
//! relay's and walsender's CPU per event of the whole outbox and the drain K+1 cores would
//! reach (events / the larger of the busiest process's CPU seconds and all their CPU seconds
//! over K+1); and `--formats`: instead of the three parts, each round drains N rows with the
//! relay's own format and N more with Avro keys and values (`--key-converter avro
//! --value-converter avro`, the tests' Schema Registry in process), alternating which goes
//! first, and the bench reports the relay's CPU per event of each and their ratio, with the
//! registry requests the Avro relay made (one per subject: never one per event).

// Test support: its `expect`s are on loopback set-up, not on relay output.
#[allow(clippy::expect_used)]
#[path = "../tests/support/http.rs"]
mod http;
#[path = "../tests/support/postgres.rs"]
mod postgres;
#[allow(dead_code, clippy::expect_used)]
#[path = "../tests/support/registry.rs"]
mod registry;

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use outbox_relay::lsn::Lsn;
use outbox_relay::outbox::Shard;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;

use postgres::{PgCluster, PgOptions};

/// Event types: one topic each (the relay routes by `event_type`).
const EVENT_TYPES: [&str; 10] = [
    "OrderPlaced",
    "OrderPaid",
    "OrderPacked",
    "OrderShipped",
    "OrderDelivered",
    "OrderCancelled",
    "OrderRefunded",
    "PaymentFailed",
    "AddressChanged",
    "InvoiceIssued",
];
/// Partitions per topic on the mock cluster (`--partitions`), set once at start.
static PARTITIONS: std::sync::OnceLock<i32> = std::sync::OnceLock::new();

fn partitions() -> i32 {
    PARTITIONS.get().copied().unwrap_or(4)
}
/// Distinct aggregates (record keys).
const AGGREGATES: u64 = 1_000;
/// Rows per backlog transaction.
const BACKLOG_TX_ROWS: u64 = 100;
/// Most transactions per second the steady writer commits (one every 10 ms).
const MAX_STEADY_TX_PER_S: u64 = 100;

const SLOT_REF: &str = "bench_ref";
const SLOT_RELAY: &str = "bench_relay";
const PUBLICATION: &str = "bench_pub";

/// Every phase's ids start with its own prefix; the rest is the row's sequence number.
const ID_BACKLOG: &str = "10000000-0000-4000-8000-";
const ID_STEADY: &str = "20000000-0000-4000-8000-";
const ID_LARGE: &str = "30000000-0000-4000-8000-";

/// How often the slot's confirmed position is polled.
const CONFIRMED_POLL: Duration = Duration::from_millis(2);
/// How often the broker's high watermarks are summed.
const WATERMARK_POLL: Duration = Duration::from_millis(20);
/// How often a child process's /proc entry is sampled.
const PROC_POLL: Duration = Duration::from_millis(5);
/// Most the relay may take from spawn to "streaming".
const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);
/// Grace for the relay's shutdown (its --shutdown-timeout plus margin).
const RELAY_SHUTDOWN: Duration = Duration::from_secs(15);

const SCHEMA: &str = "
    CREATE TABLE public.outbox (
        id uuid PRIMARY KEY,
        aggregate_type text NOT NULL,
        aggregate_id text,
        event_type text,
        payload jsonb,
        created_at timestamptz NOT NULL DEFAULT now()
    );
";

/// The payload of row `g`: an order event of about 300 bytes of JSON.
const PAYLOAD_SQL: &str = "jsonb_build_object(\
    'order_id', g, \
    'customer_id', 'cust-' || lpad((g % 5000)::text, 5, '0'), \
    'amount_cents', (g * 37) % 100000, \
    'currency', 'EUR', \
    'placed_at', '2024-01-02T03:04:05Z', \
    'lines', jsonb_build_array(\
        jsonb_build_object('sku', 'SKU-' || lpad((g % 977)::text, 4, '0'), 'qty', 1 + g % 5, 'unit_cents', 100 + g % 9000)), \
    'shipping', jsonb_build_object('name', 'Customer ' || (g % 5000), 'street', (g % 200) || ' Main Street', \
        'city', 'Springfield', 'zip', lpad((g % 99999)::text, 5, '0')), \
    'note', 'left at the front door')";

// ---------------------------------------------------------------------------------------
// Flags

#[derive(Debug, Clone)]
struct Args {
    events: u64,
    rate: u64,
    duration: Duration,
    large_tx: u64,
    skip_large: bool,
    /// Backlog drains, each on freshly loaded rows; the median is reported.
    rounds: u64,
    /// Mock cluster brokers (partition leaders spread over them).
    brokers: i32,
    /// Partitions per topic.
    partitions: i32,
    status_interval: String,
    /// `--delivery` passed to the relay (`at-least-once` or `exactly-once`).
    delivery: String,
    /// `--cleanup` passed to the relay (`none` or `delete`).
    cleanup: String,
    kafka_properties: Vec<String>,
    quick: bool,
    /// `--shards K`: only the shard drains, with K relays (1: one without `--shard`).
    shards: Option<u32>,
    /// `--formats`: only backlog drains, alternating the relay's own format and Avro keys and
    /// values through a Schema Registry.
    formats: bool,
}

impl Args {
    /// `std::env::args`, ignoring what it does not know (cargo passes `--bench`).
    fn parse() -> Result<Args> {
        let raw: Vec<String> = std::env::args().skip(1).collect();
        let quick = raw.iter().any(|a| a == "--quick");
        let mut args = Args {
            events: if quick { 20_000 } else { 200_000 },
            rate: 5_000,
            duration: Duration::from_secs(if quick { 5 } else { 30 }),
            large_tx: if quick { 100_000 } else { 1_000_000 },
            skip_large: false,
            rounds: if quick { 1 } else { 3 },
            brokers: 1,
            partitions: 4,
            status_interval: "100ms".to_owned(),
            delivery: "at-least-once".to_owned(),
            cleanup: "none".to_owned(),
            kafka_properties: Vec::new(),
            quick,
            shards: None,
            formats: false,
        };
        let mut it = raw.iter();
        while let Some(flag) = it.next() {
            let mut value = |name: &str| {
                it.next()
                    .cloned()
                    .ok_or_else(|| anyhow!("{name} needs a value"))
            };
            let small = |name: &str, n: u64| -> Result<i32> {
                i32::try_from(n)
                    .ok()
                    .filter(|n| (1..=1000).contains(n))
                    .ok_or_else(|| anyhow!("{name} {n}: expected 1 to 1000"))
            };
            let number = |name: &str, v: String| -> Result<u64> {
                v.replace('_', "")
                    .parse::<u64>()
                    .with_context(|| format!("{name} {v:?}: expected a whole number"))
            };
            match flag.as_str() {
                "--events" => args.events = number(flag, value(flag)?)?,
                "--rounds" => args.rounds = number(flag, value(flag)?)?,
                "--rate" => args.rate = number(flag, value(flag)?)?,
                "--duration" => {
                    args.duration = Duration::from_secs(number(flag, value(flag)?)?);
                }
                "--large-tx" => args.large_tx = number(flag, value(flag)?)?,
                "--status-interval" => args.status_interval = value(flag)?,
                "-X" | "--kafka-property" => args.kafka_properties.push(value(flag)?),
                "--delivery" => args.delivery = value(flag)?,
                "--cleanup" => args.cleanup = value(flag)?,
                "--skip-large" => args.skip_large = true,
                "--formats" => args.formats = true,
                "--brokers" => args.brokers = small(flag, number(flag, value(flag)?)?)?,
                "--partitions" => args.partitions = small(flag, number(flag, value(flag)?)?)?,
                "--shards" => {
                    let count = u32::try_from(number(flag, value(flag)?)?).unwrap_or(0);
                    let max = outbox_relay::outbox::shard::MAX_SHARDS;
                    if !(1..=max).contains(&count) {
                        bail!("--shards: expected 1 to {max}");
                    }
                    args.shards = Some(count);
                }
                _ => {}
            }
        }
        if args.events == 0 || args.rate == 0 || args.duration.is_zero() || args.rounds == 0 {
            bail!("--events, --rounds, --rate and --duration must be positive");
        }
        if args.large_tx == 0 {
            args.skip_large = true;
        }
        Ok(args)
    }
}

// ---------------------------------------------------------------------------------------
// Results

/// Everything measured, in the order of the final `bench:` line.
#[derive(Default)]
struct Report {
    fields: Vec<(String, String)>,
}

impl Report {
    fn add(&mut self, key: &str, value: impl std::fmt::Display) {
        self.fields.push((key.to_owned(), value.to_string()));
    }

    fn add_f(&mut self, key: &str, value: f64, decimals: usize) {
        self.add(key, format!("{value:.decimals$}"));
    }

    fn line(&self) -> String {
        let mut line = String::from("bench:");
        for (k, v) in &self.fields {
            let _ = write!(line, " {k}={v}");
        }
        line
    }
}

/// `p` in [0, 1] of sorted durations, in milliseconds.
fn percentile_ms(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1].as_secs_f64() * 1e3
}

/// The relay's commit → broker ack histogram: the commit time comes from the
/// WAL (the transaction's commit timestamp), the ack time from the delivery
/// report, both on this machine's clock.
struct AckHistogram {
    /// `(upper bound in seconds, cumulative count)`, ascending; the last is `+Inf`.
    buckets: Vec<(f64, u64)>,
    count: u64,
    sum_s: f64,
}

impl AckHistogram {
    const NAME: &str = "outbox_relay_commit_to_ack_seconds";

    fn parse(metrics: &str) -> Result<AckHistogram> {
        let mut buckets = Vec::new();
        let (mut count, mut sum_s) = (None, None);
        for line in metrics.lines() {
            let Some(rest) = line.strip_prefix(Self::NAME) else {
                continue;
            };
            let Some((series, value)) = rest.rsplit_once(' ') else {
                continue;
            };
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            if let Some(le) = series
                .strip_prefix("_bucket{le=\"")
                .and_then(|s| s.strip_suffix("\"}"))
            {
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().with_context(|| format!("bucket bound {le:?}"))?
                };
                buckets.push((le, value as u64));
            } else if series == "_count" {
                count = Some(value as u64);
            } else if series == "_sum" {
                sum_s = Some(value);
            }
        }
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        match (count, sum_s) {
            (Some(count), Some(sum_s)) if !buckets.is_empty() => Ok(AckHistogram {
                buckets,
                count,
                sum_s,
            }),
            _ => bail!("no {} histogram in the relay's /metrics", Self::NAME),
        }
    }

    /// The `p` quantile in milliseconds, interpolated linearly inside its
    /// bucket as Prometheus' `histogram_quantile` does.
    fn quantile_ms(&self, p: f64) -> f64 {
        let rank = p * self.count as f64;
        let mut lower = (0.0, 0u64);
        for &(le, cumulative) in &self.buckets {
            if cumulative as f64 >= rank && cumulative > lower.1 {
                if le.is_infinite() {
                    return lower.0 * 1e3;
                }
                let within = (rank - lower.1 as f64) / (cumulative - lower.1) as f64;
                return (lower.0 + (le - lower.0) * within) * 1e3;
            }
            lower = (le, cumulative);
        }
        f64::NAN
    }

    /// What was recorded since `before` (an earlier scrape of the same relay).
    fn minus(&self, before: &AckHistogram) -> AckHistogram {
        let buckets = self
            .buckets
            .iter()
            .map(|&(le, n)| {
                let earlier = before
                    .buckets
                    .iter()
                    .find(|(l, _)| *l == le)
                    .map_or(0, |(_, c)| *c);
                (le, n.saturating_sub(earlier))
            })
            .collect();
        AckHistogram {
            buckets,
            count: self.count.saturating_sub(before.count),
            sum_s: self.sum_s - before.sum_s,
        }
    }

    /// The upper bound of the highest non-empty bucket, in milliseconds.
    fn max_bound_ms(&self) -> f64 {
        let top = self.buckets.iter().find(|(_, c)| *c >= self.count);
        top.map_or(f64::NAN, |(le, _)| le * 1e3)
    }

    fn mean_ms(&self) -> f64 {
        self.sum_s / self.count.max(1) as f64 * 1e3
    }
}

fn per_million(cpu_s: f64, events: u64) -> f64 {
    cpu_s / (events as f64 / 1e6)
}

// ---------------------------------------------------------------------------------------
// /proc

/// Seconds per clock tick of /proc/<pid>/stat (`getconf CLK_TCK`, usually 100).
fn clock_tick() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .trim()
                .parse::<f64>()
                .ok()
        })
        .filter(|t| *t > 0.0)
        .map_or(0.01, |t| 1.0 / t)
}

/// State and user+system CPU ticks of a process (or "self").
fn proc_stat(pid: &str) -> Option<(char, u64)> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may contain anything: split after the last ')'.
    let rest = text.get(text.rfind(')')? + 1..)?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first()?.chars().next()?;
    // Fields 14 (utime) and 15 (stime) of proc(5); `fields[0]` is field 3.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((state, utime + stime))
}

/// The 1-minute load average: other work on the machine skews every figure.
fn load_average() -> String {
    fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".to_owned())
}

fn cpu_ticks(pid: u32) -> Option<u64> {
    proc_stat(&pid.to_string()).map(|(_, t)| t)
}

fn self_cpu_ticks() -> u64 {
    proc_stat("self").map_or(0, |(_, t)| t)
}

/// Peak resident set size (`VmHWM`), in MiB.
fn vm_hwm_mib(pid: u32) -> Option<f64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// Samples a process's CPU ticks until it is gone or `stop` is set; returns the
/// last reading (so at most one `PROC_POLL` of CPU is missed).
fn sample_cpu_until_exit(pid: u32, stop: Arc<AtomicBool>, limit: Duration) -> Option<u64> {
    let deadline = Instant::now() + limit;
    let mut last = None;
    for _ in 0..(limit.as_millis() / PROC_POLL.as_millis() + 1) {
        match cpu_ticks(pid) {
            Some(t) => last = Some(t),
            None => break,
        }
        if stop.load(Ordering::Relaxed) || Instant::now() >= deadline {
            break;
        }
        thread::sleep(PROC_POLL);
    }
    last
}

// ---------------------------------------------------------------------------------------
// Binaries

/// The release relay binary: cargo sets `CARGO_BIN_EXE_outbox-relay` for
/// benches (and builds it in the bench profile); otherwise build it.
fn relay_binary() -> Result<PathBuf> {
    if let Some(path) = option_env!("CARGO_BIN_EXE_outbox-relay").map(PathBuf::from)
        && path.is_file()
    {
        return Ok(path);
    }
    let manifest = env!("CARGO_MANIFEST_DIR");
    println!("building the release relay: cargo build --release --bin outbox-relay");
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned()))
        .args(["build", "--release", "--bin", "outbox-relay"])
        .current_dir(manifest)
        .status()
        .context("run cargo build --release")?;
    if !status.success() {
        bail!("cargo build --release --bin outbox-relay failed: {status}");
    }
    let path = Path::new(manifest).join("target/release/outbox-relay");
    if !path.is_file() {
        bail!("{} not found after the build", path.display());
    }
    Ok(path)
}

/// `pg_recvlogical` from `pg_config --bindir`, else Debian's PostgreSQL 15 directory.
fn pg_recvlogical() -> Result<PathBuf> {
    let from_pg_config = Command::new("pg_config")
        .arg("--bindir")
        .output()
        .ok()
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()).join("pg_recvlogical"));
    from_pg_config
        .into_iter()
        .chain([PathBuf::from("/usr/lib/postgresql/15/bin/pg_recvlogical")])
        .find(|p| p.is_file())
        .ok_or_else(|| anyhow!("pg_recvlogical not found (apt-get install postgresql-15)"))
}

// ---------------------------------------------------------------------------------------
// Postgres helpers

async fn query_text(client: &tokio_postgres::Client, sql: &str) -> Result<Option<String>> {
    let rows = client
        .simple_query(sql)
        .await
        .with_context(|| format!("query {sql}"))?;
    Ok(rows.into_iter().find_map(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
        _ => None,
    }))
}

async fn current_lsn(client: &tokio_postgres::Client) -> Result<Lsn> {
    query_text(client, "SELECT pg_current_wal_lsn()::text")
        .await?
        .ok_or_else(|| anyhow!("pg_current_wal_lsn() returned nothing"))?
        .parse()
        .map_err(|e| anyhow!("pg_current_wal_lsn(): {e:?}"))
}

async fn confirmed_flush(client: &tokio_postgres::Client, slot: &str) -> Result<Lsn> {
    let text = query_text(
        client,
        &format!(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = '{slot}'"
        ),
    )
    .await?;
    Ok(text.and_then(|t| t.parse().ok()).unwrap_or(Lsn::ZERO))
}

/// The walsender serving `slot`, once one is attached (polled up to `timeout`).
async fn walsender_pid(
    client: &tokio_postgres::Client,
    slot: &str,
    timeout: Duration,
) -> Result<Option<u32>> {
    let deadline = Instant::now() + timeout;
    let sql = format!(
        "SELECT active_pid::text FROM pg_replication_slots WHERE slot_name = '{slot}' AND active"
    );
    for _ in 0..(timeout.as_millis() / 2 + 1) {
        if let Some(pid) = query_text(client, &sql).await?.and_then(|t| t.parse().ok()) {
            return Ok(Some(pid));
        }
        if Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(None)
}

/// `INSERT ... SELECT` of rows `$1..=$2` with ids `prefix || hex(g)`.
fn insert_sql(id_prefix: &str) -> String {
    let types = EVENT_TYPES
        .iter()
        .map(|t| format!("'{t}'"))
        .collect::<Vec<_>>()
        .join(",");
    format!(
        "INSERT INTO public.outbox (id, aggregate_type, aggregate_id, event_type, payload) \
         SELECT ('{id_prefix}' || lpad(to_hex(g), 12, '0'))::uuid, 'order', \
                'order-' || lpad(((g * 7919) % {AGGREGATES})::text, 4, '0'), \
                (ARRAY[{types}])[1 + (g % {n})::int], \
                {PAYLOAD_SQL} \
         FROM generate_series($1::bigint, $2::bigint) g",
        n = EVENT_TYPES.len()
    )
}

/// The end of a round's WAL, after a `CHECKPOINT` that logs the running transactions there.
/// A slot's `restart_lsn` moves only to such a record once it is confirmed past it; without
/// one (the bench's rounds are shorter than the 15 s between the ones the background writer
/// logs) every walsender would decode all earlier rounds' WAL again, skipping it, before
/// this round's: round N would cost the walsenders N rounds of decoding.
async fn end_of_load(client: &tokio_postgres::Client) -> Result<Lsn> {
    client.batch_execute("CHECKPOINT").await?;
    current_lsn(client).await
}

/// Loads rows `offset+1..=offset+events` in transactions of `BACKLOG_TX_ROWS`,
/// on two connections.
async fn load_backlog(pg: &PgCluster, offset: u64, events: u64) -> Result<()> {
    let workers = 2u64;
    let txs = events.div_ceil(BACKLOG_TX_ROWS);
    let mut tasks = Vec::new();
    for w in 0..workers {
        let client = pg.client().await;
        tasks.push(tokio::spawn(async move {
            let stmt = client.prepare(&insert_sql(ID_BACKLOG)).await?;
            let mut tx = w;
            while tx < txs {
                let first = (offset + tx * BACKLOG_TX_ROWS + 1) as i64;
                let last = (offset + ((tx + 1) * BACKLOG_TX_ROWS).min(events)) as i64;
                client.execute(&stmt, &[&first, &last]).await?;
                tx += workers;
            }
            Ok::<(), tokio_postgres::Error>(())
        }));
    }
    for task in tasks {
        task.await.context("loader task")?.context("load backlog")?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Kafka (mock cluster)

fn topics_and_partitions() -> impl Iterator<Item = (&'static str, i32)> {
    EVENT_TYPES
        .iter()
        .flat_map(|t| (0..partitions()).map(move |p| (*t, p)))
}

/// Sum of the high watermarks of every bench partition: records the broker has.
fn broker_total(consumer: &BaseConsumer) -> Option<i64> {
    let mut total = 0;
    for (topic, partition) in topics_and_partitions() {
        let (_, high) = consumer
            .fetch_watermarks(topic, partition, Duration::from_secs(2))
            .ok()?;
        total += high;
    }
    Some(total)
}

fn watermark_client(bootstrap: &str) -> Result<BaseConsumer> {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "bench-watermarks")
        .create()
        .context("create the watermark client")
}

/// Watches the broker until it holds `target` records in total; returns when that
/// happened (`None` on timeout or `stop`).
fn watch_broker(
    bootstrap: String,
    target: i64,
    limit: Duration,
    stop: Arc<AtomicBool>,
) -> thread::JoinHandle<Option<Instant>> {
    thread::spawn(move || {
        let consumer = watermark_client(&bootstrap).ok()?;
        let deadline = Instant::now() + limit;
        for _ in 0..(limit.as_millis() / WATERMARK_POLL.as_millis() + 1) {
            if broker_total(&consumer).is_some_and(|t| t >= target) {
                return Some(Instant::now());
            }
            if stop.load(Ordering::Relaxed) || Instant::now() >= deadline {
                return None;
            }
            thread::sleep(WATERMARK_POLL);
        }
        None
    })
}

// ---------------------------------------------------------------------------------------
// The relay subprocess

struct RelayProcess {
    child: Child,
    /// Its `--http-addr` port: the relay runs as deployed, with /metrics on.
    http_port: u16,
    spawned: Instant,
    /// Spawn to the "streaming" line, from the line's own timestamp (so the
    /// bench's reader thread being scheduled late does not count).
    streaming: Arc<Mutex<Option<Duration>>>,
    tail: Arc<Mutex<VecDeque<String>>>,
}

impl RelayProcess {
    /// The relay on `bench_relay`, or on `shard`'s slot and publication (derived from it).
    fn spawn(
        bin: &Path,
        pg: &PgCluster,
        bootstrap: &str,
        args: &Args,
        shard: Option<Shard>,
        extra: &[String],
    ) -> Result<Self> {
        let http_port = http::free_port();
        let mut child = Command::new(bin)
            .arg("--postgres-url")
            .arg(pg.url())
            .args(["--kafka-brokers", bootstrap])
            .args(["--slot", SLOT_RELAY, "--publication", PUBLICATION])
            .args(
                shard
                    .iter()
                    .flat_map(|s| ["--shard".to_owned(), s.to_string()]),
            )
            .args(["--status-interval", &args.status_interval])
            .args(["--delivery", &args.delivery])
            .args(["--cleanup", &args.cleanup])
            .args(
                args.kafka_properties
                    .iter()
                    .flat_map(|p| ["-X", p.as_str()]),
            )
            .args(["--shutdown-timeout", "10s", "--log-level", "info"])
            .args(["--http-addr", &format!("127.0.0.1:{http_port}")])
            .args(extra)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("spawn {}", bin.display()))?;
        let spawned = Instant::now();
        let spawned_wall = std::time::SystemTime::now();
        let streaming = Arc::new(Mutex::new(None));
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        let stderr = child.stderr.take().ok_or_else(|| anyhow!("relay stderr"))?;
        let (streaming2, tail2) = (Arc::clone(&streaming), Arc::clone(&tail));
        // Ends at EOF, when the relay exits.
        thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains("streaming from the slot") {
                    let logged = line
                        .split_whitespace()
                        .next()
                        .and_then(|t| humantime::parse_rfc3339(t).ok())
                        .and_then(|t| t.duration_since(spawned_wall).ok());
                    let mut at = streaming2.lock().unwrap_or_else(|p| p.into_inner());
                    at.get_or_insert_with(|| logged.unwrap_or_else(|| spawned.elapsed()));
                }
                let mut tail = tail2.lock().unwrap_or_else(|p| p.into_inner());
                if tail.len() >= 40 {
                    tail.pop_front();
                }
                tail.push_back(line);
            }
        });
        Ok(RelayProcess {
            child,
            http_port,
            spawned,
            streaming,
            tail,
        })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn log_tail(&self) -> String {
        let tail = self.tail.lock().unwrap_or_else(|p| p.into_inner());
        tail.iter().cloned().collect::<Vec<_>>().join("\n")
    }

    fn exited(&mut self) -> Result<()> {
        if let Ok(Some(status)) = self.child.try_wait() {
            bail!("the relay exited ({status}); its log:\n{}", self.log_tail());
        }
        Ok(())
    }

    /// Time from spawn to the "streaming from the slot" log line.
    async fn wait_streaming(&mut self) -> Result<Duration> {
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        for _ in 0..(STARTUP_TIMEOUT.as_millis() + 1) {
            let at = *self.streaming.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(at) = at {
                return Ok(at);
            }
            self.exited()?;
            if Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        bail!(
            "the relay did not start streaming within {STARTUP_TIMEOUT:?}; its log:\n{}",
            self.log_tail()
        )
    }

    /// Its `outbox_relay_commit_to_ack_seconds` histogram, from /metrics.
    fn commit_to_ack(&self) -> Result<AckHistogram> {
        let (status, body) = http::get(self.http_port, "/metrics")
            .ok_or_else(|| anyhow!("the relay's /metrics did not answer"))?;
        if status != 200 {
            bail!("the relay's /metrics answered {status}");
        }
        AckHistogram::parse(&body)
    }

    /// SIGTERM, then wait (SIGKILL after `RELAY_SHUTDOWN`).
    fn stop(mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + RELAY_SHUTDOWN;
        for _ in 0..(RELAY_SHUTDOWN.as_millis() / 20 + 1) {
            if matches!(self.child.try_wait(), Ok(Some(_))) || Instant::now() >= deadline {
                break;
            }
            thread::sleep(Duration::from_millis(20));
        }
        // Drop kills it if it is still running.
    }
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------------------
// The bench

struct Bench {
    args: Args,
    pg: PgCluster,
    control: tokio_postgres::Client,
    broker: MockCluster<'static, DefaultProducerContext>,
    relay_bin: PathBuf,
    recvlogical: PathBuf,
    tick: f64,
    report: Report,
    startups: Vec<Duration>,
}

/// One backlog round: the same WAL drained by `pg_recvlogical` and by the relay.
struct Round {
    index: u64,
    load: Duration,
    avg_payload: String,
    reference: RefDrain,
    relay: RelayDrain,
}

impl Round {
    /// relay events/s over `pg_recvlogical` events/s (to slot confirmed).
    fn ratio(&self) -> f64 {
        self.reference.wall.as_secs_f64() / self.relay.wall.as_secs_f64()
    }
}

/// One drain of a slot by `pg_recvlogical`.
struct RefDrain {
    wall: Duration,
    client_cpu_s: f64,
    walsender_cpu_s: f64,
}

/// One drain of a slot by the relay.
struct RelayDrain {
    wall: Duration,
    broker_wall: Option<Duration>,
    startup: Duration,
    cpu_s: f64,
    walsender_cpu_s: f64,
    rss_mib: f64,
    bench_cpu_s: f64,
}

impl Bench {
    /// `pg_recvlogical --start --endpos=<end>` on the reference slot, to /dev/null.
    async fn drain_reference(&self, end: Lsn, limit: Duration) -> Result<RefDrain> {
        let stderr = tempfile::NamedTempFile::new().context("temp file")?;
        let started = Instant::now();
        let mut child = Command::new(&self.recvlogical)
            .arg("-d")
            .arg(format!(
                "host=127.0.0.1 port={} user=postgres dbname=postgres",
                self.pg.port()
            ))
            .args([
                "-S",
                SLOT_REF,
                "--start",
                "-f",
                "/dev/null",
                "-F",
                "0",
                "-n",
            ])
            .arg(format!("--endpos={end}"))
            .args(["--plugin=pgoutput", "-o", "proto_version=1"])
            .arg("-o")
            .arg(format!("publication_names={PUBLICATION}"))
            .env("PGPASSWORD", PgCluster::PASSWORD)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr.reopen().context("reopen")?)
            .spawn()
            .context("spawn pg_recvlogical")?;
        let pid = child.id();
        let ws_stop = Arc::new(AtomicBool::new(false));
        let ws = walsender_pid(&self.control, SLOT_REF, Duration::from_secs(10))
            .await?
            .map(|ws_pid| {
                let stop = Arc::clone(&ws_stop);
                thread::spawn(move || sample_cpu_until_exit(ws_pid, stop, limit))
            });
        // Sample the client until it is a zombie (exited, not yet reaped): its
        // /proc entry still holds the final CPU times.
        let deadline = started + limit;
        let mut client_ticks = 0;
        let mut wall = None;
        for _ in 0..(limit.as_millis() / PROC_POLL.as_millis() + 1) {
            match proc_stat(&pid.to_string()) {
                Some((state, ticks)) => {
                    client_ticks = ticks;
                    if state == 'Z' || state == 'X' {
                        wall = Some(started.elapsed());
                        break;
                    }
                }
                None => {
                    wall = Some(started.elapsed());
                    break;
                }
            }
            if Instant::now() >= deadline {
                break;
            }
            thread::sleep(PROC_POLL);
        }
        let status = child.wait().context("wait for pg_recvlogical")?;
        ws_stop.store(true, Ordering::Relaxed);
        let ws_ticks = match ws {
            Some(handle) => handle.join().ok().flatten().unwrap_or(0),
            None => 0,
        };
        let Some(wall) = wall else {
            bail!("pg_recvlogical did not reach {end} within {limit:?}");
        };
        if !status.success() {
            bail!(
                "pg_recvlogical failed ({status}): {}",
                fs::read_to_string(stderr.path()).unwrap_or_default()
            );
        }
        Ok(RefDrain {
            wall,
            client_cpu_s: client_ticks as f64 * self.tick,
            walsender_cpu_s: ws_ticks as f64 * self.tick,
        })
    }

    /// Polls every 10 ms until the relay's slot is confirmed at or past `lsn`
    /// (true) or `within` has passed (false); an exited relay is an error.
    async fn wait_confirmed(
        &self,
        relay: &mut RelayProcess,
        lsn: Lsn,
        within: Duration,
    ) -> Result<bool> {
        let poll = Duration::from_millis(10);
        let deadline = Instant::now() + within;
        for _ in 0..(within.as_millis() / poll.as_millis() + 1) {
            if confirmed_flush(&self.control, SLOT_RELAY).await? >= lsn {
                return Ok(true);
            }
            relay.exited()?;
            if Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(poll).await;
        }
        Ok(false)
    }

    /// Spawns the relay (of `shard`) and waits until its slot is confirmed at `end` and the
    /// broker holds `broker_target` records.
    async fn drain_relay(
        &mut self,
        end: Lsn,
        broker_target: i64,
        limit: Duration,
        shard: Option<Shard>,
        extra: &[String],
    ) -> Result<RelayDrain> {
        let slot = &shard.map_or(SLOT_RELAY.to_owned(), |s| s.name(SLOT_RELAY));
        let bench_cpu_before = self_cpu_ticks();
        let stop = Arc::new(AtomicBool::new(false));
        let mut relay = RelayProcess::spawn(
            &self.relay_bin,
            &self.pg,
            &self.broker.bootstrap_servers(),
            &self.args,
            shard,
            extra,
        )?;
        let watcher = watch_broker(
            self.broker.bootstrap_servers(),
            broker_target,
            limit,
            Arc::clone(&stop),
        );
        let startup = relay.wait_streaming().await?;
        self.startups.push(startup);
        let ws_pid = walsender_pid(&self.control, slot, Duration::from_secs(10)).await?;
        let deadline = relay.spawned + limit;
        let mut done = None;
        for i in 0..(limit.as_millis() / CONFIRMED_POLL.as_millis() + 1) {
            if confirmed_flush(&self.control, slot).await? >= end {
                done = Some(Instant::now());
                break;
            }
            if i % 64 == 0 {
                relay.exited()?;
            }
            if Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(CONFIRMED_POLL).await;
        }
        let relay_ticks = cpu_ticks(relay.pid()).unwrap_or(0);
        let ws_ticks = ws_pid.and_then(cpu_ticks).unwrap_or(0);
        let bench_ticks = self_cpu_ticks().saturating_sub(bench_cpu_before);
        let Some(done) = done else {
            stop.store(true, Ordering::Relaxed);
            bail!(
                "the slot was not confirmed at {end} within {limit:?}; relay log:\n{}",
                relay.log_tail()
            );
        };
        // The broker has everything before the slot can be confirmed; give the
        // watcher one more poll to notice.
        thread::sleep(WATERMARK_POLL * 3);
        stop.store(true, Ordering::Relaxed);
        let broker_done = watcher.join().ok().flatten();
        let rss_mib = vm_hwm_mib(relay.pid()).unwrap_or(f64::NAN);
        let spawned = relay.spawned;
        relay.stop();
        Ok(RelayDrain {
            wall: done - spawned,
            broker_wall: broker_done.map(|t| t.min(done) - spawned),
            startup,
            cpu_s: relay_ticks as f64 * self.tick,
            walsender_cpu_s: ws_ticks as f64 * self.tick,
            rss_mib,
            bench_cpu_s: bench_ticks as f64 * self.tick,
        })
    }

    async fn broker_records(&self) -> Result<i64> {
        let bootstrap = self.broker.bootstrap_servers();
        tokio::task::spawn_blocking(move || {
            let consumer = watermark_client(&bootstrap)?;
            broker_total(&consumer).ok_or_else(|| anyhow!("cannot read the broker's watermarks"))
        })
        .await
        .context("watermark task")?
    }

    // -- Part 1 ---------------------------------------------------------------------------

    async fn backlog(&mut self) -> Result<()> {
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
            .drain_relay(end, before + n as i64, limit, None, &[])
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

    // -- Part 2 ---------------------------------------------------------------------------

    async fn steady(&mut self) -> Result<()> {
        let rate = self.args.rate;
        let tx_per_s = rate.clamp(1, MAX_STEADY_TX_PER_S);
        let batch = (rate / tx_per_s).max(1);
        let interval = Duration::from_secs(1) / u32::try_from(tx_per_s).unwrap_or(1);
        let txs = tx_per_s * self.args.duration.as_secs();
        let events = txs * batch;
        println!(
            "\n== 2. Steady rate: {} events/s ({tx_per_s} transactions/s of {batch}) for {} s, \
             --status-interval {} ==",
            batch * tx_per_s,
            self.args.duration.as_secs(),
            self.args.status_interval
        );
        // Move the reference slot along too, so it does not hold the WAL.
        self.control
            .simple_query(&format!(
                "SELECT pg_replication_slot_advance('{SLOT_REF}', pg_current_wal_lsn())"
            ))
            .await
            .context("advance the reference slot")?;

        let mut relay = RelayProcess::spawn(
            &self.relay_bin,
            &self.pg,
            &self.broker.bootstrap_servers(),
            &self.args,
            None,
            &[],
        )?;
        let startup = relay.wait_streaming().await?;
        self.startups.push(startup);

        // Warm-up, not measured: one row per event type, waited for until the
        // slot is confirmed past it. A fresh relay first fetches each topic's
        // metadata, and its walsender first re-reads WAL from the slot's
        // restart_lsn; neither is steady state (start-up is measured apart).
        let writer = self.pg.client().await;
        let stmt = writer.prepare(&insert_sql(ID_STEADY)).await?;
        let warm_first = (txs * batch) as i64;
        let warm_last = warm_first + EVENT_TYPES.len() as i64 - 1;
        writer.execute(&stmt, &[&warm_first, &warm_last]).await?;
        let warm_lsn = current_lsn(&writer).await?;
        if !self
            .wait_confirmed(&mut relay, warm_lsn, Duration::from_secs(60))
            .await?
        {
            bail!("the warm-up transaction was not confirmed within 60 s");
        }
        let warm_acks = relay.commit_to_ack()?;

        let limit = self.args.duration + Duration::from_secs(30);

        // The confirmed-position poller, on its own connection.
        let poll_client = self.pg.client().await;
        let stop = Arc::new(AtomicBool::new(false));
        let poll_stop = Arc::clone(&stop);
        let poller = tokio::spawn(async move {
            let mut seen: Vec<(Instant, Lsn)> = Vec::new();
            let deadline = Instant::now() + limit;
            for _ in 0..(limit.as_millis() / CONFIRMED_POLL.as_millis() + 1) {
                let lsn = confirmed_flush(&poll_client, SLOT_RELAY).await?;
                if seen.last().is_none_or(|(_, last)| lsn > *last) {
                    seen.push((Instant::now(), lsn));
                }
                if poll_stop.load(Ordering::Relaxed) || Instant::now() >= deadline {
                    break;
                }
                tokio::time::sleep(CONFIRMED_POLL).await;
            }
            Ok::<_, anyhow::Error>(seen)
        });

        // The writer: one transaction of `batch` rows every `interval`, on a fixed schedule.
        let start = tokio::time::Instant::now();
        let mut commits: Vec<(Instant, Lsn)> = Vec::with_capacity(txs as usize);
        let mut behind = 0u64;
        for i in 0..txs {
            let due = start + interval * u32::try_from(i).unwrap_or(u32::MAX);
            if tokio::time::Instant::now() > due + interval {
                behind += 1;
            }
            tokio::time::sleep_until(due).await;
            let first = (i * batch) as i64;
            let last = first + batch as i64 - 1;
            writer.batch_execute("BEGIN").await?;
            writer.execute(&stmt, &[&first, &last]).await?;
            // Commit time: just before COMMIT is sent (so latencies err high, by the round trip).
            let committing = Instant::now();
            writer.batch_execute("COMMIT").await?;
            commits.push((committing, current_lsn(&writer).await?));
        }
        let wrote = start.elapsed();
        let last_lsn = commits.last().map_or(Lsn::ZERO, |c| c.1);
        println!(
            "wrote {events} events in {:.2} s ({behind} transactions started late)",
            wrote.as_secs_f64()
        );

        // Wait for the slot to pass the last commit (what is still unconfirmed
        // after that is reported), then stop the pollers.
        self.wait_confirmed(&mut relay, last_lsn, Duration::from_secs(20))
            .await?;
        tokio::time::sleep(CONFIRMED_POLL * 5).await;
        stop.store(true, Ordering::Relaxed);
        let confirmed = poller.await.context("poller task")??;
        let rss_mib = vm_hwm_mib(relay.pid()).unwrap_or(f64::NAN);
        let acks = relay.commit_to_ack()?.minus(&warm_acks);
        relay.stop();

        // commit → slot confirmed, per transaction.
        let mut to_confirm: Vec<Duration> = Vec::with_capacity(commits.len());
        let mut unconfirmed = 0;
        for (at, lsn) in &commits {
            let i = confirmed.partition_point(|(_, c)| c < lsn);
            match confirmed.get(i) {
                Some((when, _)) => to_confirm.push(when.saturating_duration_since(*at)),
                None => unconfirmed += 1,
            }
        }
        to_confirm.sort();
        let unacked = events.saturating_sub(acks.count);
        println!(
            "commit → broker ack (the relay's histogram), {} events: p50 {:.2} ms, p99 {:.2} ms, \
             p99.9 {:.2} ms, mean {:.2} ms, max ≤ {} ms{}",
            acks.count,
            acks.quantile_ms(0.5),
            acks.quantile_ms(0.99),
            acks.quantile_ms(0.999),
            acks.mean_ms(),
            acks.max_bound_ms(),
            if unacked > 0 {
                format!(" ({unacked} not acknowledged)")
            } else {
                String::new()
            }
        );
        println!(
            "commit → slot confirmed_flush_lsn passed it, {} transactions: \
             p50 {:.1} ms, p99 {:.1} ms, p99.9 {:.1} ms, max {:.1} ms{}",
            to_confirm.len(),
            percentile_ms(&to_confirm, 0.5),
            percentile_ms(&to_confirm, 0.99),
            percentile_ms(&to_confirm, 0.999),
            percentile_ms(&to_confirm, 1.0),
            if unconfirmed > 0 {
                format!(" ({unconfirmed} never confirmed)")
            } else {
                String::new()
            }
        );
        println!(
            "relay: start-up {:.1} ms, peak RSS {rss_mib:.1} MiB",
            startup.as_secs_f64() * 1e3
        );

        let r = &mut self.report;
        r.add("steady_rate", batch * tx_per_s);
        r.add("steady_events", events);
        r.add("steady_late_tx", behind);
        r.add("steady_status_interval", &self.args.status_interval);
        r.add("steady_acked", acks.count);
        r.add_f("steady_ack_p50_ms", acks.quantile_ms(0.5), 2);
        r.add_f("steady_ack_p99_ms", acks.quantile_ms(0.99), 2);
        r.add_f("steady_ack_p999_ms", acks.quantile_ms(0.999), 2);
        r.add_f("steady_ack_mean_ms", acks.mean_ms(), 2);
        r.add("steady_ack_max_bound_ms", acks.max_bound_ms());
        r.add("steady_unacked", unacked);
        r.add_f("steady_confirm_p50_ms", percentile_ms(&to_confirm, 0.5), 1);
        r.add_f("steady_confirm_p99_ms", percentile_ms(&to_confirm, 0.99), 1);
        r.add_f(
            "steady_confirm_p999_ms",
            percentile_ms(&to_confirm, 0.999),
            1,
        );
        r.add_f("steady_confirm_max_ms", percentile_ms(&to_confirm, 1.0), 1);
        r.add("steady_unconfirmed_tx", unconfirmed);
        r.add_f("steady_relay_rss_mib", rss_mib, 1);
        Ok(())
    }

    // -- Part 3 ---------------------------------------------------------------------------

    async fn large(&mut self) -> Result<()> {
        let n = self.args.large_tx;
        println!("\n== 3. Large transaction: {n} events in one transaction ==");
        // Nothing streams now: move the reference slot up to here (outside any measurement).
        self.control
            .simple_query(&format!(
                "SELECT pg_replication_slot_advance('{SLOT_REF}', pg_current_wal_lsn())"
            ))
            .await
            .context("advance the reference slot")?;
        let t = Instant::now();
        let stmt = self.control.prepare(&insert_sql(ID_LARGE)).await?;
        self.control
            .execute(&stmt, &[&1i64, &(n as i64)])
            .await
            .context("insert the large transaction")?;
        let end = current_lsn(&self.control).await?;
        let load = t.elapsed();
        println!("inserted in {:.1} s, end LSN {end}", load.as_secs_f64());
        let limit = Duration::from_secs(180 + n / 2_000);

        let reference = self.drain_reference(end, limit).await?;
        println!(
            "pg_recvlogical: {:.2} s ({:.0} events/s); CPU pg_recvlogical {:.2} s, walsender {:.2} s",
            reference.wall.as_secs_f64(),
            n as f64 / reference.wall.as_secs_f64(),
            reference.client_cpu_s,
            reference.walsender_cpu_s
        );
        let before = self.broker_records().await?;
        let relay = self
            .drain_relay(end, before + n as i64, limit, None, &[])
            .await?;
        println!(
            "relay: {:.2} s from spawn to slot confirmed ({:.0} events/s; broker had all after {:.2} s); \
             CPU relay {:.2} s, walsender {:.2} s; peak RSS (VmHWM) {:.1} MiB",
            relay.wall.as_secs_f64(),
            n as f64 / relay.wall.as_secs_f64(),
            relay.broker_wall.map_or(f64::NAN, |w| w.as_secs_f64()),
            relay.cpu_s,
            relay.walsender_cpu_s,
            relay.rss_mib
        );

        let r = &mut self.report;
        r.add("large_events", n);
        r.add_f("large_load_s", load.as_secs_f64(), 2);
        r.add_f("large_ref_s", reference.wall.as_secs_f64(), 2);
        r.add_f("large_ref_walsender_cpu_s", reference.walsender_cpu_s, 2);
        r.add_f("large_relay_s", relay.wall.as_secs_f64(), 2);
        r.add_f(
            "large_relay_broker_s",
            relay.broker_wall.map_or(f64::NAN, |w| w.as_secs_f64()),
            2,
        );
        r.add_f("large_relay_cpu_s", relay.cpu_s, 2);
        r.add_f("large_relay_walsender_cpu_s", relay.walsender_cpu_s, 2);
        r.add_f("large_relay_rss_mib", relay.rss_mib, 1);
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// Shards

/// One shard's drain of a round's backlog: its processes' CPU seconds.
#[derive(Clone, Copy)]
struct ShardDrain {
    shard: Option<Shard>,
    /// Events of the backlog whose key hashes to the shard.
    owned: u64,
    relay_s: f64,
    walsender_s: f64,
    /// Wall time of the drain: the walsender's pace, unless the relay held it back.
    wall_s: f64,
}

/// One `--shards` round: each shard drained the same backlog.
struct ShardRound {
    drains: Vec<ShardDrain>,
}

impl ShardRound {
    /// CPU seconds of the busiest process (a relay or a walsender).
    fn busiest_s(&self) -> f64 {
        let cpu = self.drains.iter().flat_map(|d| [d.relay_s, d.walsender_s]);
        cpu.fold(0.0, f64::max)
    }

    /// CPU seconds of every relay and walsender.
    fn total_s(&self) -> f64 {
        self.drains.iter().map(|d| d.relay_s + d.walsender_s).sum()
    }

    /// Each process's median over `rounds`: a drain in the slow regime (see below) moves a
    /// round's busiest process, not this.
    fn typical(rounds: &[ShardRound]) -> ShardRound {
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
    fn projected(&self, events: u64) -> f64 {
        let cores = (self.drains.len() + 1) as f64;
        events as f64 / self.busiest_s().max(self.total_s() / cores)
    }

    /// The drain rate by the busiest process alone (the projection): each process
    /// on a core of its own.
    fn projected_by_busiest(&self, events: u64) -> f64 {
        events as f64 / self.busiest_s()
    }
}

/// The record key of backlog row `g` (`insert_sql`'s `aggregate_id`).
fn backlog_key(g: u64) -> String {
    format!("order-{:04}", (g * 7919) % AGGREGATES)
}

impl Bench {
    /// `--shards K`: each round loads N rows, then K shard relays (1: one relay without
    /// `--shard`) drain them one after the other, each shard's walsender decoding all of the
    /// WAL and sending only its rows. Reports each process's CPU per event of the whole
    /// outbox and the drain K+1 cores would reach.
    async fn shards(&mut self, count: u32) -> Result<()> {
        let n = self.args.events;
        let shards: Vec<Option<Shard>> = match count {
            1 => vec![None],
            _ => (0..count)
                .map(|index| Some(Shard { index, count }))
                .collect(),
        };
        println!(
            "\n== Shards: {n} events, {BACKLOG_TX_ROWS} per transaction, drained by {count} \
             shard(s) one after the other, {} round(s) ==",
            self.args.rounds
        );
        // The shards' publications and slots, before any row, so that every slot sees them all.
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
        let mut rounds = Vec::new();
        for round in 0..self.args.rounds {
            load_backlog(&self.pg, round * n, n).await?;
            let end = end_of_load(&self.control).await?;
            let limit = Duration::from_secs(120 + n / 2_000);
            let mut drains = Vec::new();
            for &shard in &shards {
                let keys = (round * n + 1..=(round + 1) * n).map(backlog_key);
                let owned = match shard {
                    Some(s) => keys.filter(|k| s.owns(Some(k.as_bytes()), None)).count() as u64,
                    None => n,
                };
                let before = self.broker_records().await?;
                let drain = self
                    .drain_relay(end, before + owned as i64, limit, shard, &[])
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
                count + 1,
                round.projected(n),
                per_million(round.busiest_s(), n),
                per_million(round.total_s(), n)
            );
            rounds.push(round);
        }
        let median = &ShardRound::typical(&rounds);
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
        let r = &mut self.report;
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
            let walsender = per_million(d.walsender_s, n);
            r.add_f(&format!("shard{index}_walsender_cpu_per_m_s"), walsender, 3);
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
        let all = rounds.iter().map(|r| format!("{:.0}", r.projected(n)));
        r.add("shard_projected_rounds", all.collect::<Vec<_>>().join(","));
        Ok(())
    }
}

async fn run(args: Args) -> Result<()> {
    let relay_bin = relay_binary()?;
    let recvlogical = pg_recvlogical()?;
    println!(
        "outbox-relay benchmark{}: relay {}, {}",
        if args.quick { " (quick)" } else { "" },
        relay_bin.display(),
        recvlogical.display()
    );

    let pg = tokio::task::spawn_blocking(|| {
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
    })
    .await
    .context("start Postgres")?;
    let control = pg.client().await;
    let version = query_text(&control, "SHOW server_version")
        .await?
        .unwrap_or_default();
    control.batch_execute(SCHEMA).await.context("schema")?;
    control
        .batch_execute(&format!(
            "CREATE PUBLICATION {PUBLICATION} FOR TABLE public.outbox WITH (publish = 'insert')"
        ))
        .await
        .context("publication")?;
    for slot in [SLOT_REF, SLOT_RELAY] {
        control
            .batch_execute(&format!(
                "SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')"
            ))
            .await
            .with_context(|| format!("create slot {slot}"))?;
    }
    let broker = MockCluster::new(args.brokers).context("start the mock Kafka cluster")?;
    let _ = PARTITIONS.set(args.partitions);
    for topic in EVENT_TYPES {
        broker
            .create_topic(topic, args.partitions, args.brokers)
            .with_context(|| format!("create topic {topic}"))?;
    }
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
    bench.report.add(
        "cpus",
        thread::available_parallelism().map_or(0, |n| n.get()),
    );
    bench
        .report
        .add("postgres", version.split_whitespace().next().unwrap_or("?"));
    bench.report.add("loadavg_start", load_average());
    bench.report.add("delivery", &bench.args.delivery);
    bench.report.add("cleanup", &bench.args.cleanup);
    bench.report.add("brokers", bench.args.brokers);
    bench.report.add("partitions", bench.args.partitions);
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
    let max_startup = bench.startups.iter().max().copied().unwrap_or_default();
    bench
        .report
        .add_f("relay_startup_max_ms", max_startup.as_secs_f64() * 1e3, 1);
    bench.report.add("loadavg_end", load_average());
    println!("\n{}", bench.report.line());
    Ok(())
}

impl Bench {
    /// `--formats`: each round drains N rows with the relay's own format and N with Avro keys
    /// and values, alternating which goes first; the Avro relay's ids are cached after its
    /// first event per subject (the registry counts its requests).
    async fn formats(&mut self) -> Result<()> {
        let n = self.args.events;
        let rounds = self.args.rounds;
        println!(
            "\n== Formats: {n} events per drain, {BACKLOG_TX_ROWS} per transaction, the relay's \
             format and Avro alternately, {rounds} round(s) =="
        );
        let registry = registry::Registry::start_on(0)
            .await
            .context("start the registry")?;
        let avro: Vec<String> = [
            "--key-converter",
            "avro",
            "--value-converter",
            "avro",
            "--schema-registry-url",
            &registry.url(),
        ]
        .map(str::to_owned)
        .to_vec();
        let mut relay_cpu = Vec::new();
        let mut avro_cpu = Vec::new();
        let mut ratios = Vec::new();
        let mut loaded = 0;
        for round in 0..rounds {
            let mut cpu = [0.0; 2];
            let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
            for format in order {
                load_backlog(&self.pg, loaded, n).await?;
                loaded += n;
                let end = end_of_load(&self.control).await?;
                // Move the reference slot along: it does not hold the WAL in this mode.
                self.control
                    .simple_query(&format!(
                        "SELECT pg_replication_slot_advance('{SLOT_REF}', '{end}')"
                    ))
                    .await
                    .context("advance the reference slot")?;
                let before = self.broker_records().await?;
                let extra: &[String] = if format == 0 { &[] } else { &avro };
                let limit = Duration::from_secs(120 + n / 2_000);
                let drain = self
                    .drain_relay(end, before + n as i64, limit, None, extra)
                    .await?;
                cpu[format] = per_million(drain.cpu_s, n);
                println!(
                    "round {} {}: {:.2} s ({:.0} events/s); relay CPU/M events {:.2} s",
                    round + 1,
                    ["relay format", "avro"][format],
                    drain.wall.as_secs_f64(),
                    n as f64 / drain.wall.as_secs_f64(),
                    cpu[format]
                );
            }
            relay_cpu.push(cpu[0]);
            avro_cpu.push(cpu[1]);
            ratios.push(cpu[1] / cpu[0]);
        }
        let median = |values: &[f64]| {
            let mut sorted = values.to_vec();
            sorted.sort_by(f64::total_cmp);
            sorted[sorted.len() / 2]
        };
        let list = |values: &[f64]| {
            values
                .iter()
                .map(|v| format!("{v:.3}"))
                .collect::<Vec<_>>()
                .join(",")
        };
        let requests = registry.requests();
        println!(
            "relay CPU/M events: relay format {:.2} s, avro {:.2} s (medians); avro / relay \
             format per round: {}; median {:.2}; registry requests: {requests} for {} avro events",
            median(&relay_cpu),
            median(&avro_cpu),
            list(&ratios),
            median(&ratios),
            n * rounds
        );
        let r = &mut self.report;
        r.add("events", n);
        r.add("format_rounds", rounds);
        r.add_f("relay_cpu_per_m_s", median(&relay_cpu), 3);
        r.add_f("avro_cpu_per_m_s", median(&avro_cpu), 3);
        r.add("avro_vs_relay_cpu_rounds", list(&ratios));
        r.add_f("avro_vs_relay_cpu", median(&ratios), 3);
        r.add("registry_requests", requests);
        Ok(())
    }
}

fn main() -> ExitCode {
    let args = match Args::parse() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
