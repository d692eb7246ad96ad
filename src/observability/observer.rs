//! What the pipeline tells observability, in one object it owns:
//! [`PipelineObserver`] records metrics and keeps [`Health`] current.
//!
//! The pipeline knows an event's topic and commit time when it hands the
//! event to the producer, but a delivery report carries only the ticket. What
//! the ack needs ([`Sent`]: the topic's cached counter, the commit time, when
//! the event was handed over) therefore rides in the ack tracker's entry for
//! the event: one in-flight ledger, whose oldest entry gives `/readyz`'s ack
//! staleness.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ::metrics::Counter;
use pgwire_replication::ReplicationEvent;
use rdkafka::error::KafkaError;

use super::health::Health;
use super::metrics::{self as m, RelayMetrics};
use crate::lsn::Lsn;

/// What observability needs when an event's delivery is reported, kept in
/// the ack tracker's entry for the event (the one in-flight ledger).
#[derive(Clone, Debug)]
pub struct Sent {
    topic: Counter,
    commit_time_us: i64,
    /// When the event was handed to the producer.
    pub handed_at: Instant,
}

/// The pipeline's observability hooks; every method is O(1) and allocation-free
/// after a topic's first event.
pub struct PipelineObserver {
    metrics: RelayMetrics,
    health: Arc<Health>,
    in_flight: (usize, usize, Option<Instant>),
    received: Lsn,
    frontier: Lsn,
}

impl PipelineObserver {
    /// Reports to `health`. Create it after [`m::install`] (metric handles
    /// bind to the recorder installed then).
    pub fn with_health(health: Arc<Health>) -> Self {
        PipelineObserver {
            metrics: RelayMetrics::new(),
            health,
            in_flight: (0, 0, None),
            received: Lsn::ZERO,
            frontier: Lsn::ZERO,
        }
    }

    /// The replication stream started (true) or stopped (false).
    pub fn streaming(&self, streaming: bool) {
        self.health.set_streaming(streaming);
    }

    /// An event arrived from the stream: advances the received position.
    pub fn received(&mut self, event: &ReplicationEvent) {
        let lsn: Lsn = match event {
            ReplicationEvent::XLogData { wal_start, .. } => (*wal_start).into(),
            ReplicationEvent::Commit { end_lsn, .. } => (*end_lsn).into(),
            ReplicationEvent::KeepAlive { wal_end, .. } => (*wal_end).into(),
            ReplicationEvent::Message { lsn, .. } => (*lsn).into(),
            _ => return,
        };
        if lsn > self.received {
            self.received = lsn;
            self.metrics.set_received_lsn(lsn);
            self.health.set_received(lsn);
        }
    }

    /// An event to `topic` was handed to the producer; `commit_time_us` is
    /// its transaction's commit time in Unix microseconds. The pipeline keeps
    /// the result with the event until its delivery is reported.
    pub fn event_sent(&mut self, topic: &str, commit_time_us: i64) -> Sent {
        Sent {
            topic: self.metrics.topic(topic),
            commit_time_us,
            handed_at: Instant::now(),
        }
    }

    /// The broker acknowledged an event of `bytes` (`sent`: when it was handed over).
    pub fn event_acked(&mut self, sent: Option<(Sent, usize)>) {
        if let Some((sent, bytes)) = sent {
            let latency = commit_to_ack(sent.commit_time_us);
            self.metrics.acked_on(Some(&sent.topic), bytes, latency);
        }
        self.health.add_acked(1);
        self.health.set_producer_connected(true);
    }

    /// A delivery failed for good.
    pub fn delivery_failed(&mut self, error: &KafkaError) {
        m::delivery_error(&m::error_kind(error));
    }

    /// What is in flight after a step: events, bytes, and when the oldest was handed over.
    pub fn in_flight(&mut self, events: usize, bytes: usize, oldest: Option<Instant>) {
        if self.in_flight != (events, bytes, oldest) {
            self.in_flight = (events, bytes, oldest);
            self.metrics.set_in_flight(events, bytes);
            self.health.set_in_flight_events(events as u64);
            self.health.set_oldest_in_flight(oldest);
        }
    }

    /// The ack frontier after a step of the pipeline.
    pub fn frontier(&mut self, frontier: Lsn) {
        if frontier != self.frontier {
            self.frontier = frontier;
            self.metrics.set_ack_frontier(frontier);
            self.health.set_frontier(frontier);
        }
    }
}

/// From the commit time (Unix µs, the server's clock) to now; zero if the clocks disagree.
fn commit_to_ack(commit_time_us: i64) -> Duration {
    let now_us = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
    Duration::from_micros(u64::try_from(now_us.saturating_sub(commit_time_us)).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observability::health::ReadinessThresholds;

    fn now_us() -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_micros() as i64
    }

    #[test]
    fn acks_and_in_flight_state_reach_metrics_and_health() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let health = Arc::new(Health::new(ReadinessThresholds::default()));
        ::metrics::with_local_recorder(&recorder, || {
            let mut obs = PipelineObserver::with_health(health.clone());
            let a = obs.event_sent("a", now_us());
            let b = obs.event_sent("b", now_us());
            obs.in_flight(2, 30, Some(a.handed_at));
            assert_eq!(health.progress().in_flight_events, 2);
            obs.event_acked(Some((b, 20)));
            obs.event_acked(Some((a, 10)));
            obs.in_flight(0, 0, None);
            obs.delivery_failed(&KafkaError::MessageProduction(
                rdkafka::types::RDKafkaErrorCode::MessageTimedOut,
            ));
            obs.frontier(Lsn(77));
        });
        assert_eq!(
            health.snapshot(Instant::now()).ack_staleness,
            Duration::ZERO
        );
        assert_eq!(health.progress().events_acked, 2);
        assert_eq!(health.progress().frontier, Lsn(77));
        let text = handle.render();
        for line in [
            "outbox_relay_events_relayed_total{topic=\"a\"} 1",
            "outbox_relay_events_relayed_total{topic=\"b\"} 1",
            "outbox_relay_bytes_relayed_total 30",
            "outbox_relay_in_flight_events 0",
            "outbox_relay_delivery_errors_total{kind=\"message_timed_out\"} 1",
            "outbox_relay_ack_frontier_lsn 77",
        ] {
            assert!(text.contains(line), "missing {line:?}:\n{text}");
        }
    }

    #[test]
    fn commit_to_ack_never_goes_negative() {
        assert_eq!(commit_to_ack(now_us() + 60_000_000), Duration::ZERO);
        let ack = commit_to_ack(now_us() - 1_500_000);
        assert!(ack >= Duration::from_millis(1500), "{ack:?}");
        assert!(ack < Duration::from_millis(1600), "{ack:?}");
    }
}
