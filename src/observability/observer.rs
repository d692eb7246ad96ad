//! [`PipelineObserver`]: what the pipeline reports, recorded as metrics and published to
//! [`Health`] as [`Progress`]. It keeps registered metric handles (one counter per topic), so an
//! ack at ~100k events/s costs a few atomic adds.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ::metrics::{Counter, Gauge, Histogram, counter, gauge, histogram};

use super::health::{CleanupBacklog, Health, Progress};
use super::metrics as m;
use crate::lsn::Lsn;

/// Most distinct `topic` labels; further topics count under `topic="_other"`, so a runaway
/// topic template cannot exhaust memory.
const MAX_TOPIC_LABELS: usize = 1000;

/// What an event's ack needs: a delivery report carries only the ticket, so this rides in the
/// ack tracker's entry for the event.
#[derive(Clone, Debug)]
pub struct Sent {
    topic: Counter,
    commit_time_us: i64,
}

/// The pipeline's observability hooks. Create it after [`m::install`]: metric handles bind to
/// the recorder installed then.
pub struct PipelineObserver {
    health: Arc<Health>,
    progress: Progress,
    topics: HashMap<Box<str>, Counter>,
    other_topic: Option<Counter>,
    bytes_relayed: Counter,
    commit_to_ack: Histogram,
    in_flight_events: Gauge,
    in_flight_bytes: Gauge,
    received_lsn: Gauge,
    ack_frontier: Gauge,
    cleanup_backlog: Gauge,
    cleanup_held: Gauge,
}

impl PipelineObserver {
    /// Reports to `health`.
    pub fn with_health(health: Arc<Health>) -> Self {
        PipelineObserver {
            progress: health.progress(),
            health,
            topics: HashMap::new(),
            other_topic: None,
            bytes_relayed: counter!(m::BYTES_RELAYED_TOTAL),
            commit_to_ack: histogram!(m::COMMIT_TO_ACK_SECONDS),
            in_flight_events: gauge!(m::IN_FLIGHT_EVENTS),
            in_flight_bytes: gauge!(m::IN_FLIGHT_BYTES),
            received_lsn: gauge!(m::RECEIVED_LSN),
            ack_frontier: gauge!(m::ACK_FRONTIER_LSN),
            cleanup_backlog: gauge!(m::CLEANUP_BACKLOG_ROWS),
            cleanup_held: gauge!(m::CLEANUP_HELD_ROWS),
        }
    }

    /// `events` wait for Schema Registry ids; none: the registry is no reason for readiness.
    pub fn schema_registry_waiting(&self, events: usize) {
        gauge!(m::SCHEMA_REGISTRY_WAITING_EVENTS).set(events as f64);
        if events == 0 {
            self.health.set_schema_registry(None);
        }
    }

    /// A Schema Registry request ended with `outcome`; `unavailable`: why events wait.
    pub fn schema_registry_answered(&self, outcome: &'static str, unavailable: Option<&str>) {
        counter!(m::SCHEMA_REGISTRY_REQUESTS_TOTAL, "outcome" => outcome).increment(1);
        self.health
            .set_schema_registry(unavailable.map(str::to_owned));
    }

    /// The replication stream started (true) or stopped (false).
    pub fn streaming(&self, streaming: bool) {
        self.health.set_streaming(streaming);
    }

    /// An event arrived from the stream, showing the server sent WAL up to `lsn`.
    pub fn received(&mut self, lsn: Option<Lsn>) {
        if let Some(lsn) = lsn.filter(|&lsn| lsn > self.progress.received) {
            self.progress.received = lsn;
            self.received_lsn.set(lsn.as_u64() as f64);
        }
    }

    /// An event to `topic`, committed at `commit_time_us` (Unix µs), was handed to the producer.
    pub fn event_sent(&mut self, topic: &str, commit_time_us: i64) -> Sent {
        Sent {
            topic: self.topic_counter(topic),
            commit_time_us,
        }
    }

    /// The [`m::EVENTS_RELAYED_TOTAL`] counter of `topic`; allocates only for a new topic.
    fn topic_counter(&mut self, topic: &str) -> Counter {
        if let Some(counter) = self.topics.get(topic) {
            return counter.clone();
        }
        if self.topics.len() >= MAX_TOPIC_LABELS {
            let other = self.other_topic.get_or_insert_with(|| {
                tracing::warn!(
                    limit = MAX_TOPIC_LABELS,
                    "too many distinct topics for the events_relayed metric; counting the rest under topic=\"_other\""
                );
                counter!(m::EVENTS_RELAYED_TOTAL, "topic" => "_other")
            });
            return other.clone();
        }
        let counter = counter!(m::EVENTS_RELAYED_TOTAL, "topic" => topic.to_owned());
        self.topics.insert(topic.into(), counter.clone());
        counter
    }

