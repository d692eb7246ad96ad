//! `outbox-relay demo`: the relay doing its job in one command, no Docker.
//!
//! A throwaway PostgreSQL (or `--postgres-url`), librdkafka's in-process mock
//! broker (or `--kafka-brokers`), a writer committing orders with their
//! outbox events at `--rate`, the real relay in-process between them, and a
//! consumer printing what arrives. Ctrl-C or `--duration` stops it all; the
//! throwaway cluster is removed, and on a user's own server the demo's slot
//! and publication are dropped so they pin no WAL (its tables stay).

mod cluster;
mod consumer;
mod writer;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rdkafka::error::KafkaError;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;
use tokio_postgres::Client;

use super::{CommandError, human_bytes, relay};
use crate::config::{Cli, Config, ConfigError, DemoArgs};
use crate::observability::health::Health;
use crate::outbox::{MappingConfig, Segment};
use crate::source::{setup, sql};

/// The demo's slot and publication, apart from a real relay's.
const SLOT: &str = "outbox_relay_demo";

/// Partitions of each demo topic on the mock broker.
const MOCK_PARTITIONS: i32 = 3;

/// How often the progress line is printed.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// How long the relay may take to relay what was written after the writer
/// stopped, and the consumer to print it.
const CATCH_UP: Duration = Duration::from_secs(10);

