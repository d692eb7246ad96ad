//! The relay's own commit → broker ack histogram, read from its `/metrics`.

use anyhow::{Context, Result, bail};

/// The relay's commit → broker ack histogram: the commit time comes from the
/// WAL (the transaction's commit timestamp), the ack time from the delivery
/// report, both on this machine's clock.
pub(crate) struct AckHistogram {
    /// `(upper bound in seconds, cumulative count)`, ascending; the last is `+Inf`.
    buckets: Vec<(f64, u64)>,
    pub(crate) count: u64,
    sum_s: f64,
}

impl AckHistogram {
    const NAME: &str = "outbox_relay_commit_to_ack_seconds";

    pub(crate) fn parse(metrics: &str) -> Result<AckHistogram> {
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
    pub(crate) fn quantile_ms(&self, p: f64) -> f64 {
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
    pub(crate) fn minus(&self, before: &AckHistogram) -> AckHistogram {
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
    pub(crate) fn max_bound_ms(&self) -> f64 {
        let top = self.buckets.iter().find(|(_, c)| *c >= self.count);
        top.map_or(f64::NAN, |(le, _)| le * 1e3)
    }

    pub(crate) fn mean_ms(&self) -> f64 {
        self.sum_s / self.count.max(1) as f64 * 1e3
    }
}
