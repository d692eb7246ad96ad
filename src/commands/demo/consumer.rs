//! The demo's downstream service: a Kafka consumer printing every record it
//! receives, one a line, in the format `peek` uses.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::commands::print::{Position, RecordLine, text};

/// A consumer of `topics` (names, or a `^` librdkafka regex), from their
/// beginning, in a group of its own; with `partitions` known (the mock
/// broker's topics), assigned directly, which skips the group join's seconds.
pub(super) fn subscribe(
    brokers: &str,
    properties: &[(String, String)],
    topics: &[String],
    partitions: Option<i32>,
) -> Result<StreamConsumer, KafkaError> {
    let mut config = ClientConfig::new();
    // The relay's -X settings (security, say) apply to the broker, so to this client too.
    for (key, value) in properties {
        config.set(key, value);
    }
    let consumer: StreamConsumer = config
        .set("bootstrap.servers", brokers)
        .set(
            "group.id",
            format!("outbox-relay-demo-{}", std::process::id()),
        )
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        // New topics (the relay's first record to each) are seen within a second.
        .set("topic.metadata.refresh.interval.ms", "1000")
        .set("log_level", "3")
        .create()?;
    match partitions {
        Some(count) => {
            let mut assignment = TopicPartitionList::new();
            for topic in topics {
                for partition in 0..count {
                    assignment.add_partition_offset(topic, partition, Offset::Beginning)?;
                }
            }
            consumer.assign(&assignment)?;
        }
        None => {
            let topics: Vec<&str> = topics.iter().map(String::as_str).collect();
            consumer.subscribe(&topics)?;
        }
    }
    Ok(consumer)
}

/// Prints records until dropped; `consumed` counts them.
pub(super) async fn run(consumer: StreamConsumer, consumed: Arc<AtomicU64>) {
    loop {
        // Errors (topics not created yet, a broker restart): the consumer retries.
        let message = match consumer.recv().await {
            Ok(message) => message,
            Err(e) => {
                tracing::debug!(error = %e, "demo consumer");
                continue;
            }
        };
        let headers = message.headers().into_iter().flat_map(|h| h.iter());
        let line = RecordLine {
            topic: message.topic(),
            position: Position::Kafka {
                partition: message.partition(),
                offset: message.offset(),
            },
            key: text(message.key()),
            headers: headers.map(|h| (h.key.to_owned(), text(h.value))).collect(),
            value: text(message.payload()),
            timestamp_ms: message.timestamp().to_millis(),
        };
        println!("{}", line.to_text());
        consumed.fetch_add(1, Ordering::Relaxed);
    }
}
