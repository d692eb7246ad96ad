//! Flags of the HTTP endpoint, readiness and the slot poller, all checked while parsing.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Args;

use super::{parse_duration, positive_duration};
use crate::observability::health::ReadinessThresholds;

/// Observability flags, part of [`super::RelayFlags`].
///
/// `std::option::Option` (not `Option`) tells clap that the value parser gives the `None`.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct ObservabilityArgs {
    /// Address of the HTTP endpoint serving /metrics, /healthz and /readyz; `none` disables it.
    #[arg(long, env = "OUTBOX_RELAY_HTTP_ADDR", default_value = "127.0.0.1:9187", value_parser = http_addr)]
    pub http_addr: std::option::Option<SocketAddr>,
    /// File to write the HTTP endpoint's address to once it listens (with port 0 in
    /// --http-addr, the port the system chose).
    #[arg(long, env = "OUTBOX_RELAY_HTTP_ADDR_FILE")]
    pub http_addr_file: Option<std::path::PathBuf>,
    /// Readiness limits.
    #[command(flatten)]
    pub readiness: ReadinessArgs,
    /// How often the slot's lag, wal_status and safe_wal_size are read.
    #[arg(long, env = "OUTBOX_RELAY_SLOT_POLL_INTERVAL", default_value = "10s", value_parser = positive_duration)]
    pub slot_poll_interval: Duration,
    /// How often a one-line progress summary is logged; 0 disables it.
    #[arg(long, env = "OUTBOX_RELAY_PROGRESS_INTERVAL", default_value = "30s", value_parser = progress_interval)]
    pub progress_interval: std::option::Option<Duration>,
}

/// The flags of readiness's limits: `/readyz` fails (or warns) beyond them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Args)]
pub struct ReadinessArgs {
    /// /readyz fails when the slot keeps more WAL than this (bytes; KiB/MiB/GiB suffixes work).
    #[arg(long = "ready-max-slot-lag-bytes", env = "OUTBOX_RELAY_READY_MAX_SLOT_LAG_BYTES", default_value = "1GiB", value_parser = parse_bytes)]
    pub max_slot_lag_bytes: u64,
    /// /readyz fails when the oldest unacknowledged event was handed to Kafka longer ago than this.
    #[arg(long = "ready-max-ack-staleness", env = "OUTBOX_RELAY_READY_MAX_ACK_STALENESS", default_value = "60s", value_parser = positive_duration)]
    pub max_ack_staleness: Duration,
    /// Warn (log and /readyz) when the slot's safe_wal_size falls below this (bytes).
    #[arg(long = "slot-min-safe-wal-size", env = "OUTBOX_RELAY_SLOT_MIN_SAFE_WAL_SIZE", default_value = "1GiB", value_parser = parse_bytes)]
    pub min_safe_wal_size: u64,
}

impl ReadinessArgs {
    /// The limits the flags set.
    pub fn thresholds(&self) -> ReadinessThresholds {
        ReadinessThresholds {
            max_slot_lag_bytes: self.max_slot_lag_bytes,
            max_ack_staleness: self.max_ack_staleness,
            min_safe_wal_size: self.min_safe_wal_size,
        }
    }
}

fn http_addr(s: &str) -> Result<Option<SocketAddr>, &'static str> {
    let expected = "expected IP:PORT (e.g. 127.0.0.1:9187 or 0.0.0.0:9187) or none";
    match s.trim() {
        none if none.is_empty() || none.eq_ignore_ascii_case("none") => Ok(None),
        addr => addr.parse().map(Some).map_err(|_| expected),
    }
}

fn progress_interval(s: &str) -> Result<Option<Duration>, String> {
    Ok(Some(parse_duration(s)?).filter(|d| !d.is_zero()))
}

/// A byte count: `1073741824`, `512MiB`, `1GiB`. KiB/MiB/GiB (or K/M/G) are powers of 1024 like
/// Postgres' own units, kB/MB/GB powers of 1000.
fn parse_bytes(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit() && c != '_');
    let (digits, unit) = s.split_at(split.unwrap_or(s.len()));
    let not_a_count = || format!("{s:?} is not a byte count (examples: 1073741824, 512MiB, 1GiB)");
    let n: u64 = digits.replace('_', "").parse().map_err(|_| not_a_count())?;
    let factor: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kib" | "k" => 1 << 10,
        "mib" | "m" => 1 << 20,
        "gib" | "g" => 1 << 30,
        "tib" | "t" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        other => {
            return Err(format!(
                "unknown unit {other:?} (use B, KiB, MiB, GiB, TiB, kB, MB, GB or TB)"
            ));
        }
    };
    n.checked_mul(factor)
        .ok_or_else(|| format!("{s:?} is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_counts_accept_units() {
        assert_eq!(parse_bytes("1024"), Ok(1024));
        assert_eq!(parse_bytes("1GiB"), Ok(1 << 30));
        assert_eq!(parse_bytes("512 MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("2gb"), Ok(2_000_000_000));
        assert_eq!(parse_bytes("1_000"), Ok(1000));
        assert!(parse_bytes("").is_err());
        assert!(parse_bytes("1 parsec").is_err());
        assert!(parse_bytes("99999999999TiB").is_err());
    }

    #[test]
    fn http_addr_and_progress_interval_can_be_disabled() {
        assert_eq!(http_addr("none"), Ok(None));
        assert_eq!(http_addr(" "), Ok(None));
        assert_eq!(http_addr("0.0.0.0:1"), Ok(Some(([0, 0, 0, 0], 1).into())));
        assert!(http_addr("localhost").is_err());
        assert_eq!(progress_interval("0s"), Ok(None));
        assert_eq!(progress_interval("2s"), Ok(Some(Duration::from_secs(2))));
    }
}