    /// The broker acknowledged an event (`sent`: its record and size, when handed over).
    pub fn event_acked(&mut self, sent: Option<(Sent, usize)>) {
        if let Some((sent, bytes)) = sent {
            self.record_ack(&sent.topic, bytes, commit_to_ack(sent.commit_time_us));
        }
        self.progress.events_acked += 1;
        self.health.set_producer_connected(true);
    }

    fn record_ack(&self, topic: &Counter, bytes: usize, commit_to_ack: Duration) {
        topic.increment(1);
        self.bytes_relayed.increment(bytes as u64);
        self.commit_to_ack.record(commit_to_ack.as_secs_f64());
    }

    /// A delivery failed, Kafka's error `code` (snake case) saying why.
    pub fn delivery_failed(&mut self, code: &str) {
        counter!(m::DELIVERY_ERRORS_TOTAL, "kind" => code.to_owned()).increment(1);
    }

    /// `--cleanup delete`'s backlog, published with the next [`Self::step`].
    pub fn cleanup(&mut self, backlog: CleanupBacklog) {
        self.cleanup_backlog.set(backlog.rows as f64);
        self.cleanup_held.set(backlog.held as f64);
        self.progress.cleanup = backlog;
    }

    /// After a step: the ack frontier, and the events and bytes in flight with when the oldest
    /// was handed over. The one place that publishes to [`Health`]: once per step.
    pub fn step(&mut self, frontier: Lsn, events: usize, bytes: usize, oldest: Option<Instant>) {
        self.ack_frontier.set(frontier.as_u64() as f64);
        self.in_flight_events.set(events as f64);
        self.in_flight_bytes.set(bytes as f64);
        self.progress.frontier = frontier;
        self.progress.in_flight_events = events as u64;
        self.progress.oldest_in_flight = oldest;
        self.health.set_progress(self.progress);
    }
}

/// From the commit time (Unix µs, the server's clock) to now; zero if the clocks disagree.
fn commit_to_ack(commit_time_us: i64) -> Duration {
    let commit = UNIX_EPOCH + Duration::from_micros(u64::try_from(commit_time_us).unwrap_or(0));
    SystemTime::now().duration_since(commit).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observability::health::ReadinessThresholds;
    use crate::observability::metrics::builder;

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
            obs.step(Lsn::ZERO, 2, 30, Some(Instant::now()));
            assert_eq!(health.progress().in_flight_events, 2);
            obs.event_acked(Some((b, 20)));
            obs.event_acked(Some((a, 10)));
            obs.delivery_failed("message_timed_out");
            obs.step(Lsn(77), 0, 0, None);
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

    /// What `f` records through a fresh observer, rendered.
    fn rendered(f: impl FnOnce(&mut PipelineObserver)) -> String {
        let recorder = builder().build_recorder();
        let handle = recorder.handle();
        ::metrics::with_local_recorder(&recorder, || {
            f(&mut PipelineObserver::with_health(Arc::new(
                Health::default(),
            )));
        });
        handle.render()
    }

    #[test]
    fn hot_path_values_render_under_their_names() {
        let text = rendered(|obs| {
            for (topic, bytes, latency) in [
                ("orders", 100, Duration::from_millis(3)),
                ("orders", 50, Duration::from_millis(30)),
                ("payments", 10, Duration::from_secs(2)),
            ] {
                let counter = obs.topic_counter(topic);
                obs.record_ack(&counter, bytes, latency);
            }
            obs.step(Lsn(42), 7, 700, None);
            obs.received(Some(Lsn(0x1_0000_0010)));
        });
        for line in [
            "outbox_relay_events_relayed_total{topic=\"orders\"} 2",
            "outbox_relay_events_relayed_total{topic=\"payments\"} 1",
            "outbox_relay_bytes_relayed_total 160",
            "outbox_relay_in_flight_events 7",
            "outbox_relay_in_flight_bytes 700",
            "outbox_relay_received_lsn 4294967312",
            "outbox_relay_ack_frontier_lsn 42",
            "outbox_relay_commit_to_ack_seconds_bucket{le=\"0.005\"} 1",
            "outbox_relay_commit_to_ack_seconds_bucket{le=\"0.05\"} 2",
            "outbox_relay_commit_to_ack_seconds_count 3",
        ] {
            assert!(text.contains(line), "missing {line:?} in:\n{text}");
        }
    }

    #[test]
    fn topic_labels_are_bounded() {
        let text = rendered(|obs| {
            for i in 0..MAX_TOPIC_LABELS + 5 {
                let counter = obs.topic_counter(&format!("t{i}"));
                obs.record_ack(&counter, 1, Duration::ZERO);
            }
            assert_eq!(obs.topics.len(), MAX_TOPIC_LABELS);
        });
        assert!(
            text.contains("outbox_relay_events_relayed_total{topic=\"_other\"} 5"),
            "{text}"
        );
    }
}