/// Why the demo could not run.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// No PostgreSQL server binaries to start a throwaway cluster with.
    #[error(
        "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found: {0}. Install them \
         (Debian/Ubuntu: `sudo apt-get install postgresql`; Fedora: `sudo dnf install \
         postgresql-server`; macOS: `brew install postgresql`), pass their directory with \
         --pg-bin DIR, or run the demo against your own server with --postgres-url"
    )]
    NoServer(String),
    /// initdb or pg_ctl failed.
    #[error("the throwaway PostgreSQL did not start: {0}")]
    Cluster(String),
    /// The temporary directory or a port could not be had.
    #[error("cannot prepare the throwaway PostgreSQL")]
    Io(#[source] std::io::Error),
    /// The mock broker or the demo consumer could not start.
    #[error("cannot start the demo's Kafka side")]
    Kafka(#[from] KafkaError),
}

pub(super) fn run(cli: &Cli, args: &DemoArgs) -> Result<(), CommandError> {
    if !(args.rate.is_finite() && args.rate > 0.0 && args.rate <= 10_000.0) {
        return Err(ConfigError::Invalid {
            flag: "--rate",
            value: args.rate.to_string(),
            reason: "events per second, more than 0 and at most 10000".into(),
        }
        .into());
    }
    let cluster = match cli.postgres_url {
        Some(_) => None,
        None => Some(cluster::Cluster::start(args.pg_bin.as_deref())?),
    };
    let given_brokers = cli
        .kafka_brokers
        .as_deref()
        .is_some_and(|b| !b.trim().is_empty());
    let mock = if given_brokers {
        None
    } else {
        Some(MockCluster::new(1).map_err(DemoError::Kafka)?)
    };

    let mut demo = cli.clone();
    demo.command = None;
    if let Some(cluster) = &cluster {
        demo.postgres_url = cluster.url().parse().ok();
        demo.postgres_password = None;
        demo.postgres_password_file = None;
    }
    if let Some(mock) = &mock {
        demo.kafka_brokers = Some(mock.bootstrap_servers());
    }
    demo.tables = vec![format!("{}.outbox", writer::SCHEMA)];
    demo.message_prefixes.clear();
    demo.slot = SLOT.into();
    demo.publication = SLOT.into();
    let config = Config::from_cli(&demo)?;

    match &cluster {
        Some(c) => println!(
            "demo: PostgreSQL {}:{} (throwaway, in {})",
            config.postgres.host,
            config.postgres.port,
            c.dir().display()
        ),
        None => println!("demo: PostgreSQL {}", config.postgres.redacted()),
    }
    let kind = if mock.is_some() {
        " (in-process mock broker)"
    } else {
        ""
    };
    println!("demo: Kafka {}{kind}", config.kafka_brokers);
    if let Some(addr) = config.observability.http_addr {
        println!("demo: metrics at http://{addr}/metrics");
    }
    println!(
        "demo: writing {} order event(s)/s to {}.outbox; Ctrl-C stops",
        args.rate,
        writer::SCHEMA
    );

    let result = super::block_on(run_demo(config, args, mock.as_ref(), cluster.is_some()))?;
    drop(mock);
    if let Some(cluster) = cluster {
        let dir = cluster.dir().display().to_string();
        drop(cluster);
        println!("demo: removed the throwaway PostgreSQL in {dir}");
    }
    result
}

async fn run_demo(
    config: Config,
    args: &DemoArgs,
    mock: Option<&MockCluster<'static, DefaultProducerContext>>,
    throwaway: bool,
) -> Result<(), CommandError> {
    let client = Arc::new(setup::connect(&config).await?);
    client
        .batch_execute(&writer::schema_sql())
        .await
        .map_err(setup::query_err("create the demo tables"))?;
    // The slot before the first write: nothing committed before it is relayed.
    setup::prepare(&client, &config).await?;
    let topics = demo_topics(&config.mapping);
    let mut partitions = None;
    if let (Some(mock), Some(topics)) = (mock, &topics) {
        // Created up front, so the consumer reads them from the start.
        for topic in topics {
            let _ = mock.create_topic(topic, MOCK_PARTITIONS, 1);
        }
        partitions = Some(MOCK_PARTITIONS);
    }
    let topics = topics.unwrap_or_else(|| vec![topic_pattern(&config.mapping)]);
    let consumer = consumer::subscribe(
        &config.kafka_brokers,
        &config.kafka_properties,
        &topics,
        partitions,
    )
    .map_err(DemoError::Kafka)?;

    let (written, consumed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let (stop_relay, relay_stopped) = tokio::sync::oneshot::channel::<()>();
    let health = Arc::new(Health::new(config.observability.readiness));
    let shutdown = async move {
        let _ = relay_stopped.await;
    };
    let mut relay = tokio::spawn(relay::run_with(config.clone(), health.clone(), shutdown));
    let consumer = tokio::spawn(consumer::run(consumer, consumed.clone()));
    let counts = [written.clone(), consumed.clone()];
    let progress = tokio::spawn(progress(client.clone(), health.clone(), counts));

    let (stop_writer, writer_stop) = tokio::sync::watch::channel(false);
    let mut writer = tokio::spawn(writer::run(
        client.clone(),
        args.rate,
        written.clone(),
        writer_stop,
    ));
    let until = async {
        match args.duration {
            Some(duration) => tokio::time::sleep(duration).await,
            None => std::future::pending().await,
        }
    };
    let mut writer_outcome = None;
    tokio::select! {
        () = relay::shutdown_signal() => {}
        () = until => {}
        outcome = &mut writer => writer_outcome = Some(outcome),
        outcome = &mut relay => {
            // The relay stopped by itself: that is the error to show.
            writer.abort();
            consumer.abort();
            progress.abort();
            return match outcome {
                Ok(Err(e)) => Err(e),
                _ => Err(CommandError::Refused("the relay stopped unexpectedly".into())),
            };
        }
    }
    // The writer finishes its transaction; the relay relays what was written
    // (bounded), then stops; the consumer prints what was relayed (bounded).
    let _ = stop_writer.send(true);
    let writer_outcome = match writer_outcome {
        Some(outcome) => outcome,
        None => writer.await,
    };
    let failure = match writer_outcome {
        Ok(Err(e)) => Some(CommandError::from(e)),
        _ => None,
    };
    let relayed = || health.progress().events_acked;
    let deadline = Instant::now() + CATCH_UP;
    while relayed() < written.load(Ordering::Relaxed) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = stop_relay.send(());
    let summary = match relay.await {
        Ok(outcome) => outcome?,
        Err(_) => return Err(CommandError::Refused("the relay task failed".into())),
    };
    let deadline = Instant::now() + CATCH_UP;
    while consumed.load(Ordering::Relaxed) < summary.events_acked && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    consumer.abort();
    progress.abort();
    println!(
        "demo: stopped; {} event(s) written, {} relayed, {} received",
        written.load(Ordering::Relaxed),
        summary.events_acked,
        consumed.load(Ordering::Relaxed)
    );
    if !throwaway {
        drop_slot(&client, &config).await;
    }
    failure.map_or(Ok(()), Err)
}

/// Every few seconds: the slot's confirmed position against the WAL end, and the counts.
async fn progress(
    client: Arc<Client>,
    health: Arc<Health>,
    [written, consumed]: [Arc<AtomicU64>; 2],
) {
    let mut tick =
        tokio::time::interval_at(tokio::time::Instant::now() + PROGRESS_EVERY, PROGRESS_EVERY);
    loop {
        tick.tick().await;
        let row = client
            .query_opt(
                "SELECT confirmed_flush_lsn::text, pg_current_wal_lsn()::text, \
                 pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint \
                 FROM pg_replication_slots WHERE slot_name = $1",
                &[&SLOT],
            )
            .await;
        let slot = match row {
            Ok(Some(row)) => format!(
                "slot confirmed {} of WAL end {} ({} behind)",
                row.get::<_, Option<String>>(0).unwrap_or_default(),
                row.get::<_, Option<String>>(1).unwrap_or_default(),
                human_bytes(row.get::<_, Option<i64>>(2).unwrap_or_default())
            ),
            _ => "slot position unavailable".to_owned(),
        };
        println!(
            "demo: {slot}; events written {}, relayed {}, received {}",
            written.load(Ordering::Relaxed),
            health.progress().events_acked,
            consumed.load(Ordering::Relaxed)
        );
    }
}

/// On a user's server, the demo's slot would pin WAL forever: drop it and the
/// publication (the walsender may take a moment to let go of the slot).
async fn drop_slot(client: &Client, config: &Config) {
    for _ in 0..50 {
        match client.batch_execute(&sql::drop_slot(&config.slot)).await {
            Ok(()) => break,
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let _ = client
        .batch_execute(&sql::drop_publication(&config.publication))
        .await;
    println!(
        "demo: dropped slot and publication {SLOT:?}; the {} tables stay",
        writer::SCHEMA
    );
}

/// The topics the demo's events go to, rendered through the topic template
/// (`None` when it names a column whose values the demo does not know).
fn demo_topics(mapping: &MappingConfig) -> Option<Vec<String>> {
    writer::EVENT_TYPES
        .iter()
        .map(|event_type| {
            let mut topic = String::new();
            for segment in mapping.topic_template.segments() {
                match segment {
                    Segment::Literal(text) => topic.push_str(text),
                    Segment::RoutedByValue if mapping.route_by == "event_type" => {
                        topic.push_str(event_type)
                    }
                    Segment::Column(c) if c == "event_type" => topic.push_str(event_type),
                    Segment::Column(c) if c == "aggregate_type" => topic.push_str("order"),
                    _ => return None,
                }
            }
            Some(topic)
        })
        .collect()
}

/// A librdkafka regex for topics starting with the template's leading literal.
fn topic_pattern(mapping: &MappingConfig) -> String {
    let mut prefix = String::new();
    for segment in mapping.topic_template.segments() {
        match segment {
            Segment::Literal(text) => prefix.push_str(text),
            _ => break,
        }
    }
    format!("^{}", prefix.replace('.', "\\."))
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(demo_topics(&custom), None);
        assert_eq!(topic_pattern(&custom), "^outbox\\.");
    }
}
