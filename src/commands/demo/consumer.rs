//! The demo's downstream service: a Kafka consumer printing every record it
//! receives, one a line, in the format `peek` uses.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;
use rdkafka::{Offset, TopicPartitionList};

use super::writer::EVENT_TYPES;
use crate::commands::print::{Position, RecordLine, text};
use crate::config::Config;
use crate::outbox::{MappingConfig, Segment};
use crate::sink::ClientCallbacks;

/// Partitions of each demo topic on the mock broker.
const MOCK_PARTITIONS: i32 = 3;

/// A consumer of the demo's topics from their beginning, in a group of its
/// own. On the mock broker the topics are created up front and assigned
/// directly, which skips the group join's seconds.
pub(super) fn subscribe(
    config: &Config,
    mock: Option<&MockCluster<'static, DefaultProducerContext>>,
) -> Result<StreamConsumer<ClientCallbacks>, KafkaError> {
    // The relay's -X settings and --kafka-auth (security, say) apply to the broker, so to
    // this client too.
    let kafka = super::super::kafka(config);
    let mut client = kafka.config(&[]);
    let group = format!("outbox-relay-demo-{}", std::process::id());
    let consumer: StreamConsumer<ClientCallbacks> = client
        .set("group.id", group)
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        // New topics (the relay's first record to each) are seen within a second.
        .set("topic.metadata.refresh.interval.ms", "1000")
        .set("log_level", "3")
        .create_with_context(kafka.context())?;
    match (mock, demo_topics(&config.mapping)) {
        (Some(mock), Ok(topics)) => {
            let mut assignment = TopicPartitionList::new();
            for topic in &topics {
                let _ = mock.create_topic(topic, MOCK_PARTITIONS, 1);
                for partition in 0..MOCK_PARTITIONS {
                    assignment.add_partition_offset(topic, partition, Offset::Beginning)?;
                }
            }
            consumer.assign(&assignment)?;
        }
        (_, topics) => {
            let topics = topics.unwrap_or_else(|pattern| vec![pattern]);
            let topics: Vec<&str> = topics.iter().map(String::as_str).collect();
            consumer.subscribe(&topics)?;
        }
    }
    Ok(consumer)
}

/// Prints records until dropped; `consumed` counts them.
pub(super) async fn run(consumer: StreamConsumer<ClientCallbacks>, consumed: Arc<AtomicU64>) {
    loop {
        let message = match consumer.recv().await {
            Ok(message) => message,
            // Topics not created yet, a broker restart: the consumer retries.
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

/// The topics the demo's events go to, rendered through the topic template;
/// when it names a column the demo does not know, a librdkafka regex for the
/// topics starting with its leading literal.
fn demo_topics(mapping: &MappingConfig) -> Result<Vec<String>, String> {
    let segments = mapping.topic_template.segments();
    let render = |event_type| {
        let parts = segments.iter().map(|segment| match segment {
            Segment::Literal(text) => Some(text.as_str()),
            Segment::RoutedByValue if mapping.route_by == "event_type" => Some(event_type),
            Segment::Column(c) if c == "event_type" => Some(event_type),
            Segment::Column(c) if c == "aggregate_type" => Some("order"),
            _ => None,
        });
        parts.collect::<Option<String>>()
    };
    let topics: Option<Vec<String>> = EVENT_TYPES.map(render).into_iter().collect();
    topics.ok_or_else(|| {
        let literals = segments.iter().map_while(|segment| match segment {
            Segment::Literal(text) => Some(text.as_str()),
            _ => None,
        });
        format!("^{}", literals.collect::<String>().replace('.', "\\."))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Cli;

    /// The mapping the flags give (built from them, so new mapping flags need no change here).
    fn mapping(template: &str) -> MappingConfig {
        let cli = Cli::try_parse_global_from([
            "outbox-relay",
            "demo",
            "--postgres-url",
            "postgres://u@127.0.0.1/db",
            "--topic-template",
            template,
        ])
        .unwrap();
        Config::from_cli(&cli).unwrap().mapping
    }

    #[test]
    fn the_consumer_follows_the_topic_template() {
        assert_eq!(
            demo_topics(&mapping("${routedByValue}")).unwrap(),
            ["order.created", "order.paid", "order.shipped"]
        );
        let custom = mapping("outbox.${aggregate_type}.${x}");
        assert_eq!(demo_topics(&custom), Err("^outbox\\.".to_owned()));
    }
}
