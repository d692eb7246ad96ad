//! The periodic progress line (`--progress-interval`): events/s acknowledged,
//! in flight, received position, ack frontier and slot lag, all read from
//! [`Health`], so the pipeline needs no extra call for it. It starts with the first stream:
//! before, there is no progress to report.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::health::{Health, Progress, SlotObservation};

/// Logs a summary every `interval` (the caller aborts the task on shutdown).
pub async fn run(health: Arc<Health>, interval: Duration) {
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut previous = (Instant::now(), health.progress());
    // Nothing to report before the first stream (start-up, a standby waiting for the slot).
    let mut streamed = false;
    loop {
        tick.tick().await;
        let now = (Instant::now(), health.progress());
        streamed = streamed || health.snapshot(now.0).streaming;
        if !streamed {
            previous = now;
            continue;
        }
        let slot_lag_bytes = match health.slot() {
            SlotObservation::Seen(s) => s.lag_bytes,
            _ => None,
        };
        tracing::info!(
            events_per_sec = (events_per_sec(previous, now) * 10.0).round() / 10.0,
            events_acked = now.1.events_acked,
            in_flight = now.1.in_flight_events,
            received = %now.1.received,
            frontier = %now.1.frontier,
            slot_lag_bytes,
            "progress"
        );
        previous = now;
    }
}

/// PURE: events per second between two progress samples.
fn events_per_sec(before: (Instant, Progress), after: (Instant, Progress)) -> f64 {
    let secs = after.0.saturating_duration_since(before.0).as_secs_f64();
    if secs <= 0.0 {
        return 0.0;
    }
    after.1.events_acked.saturating_sub(before.1.events_acked) as f64 / secs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_is_acked_events_over_elapsed_time() {
        let t0 = Instant::now();
        let a = Progress {
            events_acked: 100,
            ..Progress::default()
        };
        let b = Progress {
            events_acked: 400,
            ..Progress::default()
        };
        let rate = events_per_sec((t0, a), (t0 + Duration::from_secs(2), b));
        assert!((rate - 150.0).abs() < 1e-9, "{rate}");
        assert_eq!(events_per_sec((t0, a), (t0, b)), 0.0);
    }
}
