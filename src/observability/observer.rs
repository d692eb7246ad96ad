//! What the pipeline tells observability, in one object it owns:
//! [`PipelineObserver`] records metrics and keeps [`Health`] current.
//!
//! The pipeline knows an event's topic, size and commit time when it hands
//! the event to the producer, but a delivery report carries only the ticket.
//! The observer therefore keeps a small FIFO indexed by ticket (tickets are
//! consecutive) holding what the ack needs: the topic's cached counter (a
//! reference count, no allocation), the size, the commit time, and when the
//! event was handed over. The oldest entry still waiting gives `/readyz`'s ack
//! staleness. Memory is proportional to what is in flight, which the pipeline
//! caps.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ::metrics::Counter;
use pgwire_replication::ReplicationEvent;
use rdkafka::error::KafkaError;

use super::health::{self, Health};
use super::metrics::{self as m, RelayMetrics};
use crate::lsn::Lsn;
use crate::sink::Ticket;

struct Pending {
    topic: Counter,
    bytes: usize,
    commit_time_us: i64,
    handed_at: Instant,
}

/// The pipeline's observability hooks; every method is O(1) and allocation-free
/// after a topic's first event.
pub struct PipelineObserver {
    metrics: RelayMetrics,
    health: Arc<Health>,
    /// Entry `i` is ticket `base + i`; `None` once acknowledged or failed.
    pending: VecDeque<Option<Pending>>,
    base: u64,
    in_flight_events: usize,
    in_flight_bytes: usize,
    received: Lsn,
    frontier: Lsn,
}

impl Default for PipelineObserver {
    fn default() -> Self {
        Self::new()
    }
}

impl PipelineObserver {
    /// Reports to the process's [`health::global`] state. Create it after
    /// [`m::install`] (metric handles bind to the recorder installed then).
    pub fn new() -> Self {
        Self::with_health(health::global())
    }

    /// Reports to `health`.
    pub fn with_health(health: Arc<Health>) -> Self {
        PipelineObserver {
            metrics: RelayMetrics::new(),
            health,
            pending: VecDeque::new(),
            base: 0,
            in_flight_events: 0,
            in_flight_bytes: 0,
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

    /// The event with `ticket` was handed to the producer.
    /// `commit_time_us` is the transaction's commit time in Unix microseconds.
    pub fn event_sent(&mut self, ticket: Ticket, topic: &str, bytes: usize, commit_time_us: i64) {
        if self.pending.is_empty() {
            self.base = ticket.0;
        }
        let next = self.base + self.pending.len() as u64;
        if ticket.0 < next {
            return; // Not in ticket order: ignore rather than corrupt the FIFO.
        }
        for _ in next..ticket.0 {
            self.pending.push_back(None);
        }
        let handed_at = Instant::now();
        if self.in_flight_events == 0 {
            self.health.set_oldest_in_flight(Some(handed_at));
        }
        self.pending.push_back(Some(Pending {
            topic: self.metrics.topic(topic),
            bytes,
            commit_time_us,
            handed_at,
        }));
        self.in_flight_events += 1;
        self.in_flight_bytes += bytes;
        self.publish_in_flight();
    }

    /// The broker acknowledged `ticket`.
    pub fn event_acked(&mut self, ticket: Ticket) {
        if let Some(p) = self.take(ticket) {
            self.metrics
                .acked_on(Some(&p.topic), p.bytes, commit_to_ack(p.commit_time_us));
            self.health.add_acked(1);
            self.health.set_producer_connected(true);
        }
    }

    /// The delivery of `ticket` failed for good.
    pub fn delivery_failed(&mut self, ticket: Ticket, error: &KafkaError) {
        self.take(ticket);
        m::delivery_error(&m::error_kind(error));
    }

    /// The ack frontier after a step of the pipeline.
    pub fn frontier(&mut self, frontier: Lsn) {
        if frontier != self.frontier {
            self.frontier = frontier;
            self.metrics.set_ack_frontier(frontier);
            self.health.set_frontier(frontier);
        }
    }

    /// When the oldest unacknowledged event was handed to the producer.
    pub fn oldest_in_flight(&self) -> Option<Instant> {
        self.pending.iter().flatten().next().map(|p| p.handed_at)
    }

    fn take(&mut self, ticket: Ticket) -> Option<Pending> {
        let idx = usize::try_from(ticket.0.checked_sub(self.base)?).ok()?;
        let pending = self.pending.get_mut(idx)?.take()?;
        self.in_flight_events -= 1;
        self.in_flight_bytes -= pending.bytes;
        let front_moved = idx == 0;
        while self.pending.front().is_some_and(Option::is_none) {
            self.pending.pop_front();
            self.base += 1;
        }
        if front_moved {
            self.health.set_oldest_in_flight(
                self.pending
                    .front()
                    .and_then(|p| p.as_ref())
                    .map(|p| p.handed_at),
            );
        }
        self.publish_in_flight();
        Some(pending)
    }

    fn publish_in_flight(&self) {
        self.metrics
            .set_in_flight(self.in_flight_events, self.in_flight_bytes);
        self.health
            .set_in_flight_events(self.in_flight_events as u64);
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
    fn out_of_order_acks_keep_the_oldest_event_as_the_staleness_origin() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let health = Arc::new(Health::new(ReadinessThresholds::default()));
        ::metrics::with_local_recorder(&recorder, || {
            let mut obs = PipelineObserver::with_health(health.clone());
            obs.event_sent(Ticket(0), "a", 10, now_us());
            let first = obs.oldest_in_flight().unwrap();
            obs.event_sent(Ticket(1), "b", 20, now_us());
            obs.event_sent(Ticket(2), "a", 30, now_us());
            let third = obs
                .pending
                .back()
                .and_then(Option::as_ref)
                .unwrap()
                .handed_at;
            assert_eq!(health.progress().in_flight_events, 3);

            obs.event_acked(Ticket(1));
            assert_eq!(obs.oldest_in_flight(), Some(first));
            obs.event_acked(Ticket(1)); // twice: ignored
            obs.event_acked(Ticket(0));
            assert_eq!(
                obs.oldest_in_flight(),
                Some(third),
                "the oldest left is the third"
            );
            assert_eq!(obs.pending.len(), 1);
            obs.delivery_failed(
                Ticket(2),
                &KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::MessageTimedOut),
            );
            assert_eq!(obs.oldest_in_flight(), None);
            assert!(obs.pending.is_empty());
            assert_eq!(obs.base, 3);
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
