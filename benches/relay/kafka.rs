//! librdkafka's in-process mock Kafka cluster: its topics and how many records it holds.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;

use crate::workload::EVENT_TYPES;

/// How often the broker's high watermarks are summed.
pub(crate) const WATERMARK_POLL: Duration = Duration::from_millis(20);

pub(crate) type Broker = MockCluster<'static, DefaultProducerContext>;

/// A mock cluster of `brokers` with one topic per event type of `partitions` each.
pub(crate) fn start_broker(brokers: i32, partitions: i32) -> Result<Broker> {
    let broker = MockCluster::new(brokers).context("start the mock Kafka cluster")?;
    for topic in EVENT_TYPES {
        broker
            .create_topic(topic, partitions, brokers)
            .with_context(|| format!("create topic {topic}"))?;
    }
    Ok(broker)
}

fn topics_and_partitions(partitions: i32) -> impl Iterator<Item = (&'static str, i32)> {
    EVENT_TYPES
        .iter()
        .flat_map(move |t| (0..partitions).map(move |p| (*t, p)))
}

/// Sum of the high watermarks of every bench partition: records the broker has.
pub(crate) fn broker_total(consumer: &BaseConsumer, partitions: i32) -> Option<i64> {
    let mut total = 0;
    for (topic, partition) in topics_and_partitions(partitions) {
        let (_, high) = consumer
            .fetch_watermarks(topic, partition, Duration::from_secs(2))
            .ok()?;
        total += high;
    }
    Some(total)
}

pub(crate) fn watermark_client(bootstrap: &str) -> Result<BaseConsumer> {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "bench-watermarks")
        .create()
        .context("create the watermark client")
}

/// Watches the broker until it holds `target` records in total; returns when that
/// happened (`None` on timeout or `stop`).
pub(crate) fn watch_broker(
    bootstrap: String,
    partitions: i32,
    target: i64,
    limit: Duration,
    stop: Arc<AtomicBool>,
) -> thread::JoinHandle<Option<Instant>> {
    thread::spawn(move || {
        let consumer = watermark_client(&bootstrap).ok()?;
        let deadline = Instant::now() + limit;
        for _ in 0..(limit.as_millis() / WATERMARK_POLL.as_millis() + 1) {
            if broker_total(&consumer, partitions).is_some_and(|t| t >= target) {
                return Some(Instant::now());
            }
            if stop.load(Ordering::Relaxed) || Instant::now() >= deadline {
                return None;
            }
            thread::sleep(WATERMARK_POLL);
        }
        None
    })
}
