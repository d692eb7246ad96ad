//! The final `bench: key=value ...` line and the units its figures are in.

use std::fmt::Write as _;
use std::time::Duration;

/// Everything measured, in the order of the final `bench:` line.
#[derive(Default)]
pub(crate) struct Report {
    fields: Vec<(String, String)>,
}

impl Report {
    pub(crate) fn add(&mut self, key: &str, value: impl std::fmt::Display) {
        self.fields.push((key.to_owned(), value.to_string()));
    }

    /// A figure with `decimals` decimals (NaN where it could not be measured).
    pub(crate) fn add_f(&mut self, key: &str, value: f64, decimals: usize) {
        self.add(key, format!("{value:.decimals$}"));
    }

    pub(crate) fn line(&self) -> String {
        let mut line = String::from("bench:");
        for (key, value) in &self.fields {
            let _ = write!(line, " {key}={value}");
        }
        line
    }
}

/// `p` in [0, 1] of sorted durations, in milliseconds: the nearest rank, so every
/// percentile is a latency that was measured.
pub(crate) fn percentile_ms(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1].as_secs_f64() * 1e3
}

/// CPU seconds per million events: the unit of every `*_cpu_per_m_s` key, so that drains
/// of different sizes compare.
pub(crate) fn per_million(cpu_s: f64, events: u64) -> f64 {
    cpu_s / (events as f64 / 1e6)
}
