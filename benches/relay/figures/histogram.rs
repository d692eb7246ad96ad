//! The relay's own commit → broker ack histogram, read from its `/metrics`.

use anyhow::{Context, Result, anyhow};

/// The relay's commit → broker ack histogram: the commit time comes from the
/// WAL (the transaction's commit timestamp), the ack time from the delivery
/// report, both on this machine's clock.
pub(crate) struct AckHistogram {
    /// Ascending; the last is `+Inf`.
    buckets: Vec<Bucket>,
    pub(crate) count: u64,
    sum_s: f64,
}

/// One `_bucket` series: how many observations took at most `le_s` seconds.
#[derive(Clone, Copy)]
struct Bucket {
    le_s: f64,
    cumulative: u64,
}

impl AckHistogram {
    const NAME: &str = "outbox_relay_commit_to_ack_seconds";

    pub(crate) fn parse(metrics: &str) -> Result<AckHistogram> {
        let mut buckets = Vec::new();
        let mut count = None;
        let mut sum_s = None;
        for line in metrics.lines() {
            let Some((series, value)) = Self::sample(line) else {
                continue;
            };
            if let Some(le) = series
                .strip_prefix("_bucket{le=\"")
                .and_then(|s| s.strip_suffix("\"}"))
            {
                buckets.push(Bucket {
                    le_s: bucket_bound(le)?,
                    cumulative: value as u64,
                });
            } else if series == "_count" {
                count = Some(value as u64);
            } else if series == "_sum" {
                sum_s = Some(value);
            }
        }
        buckets.sort_by(|a, b| a.le_s.total_cmp(&b.le_s));
        let missing = || anyhow!("no {} histogram in the relay's /metrics", Self::NAME);
        if buckets.is_empty() {
            return Err(missing());
        }
        Ok(AckHistogram {
            buckets,
            count: count.ok_or_else(missing)?,
            sum_s: sum_s.ok_or_else(missing)?,
        })
    }

    /// A line of this histogram: its series after the name (`_bucket{le="0.005"}`,
    /// `_sum`, `_count`) and its value.
    fn sample(line: &str) -> Option<(&str, f64)> {
        let rest = line.strip_prefix(Self::NAME)?;
        let (series, value) = rest.rsplit_once(' ')?;
        Some((series, value.parse().ok()?))
    }

    /// The `p` quantile in milliseconds, interpolated linearly inside its
    /// bucket as Prometheus' `histogram_quantile` does.
    pub(crate) fn quantile_ms(&self, p: f64) -> f64 {
        let rank = p * self.count as f64;
        let mut below = Bucket {
            le_s: 0.0,
            cumulative: 0,
        };
        for &bucket in &self.buckets {
            if bucket.cumulative as f64 >= rank && bucket.cumulative > below.cumulative {
                if bucket.le_s.is_infinite() {
                    return below.le_s * 1e3;
                }
                let in_bucket = (bucket.cumulative - below.cumulative) as f64;
                let within = (rank - below.cumulative as f64) / in_bucket;
                return (below.le_s + (bucket.le_s - below.le_s) * within) * 1e3;
            }
            below = bucket;
        }
        f64::NAN
    }

    /// What was recorded since `before` (an earlier scrape of the same relay).
    pub(crate) fn minus(&self, before: &AckHistogram) -> AckHistogram {
        let buckets = self
            .buckets
            .iter()
            .map(|bucket| Bucket {
                le_s: bucket.le_s,
                cumulative: bucket
                    .cumulative
                    .saturating_sub(before.cumulative_at(bucket.le_s)),
            })
            .collect();
        AckHistogram {
            buckets,
            count: self.count.saturating_sub(before.count),
            sum_s: self.sum_s - before.sum_s,
        }
    }

    fn cumulative_at(&self, le_s: f64) -> u64 {
        let bucket = self.buckets.iter().find(|b| b.le_s == le_s);
        bucket.map_or(0, |b| b.cumulative)
    }

    /// The upper bound of the highest non-empty bucket, in milliseconds.
    pub(crate) fn max_bound_ms(&self) -> f64 {
        let top = self.buckets.iter().find(|b| b.cumulative >= self.count);
        top.map_or(f64::NAN, |b| b.le_s * 1e3)
    }

    pub(crate) fn mean_ms(&self) -> f64 {
        self.sum_s / self.count.max(1) as f64 * 1e3
    }
}

/// A bucket's `le` label, in seconds.
fn bucket_bound(le: &str) -> Result<f64> {
    if le == "+Inf" {
        return Ok(f64::INFINITY);
    }
    le.parse().with_context(|| format!("bucket bound {le:?}"))
}
