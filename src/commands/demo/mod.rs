//! `outbox-relay demo`: the relay doing its job in one command, no Docker: a
//! throwaway PostgreSQL (or `--postgres-url`), the in-process mock broker (or
//! `--kafka-brokers`), a writer at `--rate`, the real relay and a consumer
//! printing what arrives.

mod cluster;
mod consumer;
mod writer;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use rdkafka::error::KafkaError;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;
use tokio::task::JoinSet;
use tokio_postgres::Client;
use tokio_postgres::error::SqlState;

use super::{CommandError, human_bytes, relay};
use crate::config::{Cli, Config, ConfigError, DemoArgs};
use crate::observability::health::Health;
use crate::postgres::Connector;
use crate::postgres::catalog::slots;
use crate::postgres::sql;
use crate::startup::lineage::Lineage;
use crate::startup::{self, Wanted};

/// The demo's slot and publication, apart from a real relay's.
const SLOT: &str = "outbox_relay_demo";

/// How often the progress line is printed.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// How long the relay and the consumer may take to catch up with the writer.
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
    /// The relay's task ended without a result (it stopped by itself, or it failed).
    #[error("the demo's relay {0} unexpectedly")]
    RelayEnded(&'static str),
}

pub(super) fn run(cli: &Cli, args: &DemoArgs) -> Result<(), CommandError> {
    if !(args.rate > 0.0 && args.rate <= 10_000.0) {
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
    let brokers = cli.kafka_brokers.as_deref().unwrap_or_default();
    let no_brokers = brokers.trim().is_empty();
    let mock = no_brokers.then(|| MockCluster::new(1)).transpose();
    let mock = mock.map_err(DemoError::Kafka)?;
    let mut demo = cli.clone();
    demo.command = None;
    if let Some(cluster) = &cluster {
        demo.postgres_url = Some(cluster.url.as_str().into());
        demo.postgres_password = None;
        demo.postgres_password_file = None;
    }
    if let Some(mock) = &mock {
        demo.kafka_brokers = Some(mock.bootstrap_servers());
    }
    demo.tables = vec![writer::OUTBOX.to_owned()];
    demo.message_prefixes.clear();
    demo.flags.slot = SLOT.into();
    demo.flags.publication = SLOT.into();
    // The demo's slot is created afresh and dropped at every exit: nothing to guard.
    demo.flags.allow_new_slot = true;
    let config = Config::from_cli(&demo)?;

    let pg = &config.postgres;
    let postgres = match cluster.as_ref().map(|c| c.dir.path().display()) {
        Some(dir) => format!("{}:{} (throwaway, in {dir})", pg.host, pg.port),
        None => pg.redacted().to_string(),
    };
    println!("demo: PostgreSQL {postgres}");
    let broker = mock.as_ref().map_or("", |_| " (in-process mock broker)");
    println!("demo: Kafka {}{broker}", config.kafka_brokers);
    if let Some(addr) = config.flags.observability.http_addr {
        println!("demo: metrics at http://{addr}/metrics");
    }
    let rate = args.rate;
    let outbox = writer::OUTBOX;
    println!("demo: writing {rate} order event(s)/s to {outbox}; Ctrl-C stops");

    let result = super::block_on(async {
        let result = run_demo(&config, args, mock.as_ref()).await;
        clean_up(&config, cluster.is_none(), mock.is_none()).await;
        result
    })?;
    drop(mock);
    if let Some(cluster) = cluster {
        let dir = cluster.dir.path().display().to_string();
        drop(cluster);
        println!("demo: removed the throwaway PostgreSQL in {dir}");
    }
    result
}

async fn run_demo(
    config: &Config,
    args: &DemoArgs,
    mock: Option<&MockCluster<'static, DefaultProducerContext>>,
) -> Result<(), CommandError> {
    crate::cloud::start(&config.kafka_auth, &config.postgres.auth, None).await?;
    let connector = Connector::new(config.postgres.clone());
    let client = Arc::new(connector.control().await?);
    super::execute(&client, &writer::schema_sql(), "create the demo tables").await?;
    // The slot before the first write: nothing committed before it is relayed.
    let kafka = super::kafka(config);
    startup::start(&Wanted::new(config), &connector, &kafka).await?;
    let consumer = consumer::subscribe(config, mock).map_err(DemoError::Kafka)?;

    let written = Arc::new(AtomicU64::new(0));
    let consumed = Arc::new(AtomicU64::new(0));
    let health = Arc::new(Health::new(
        config.flags.observability.readiness.thresholds(),
    ));
    let (stop_relay, relay_stopped) = tokio::sync::oneshot::channel::<()>();
    let shutdown = relay_stopped.map(|_| ());
    let mut relay = tokio::spawn(relay::run_with(config.clone(), health.clone(), shutdown));
    let duration = args.duration.unwrap_or(Duration::MAX);
    // Ctrl-C or the end of --duration.
    let stop_writer = tokio::time::timeout(duration, relay::shutdown_signal()).map(|_| ());
    let writer = writer::run(client.clone(), args.rate, written.clone(), stop_writer);
    let writer = tokio::spawn(writer);
    // Aborted when dropped.
    let mut background = JoinSet::new();
    background.spawn(consumer::run(consumer, consumed.clone()));
    let counts = [written.clone(), consumed.clone()];
    background.spawn(progress(client.clone(), health.clone(), counts));

    // The writer stops between transactions, then relay and consumer catch up.
    let writer_failure = tokio::select! {
        outcome = writer => outcome,
        // The relay stopped by itself: that is the error to show.
        outcome = &mut relay => return match outcome {
            Ok(Err(e)) => Err(e),
            _ => Err(DemoError::RelayEnded("stopped by itself").into()),
        },
    };
    let written = written.load(Relaxed);
    catch_up(|| health.progress().events_acked >= written).await;
    let _ = stop_relay.send(());
    let relayed = match relay.await {
        Ok(outcome) => outcome?.events_acked,
        Err(_) => return Err(DemoError::RelayEnded("failed").into()),
    };
    catch_up(|| consumed.load(Relaxed) >= relayed).await;
    drop(background);
    let received = consumed.load(Relaxed);
    println!("demo: stopped; {written} event(s) written, {relayed} relayed, {received} received");
    match writer_failure {
        Ok(Err(e)) => Err(e.into()),
        _ => Ok(()),
    }
}

/// Waits until `done` holds, at most [`CATCH_UP`].
async fn catch_up(done: impl Fn() -> bool) {
    let deadline = Instant::now() + CATCH_UP;
    while !done() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every few seconds: the slot's confirmed position against the WAL end, and the counts.
async fn progress(
    client: Arc<Client>,
    health: Arc<Health>,
    [written, consumed]: [Arc<AtomicU64>; 2],
) {
    let start = tokio::time::Instant::now() + PROGRESS_EVERY;
    let mut tick = tokio::time::interval_at(start, PROGRESS_EVERY);
    loop {
        tick.tick().await;
        let slot = match slots::progress(&client, SLOT).await {
            Ok(Some((position, behind))) => {
                let behind = human_bytes(behind);
                format!("{position} ({behind} behind)")
            }
            _ => "slot position unavailable".to_owned(),
        };
        println!(
            "demo: {slot}; events written {}, relayed {}, received {}",
            written.load(Relaxed),
            health.progress().events_acked,
            consumed.load(Relaxed)
        );
    }
}

/// Runs however the demo ended. On a user's server the demo's slot would pin WAL forever: drop
/// it and the publication (the walsender may take a moment to let go of the slot). In a user's
/// Kafka, remove the slot's lineage record.
async fn clean_up(config: &Config, users_server: bool, users_kafka: bool) {
    let connector = Connector::new(config.postgres.clone());
    let Ok(client) = connector.control().await else {
        eprintln!(
            "demo: cannot reconnect to drop slot {SLOT:?}: drop it with `outbox-relay drop-slot`"
        );
        return;
    };
    if users_server {
        let statement = sql::drop_slot(SLOT);
        for _ in 0..50 {
            match client.batch_execute(&statement).await {
                Ok(()) => break,
                Err(e) if e.code() == Some(&SqlState::UNDEFINED_OBJECT) => break,
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        let _ = client.batch_execute(&sql::drop_publication(SLOT)).await;
        let schema = writer::SCHEMA;
        println!("demo: dropped slot and publication {SLOT:?}; the {schema} tables stay");
    }
    let kafka = super::kafka(config);
    let topic = &config.flags.lineage_topic;
    if users_kafka && let Ok(lineage) = Lineage::open(&connector, &kafka, topic, SLOT).await {
        let _ = lineage.forget().await;
    }
}
