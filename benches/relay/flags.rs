//! The bench's flags, parsed once into [`Args`].

use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};

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
}

impl Args {
    /// `std::env::args`, ignoring what it does not know (cargo passes `--bench`).
    pub(crate) fn parse() -> Result<Args> {
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
