//! The bench's flags: clap parses the command line into [`Flags`], which become the
//! [`Args`] the bench runs with once `--quick` has chosen the defaults of the sizes.

use std::time::Duration;

use clap::Parser;
use outbox_relay::outbox::shard::MAX_SHARDS;

/// End-to-end benchmark of outbox-relay: `cargo bench --bench relay [-- FLAGS]`.
/// The method and the figures are in docs/benchmark.md.
#[derive(Debug, Parser)]
#[command(
    name = "relay",
    bin_name = "cargo bench --bench relay --",
    args_override_self = true
)]
pub(crate) struct Flags {
    /// Backlog events per drain round [default: 200000; --quick: 20000]
    #[arg(long, value_name = "N", value_parser = positive)]
    events: Option<u64>,

    /// Backlog drains, each on freshly loaded rows; the median is reported [default: 3;
    /// --quick: 1]
    #[arg(long, value_name = "N", value_parser = positive)]
    rounds: Option<u64>,

    /// Steady phase: events per second
    #[arg(long, value_name = "R", default_value = "5000", value_parser = positive)]
    rate: u64,

    /// Steady phase: seconds of writing [default: 30; --quick: 5]
    #[arg(long, value_name = "S", value_parser = positive)]
    duration: Option<u64>,

    /// Rows of the large transaction; 0 skips it [default: 1000000; --quick: 100000]
    #[arg(long = "large-tx", value_name = "N", value_parser = whole_number)]
    large_tx: Option<u64>,

    /// Skip the large transaction
    #[arg(long)]
    skip_large: bool,

    /// Mock cluster brokers (partition leaders spread over them)
    #[arg(long, value_name = "N", default_value = "1", value_parser = cluster_size)]
    brokers: i32,

    /// Partitions per topic on the mock cluster
    #[arg(long, value_name = "N", default_value = "4", value_parser = cluster_size)]
    partitions: i32,

    /// Passed to the relay
    #[arg(long, value_name = "D", default_value = "100ms")]
    status_interval: String,

    /// Passed to the relay: at-least-once or exactly-once
    #[arg(long, value_name = "MODE", default_value = "at-least-once")]
    delivery: String,

    /// Passed to the relay: none or delete
    #[arg(long, value_name = "MODE", default_value = "none")]
    cleanup: String,

    /// A librdkafka property passed to the relay (repeatable)
    #[arg(short = 'X', long = "kafka-property", value_name = "KEY=VALUE")]
    kafka_properties: Vec<String>,

    /// Small sizes: a smoke test
    #[arg(long)]
    quick: bool,

    /// Instead of the three parts, K shard relays drain each round's backlog one after the
    /// other (1: one relay without --shard)
    #[arg(long, value_name = "K", value_parser = shard_count)]
    shards: Option<u32>,

    /// Instead of the three parts, backlog drains alternating the relay's own format and Avro
    /// keys and values through the tests' Schema Registry in process
    #[arg(long)]
    formats: bool,

    /// Set by `cargo bench`; `cargo test` runs the bench without it
    #[arg(long, hide = true)]
    bench: bool,
}

/// What the bench runs with.
#[derive(Debug, Clone)]
pub(crate) struct Args {
    pub(crate) events: u64,
    pub(crate) rate: u64,
    pub(crate) duration: Duration,
    pub(crate) large_tx: u64,
    pub(crate) skip_large: bool,
    /// Backlog drains, each on freshly loaded rows; the median is reported.
    pub(crate) rounds: u64,
    /// Mock cluster brokers (partition leaders spread over them).
    pub(crate) brokers: i32,
    /// Partitions per topic.
    pub(crate) partitions: i32,
    pub(crate) status_interval: String,
    /// `--delivery` passed to the relay (`at-least-once` or `exactly-once`).
    pub(crate) delivery: String,
    /// `--cleanup` passed to the relay (`none` or `delete`).
    pub(crate) cleanup: String,
    pub(crate) kafka_properties: Vec<String>,
    pub(crate) quick: bool,
    /// `--shards K`: only the shard drains, with K relays (1: one without `--shard`).
    pub(crate) shards: Option<u32>,
    /// `--formats`: only the format drains.
    pub(crate) formats: bool,
}

impl Flags {
    /// Whether cargo ran the bench as a benchmark: `cargo test` (`--benches`, `--all-targets`)
    /// runs bench targets too, and must not start a benchmark.
    pub(crate) fn is_bench_run(&self) -> bool {
        self.bench
    }

    /// The sizes `--quick` does not set explicitly come from its defaults.
    pub(crate) fn into_args(self) -> Args {
        let events = self
            .events
            .unwrap_or(if self.quick { 20_000 } else { 200_000 });
        let rounds = self.rounds.unwrap_or(if self.quick { 1 } else { 3 });
        let duration_s = self.duration.unwrap_or(if self.quick { 5 } else { 30 });
        let large_tx = self
            .large_tx
            .unwrap_or(if self.quick { 100_000 } else { 1_000_000 });
        Args {
            events,
            rate: self.rate,
            duration: Duration::from_secs(duration_s),
            large_tx,
            skip_large: self.skip_large || large_tx == 0,
            rounds,
            brokers: self.brokers,
            partitions: self.partitions,
            status_interval: self.status_interval,
            delivery: self.delivery,
            cleanup: self.cleanup,
            kafka_properties: self.kafka_properties,
            quick: self.quick,
            shards: self.shards,
            formats: self.formats,
        }
    }
}

/// A count, with `_` allowed between digits (`200_000`).
fn whole_number(text: &str) -> Result<u64, String> {
    text.replace('_', "")
        .parse::<u64>()
        .map_err(|_| "expected a whole number".to_owned())
}

fn positive(text: &str) -> Result<u64, String> {
    match whole_number(text)? {
        0 => Err("expected a positive whole number".to_owned()),
        n => Ok(n),
    }
}

/// Brokers or partitions per topic of the mock cluster.
fn cluster_size(text: &str) -> Result<i32, String> {
    let n = whole_number(text)?;
    i32::try_from(n)
        .ok()
        .filter(|n| (1..=1000).contains(n))
        .ok_or_else(|| "expected 1 to 1000".to_owned())
}

fn shard_count(text: &str) -> Result<u32, String> {
    let n = whole_number(text)?;
    u32::try_from(n)
        .ok()
        .filter(|n| (1..=MAX_SHARDS).contains(n))
        .ok_or_else(|| format!("expected 1 to {MAX_SHARDS}"))
}
