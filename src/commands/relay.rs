//! Running the relay: the pipeline plus its observability companions (the
//! HTTP endpoint, the slot poller, the progress line).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use tokio::net::TcpListener;
use tokio::task::JoinSet;

use super::CommandError;
use crate::config::{Cleanup, Cli, Config, Delivery};
use crate::observability::health::Health;
use crate::observability::{Chain, http, metrics, progress};
use crate::outbox::TableName;
use crate::pipeline::cleanup;
use crate::pipeline::{Pipeline, RelayError, Summary};
use crate::postgres::Connector;
use crate::sink::exactly_once::TailReader;
use crate::sink::lineage::Reshard;
use crate::sink::{KafkaClients, KafkaSink};
use crate::source::deleter::{PgDeleter, Table};
use crate::source::{PgSource, StreamSettings, heartbeat, slot_monitor};
use crate::startup::lineage::{self, Lineage};
use crate::startup::wait::{Patient, Schedule};
use crate::startup::{Started, Wanted};

/// How long the HTTP endpoint may take to close after the relay stopped.
const HTTP_CLOSE_TIMEOUT: Duration = Duration::from_secs(2);

/// Validates the flags, runs the relay until SIGINT/SIGTERM or a fatal error.
pub(super) fn run(cli: &Cli) -> Result<(), CommandError> {
    let config = Config::from_cli(cli)
        .inspect_err(|e| tracing::error!(error = %Chain(e), "invalid configuration"))?;
    let health = Arc::new(Health::new(
        config.flags.observability.readiness.thresholds(),
    ));
    super::block_on(run_with(config, health, shutdown_signal()))??;
    Ok(())
}

/// The relay with its companions until `shutdown` or a fatal error (also the
/// demo's); `health` is the readiness state they all share.
pub(super) async fn run_with(
    config: Config,
    health: Arc<Health>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<Summary, CommandError> {
    let observability = &config.flags.observability;
    let http = HttpEndpoint::start(
        observability.http_addr,
        &observability.http_addr_file,
        &health,
    )
    .await?;
    if config.flags.observability.http_addr.is_some() {
        // Now, so that what the AWS identity reports at start-up reaches /metrics.
        install_metrics().await;
    }
    // Before any connection (the slot poller's too): each logs in with a token signed from
    // these credentials.
    let auth = crate::cloud::start(
        &config.kafka_auth,
        &config.postgres.auth,
        Some(health.clone()),
    );
    if let Err(error) = auth.await {
        let error = RelayError::Cloud(error);
        let code = error.exit_code();
        tracing::error!(error = %Chain(&error), exit_code = code, "outbox-relay stopped");
        http.close().await;
        return Err(error.into());
    }
    // The pipeline polls its shutdown future at every step: a oneshot costs an atomic load
    // there, the signal listeners a few hundred instructions.
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let mut background = companions(&config, &health);
    background.spawn(async move {
        shutdown.await;
        let _ = stop.send(());
    });
    let kafka_auth = config.kafka_auth.clone();
    let outcome = relay(config, health, stopped.map(|_| ())).await;
    let outcome = outcome.map_err(|error| error.blaming(&kafka_auth));
    drop(background);
    http.close().await;
    match &outcome {
        Ok(summary) => tracing::info!(
            frontier = %summary.frontier,
            acked = summary.events_acked,
            abandoned = summary.abandoned,
            "outbox-relay stopped cleanly"
        ),
        Err(e) => {
            let code = e.exit_code();
            tracing::error!(error = %Chain(e), exit_code = code, "outbox-relay stopped");
        }
    }
    Ok(outcome?)
}

/// The tasks beside the pipeline (the slot poller, the progress line), aborted when dropped.
fn companions(config: &Config, health: &Arc<Health>) -> JoinSet<()> {
    let mut background = JoinSet::new();
    let poll_interval = config.flags.observability.slot_poll_interval;
    let connector = Connector::new(config.postgres.clone());
    let slot = config.flags.slot.clone();
    let slot_monitor = slot_monitor::run(connector, slot, health.clone(), poll_interval);
    background.spawn(slot_monitor);
    if let Some(interval) = config.flags.observability.progress_interval {
        background.spawn(progress::run(health.clone(), interval));
    }
    background
}

/// `/metrics`, `/healthz` and `/readyz` (`--http-addr`), served until closed.
struct HttpEndpoint {
    stop: tokio::sync::oneshot::Sender<()>,
    server: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl HttpEndpoint {
    /// Serves on `addr` (none: not at all), bound here, so that a taken port fails start-up
    /// rather than a background task; the address it listens on is written to `addr_file`
    /// (`--http-addr-file`), if given.
    async fn start(
        addr: Option<SocketAddr>,
        addr_file: &Option<std::path::PathBuf>,
        health: &Arc<Health>,
    ) -> Result<Self, CommandError> {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let Some(addr) = addr else {
            return Ok(HttpEndpoint { stop, server: None });
        };
        let listener = TcpListener::bind(addr).await.map_err(|source| {
            let error = CommandError::Http { addr, source };
            tracing::error!(error = %Chain(&error), "cannot start the HTTP endpoint");
            error
        })?;
        if let Some(path) = addr_file {
            write_addr_file(path, &listener)?;
        }
        let health = health.clone();
        let stopped = stopped.map(|_| ());
        let server = tokio::spawn(async move {
            http::serve_on(listener, install_metrics().await, health, stopped).await
        });
        Ok(HttpEndpoint {
            stop,
            server: Some(server),
        })
    }

    /// Stops serving, waiting up to [`HTTP_CLOSE_TIMEOUT`] for the server to close.
    async fn close(self) {
        let _ = self.stop.send(());
        if let Some(server) = self.server
            && let Ok(Ok(Err(e))) = tokio::time::timeout(HTTP_CLOSE_TIMEOUT, server).await
        {
            tracing::warn!(error = %e, "the HTTP endpoint failed");
        }
    }
}

/// Start-up, the real source and sink, then the pipeline.
async fn relay(
    config: Config,
    health: Arc<Health>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<Summary, RelayError> {
    // Checked before the slot is made, so a refusal leaves nothing behind.
    let registry = (config.schema_registry.as_ref())
        .map(crate::sink::registry::HttpRegistry::new)
        .transpose()?;
    let connector = Connector::new(config.postgres.clone());
    let kafka = super::kafka(&config);
    let wanted = Wanted::new(&config);
    let mut shutdown = Box::pin(shutdown);
    let patient = Patient {
        wanted: &wanted,
        postgres: &connector,
        kafka: &kafka,
        schedule: Schedule {
            min: config.flags.reconnect_backoff_min,
            max: config.flags.reconnect_backoff_max,
        },
        health: &health,
    };
    let Some(started) = start_up(&patient, &mut shutdown).await? else {
        return Ok(Summary::default());
    };
    let cleanup = match config.flags.cleanup {
        Cleanup::None => None,
        Cleanup::Delete => Some(cleanup(&started, &connector)),
    };
    let in_flight = config.flags.max_in_flight_events;
    let tails = (config.flags.delivery == Delivery::ExactlyOnce)
        .then(|| TailReader::new(&kafka))
        .transpose()
        .map_err(RelayError::Producer)?;
    let producer_health = Some(health.clone());
    let (sink, deliveries) =
        KafkaSink::new(&kafka, in_flight, producer_health, tails).map_err(RelayError::Producer)?;
    if config.flags.observability.http_addr.is_some() {
        // The pipeline's metric handles bind to the recorder in place now.
        install_metrics().await;
        metrics::set_shard(config.flags.shard, &config.flags.slot);
    }
    let settings = StreamSettings {
        slot: config.flags.slot.clone(),
        publication: config.flags.publication.clone(),
        tables: config.tables.clone(),
        status_interval: config.flags.status_interval,
    };
    let source = PgSource::new(connector.clone(), settings, started.publication.clone());
    // Aborted when dropped, as the pipeline stops.
    let _companions = streaming_companions(&config, &wanted, &connector, &kafka);
    let sink = Arc::new(sink);
    let mut pipeline = Pipeline::new(config, source, sink, deliveries, health, &started, cleanup);
    if let Some(registry) = registry {
        pipeline = pipeline.with_registry(Arc::new(registry));
    }
    let outcome = pipeline.run(shutdown).await;
    unless_retired(outcome, &wanted, &connector, &kafka).await
}

/// The tasks beside a streaming relay (the heartbeat, the lineage record's refresh), aborted
/// when dropped.
fn streaming_companions(
    config: &Config,
    wanted: &Wanted,
    connector: &Connector,
    kafka: &KafkaClients,
) -> JoinSet<()> {
    let mut companions = JoinSet::new();
    if let Some(interval) = config.flags.heartbeat_interval.filter(|d| !d.is_zero()) {
        companions.spawn(heartbeat::run(connector.clone(), interval));
    }
    let topic = wanted.lineage_topic.clone();
    let fresh = lineage::keep_fresh(connector.clone(), kafka.clone(), topic, wanted.slot.clone());
    companions.spawn(fresh);
    companions
}

/// Start-up, waiting out outages; `None` when `shutdown` came first.
async fn start_up(
    patient: &Patient<'_>,
    shutdown: &mut (impl Future<Output = ()> + Unpin),
) -> Result<Option<Started>, RelayError> {
    let slot = &patient.wanted.slot;
    let Some(started) = patient.start(shutdown).await? else {
        tracing::info!(slot = %slot, "stopped during start-up: nothing was streamed");
        return Ok(None);
    };
    if let Some(warning) = &started.late_shard {
        let created = started.confirmed_flush;
        tracing::warn!(slot = %slot, %created, "{warning}");
    }
    Ok(Some(started))
}

/// The pipeline's `outcome`, but a clean stop where its slot was dropped by the `reshard
/// --finish` that retired its fleet.
async fn unless_retired(
    outcome: Result<Summary, RelayError>,
    wanted: &Wanted,
    connector: &Connector,
    kafka: &KafkaClients,
) -> Result<Summary, RelayError> {
    let Err(RelayError::SlotDropped { slot, frontier }) = outcome else {
        return outcome;
    };
    match retired(wanted, connector, kafka).await {
        Some(done) => Ok(retired_stop(&slot, done)),
        None => Err(RelayError::SlotDropped { slot, frontier }),
    }
}

/// The resharding whose `--finish` dropped this relay's slot, as the lineage topic says it,
/// if it retired this relay's fleet; `None` when it did not, or the topic cannot say.
async fn retired(wanted: &Wanted, connector: &Connector, kafka: &KafkaClients) -> Option<Reshard> {
    let topic = &wanted.lineage_topic;
    let opened = Lineage::open(connector, kafka, topic, &wanted.slot).await;
    let record = opened.ok()?.read().await.ok()??;
    record.retired_from(wanted.count())
}

/// A relay whose slot `reshard --finish` dropped (a standby of an old shard, say) stops
/// cleanly: its shard's events are the new fleet's to relay now.
fn retired_stop(slot: &str, done: Reshard) -> Summary {
    tracing::info!(
        slot = %slot,
        "`{done} --finish` dropped this relay's slot: its shard was retired, and the new \
         fleet relays its events from where it stopped. Stopping; remove this relay (a restart \
         is refused beside the new fleet's slots)"
    );
    Summary::default()
}

/// Writes the address `listener` listens on to `path` (`--http-addr-file`), whole or not at
/// all: written beside it, then renamed over it, so a reader never sees half an address.
fn write_addr_file(path: &std::path::Path, listener: &TcpListener) -> Result<(), CommandError> {
    let written = listener.local_addr().and_then(|addr| {
        let partial = path.with_extension("partial");
        std::fs::write(&partial, format!("{addr}\n"))?;
        std::fs::rename(&partial, path)
    });
    written.map_err(|source| {
        let path = path.to_owned();
        let error = CommandError::HttpAddrFile { path, source };
        tracing::error!(error = %Chain(&error), "cannot start the HTTP endpoint");
        error
    })
}

/// `--cleanup delete`: the outbox tables with the primary keys start-up read, deleted from on
/// a connection of their own.
fn cleanup(started: &Started, connector: &Connector) -> cleanup::Cleanup {
    let table = |(name, key): &(TableName, Vec<String>)| Table::new(name, key.clone());
    let tables = started.primary_keys.iter().map(table).collect();
    cleanup::Cleanup::with(tables, Box::new(PgDeleter::new(connector)))
}

/// The Prometheus recorder (only with an endpoint, whose upkeep bounds it), built
/// on the blocking pool: its clock calibration (up to 200 ms) overlaps start-up.
async fn install_metrics() -> metrics_exporter_prometheus::PrometheusHandle {
    // Only a panic inside the install fails the task; then try once more here.
    tokio::task::spawn_blocking(metrics::install)
        .await
        .unwrap_or_else(|_| metrics::install())
}

/// Resolves on SIGINT or SIGTERM.
pub(super) async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received"),
            _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
        },
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGTERM; only SIGINT stops the relay");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_taken_port_is_a_clear_error() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap().to_string();
        let cli = Cli::try_parse_global_from([
            "outbox-relay",
            "--postgres-url",
            "postgres://u@127.0.0.1/db",
            "--kafka-brokers",
            "127.0.0.1:9",
            "--http-addr",
            &addr,
        ])
        .unwrap();
        let config = Config::from_cli(&cli).unwrap();
        let health = Arc::new(Health::default());
        let err = run_with(config, health, async {}).await.unwrap_err();
        assert!(matches!(err, CommandError::Http { .. }), "{err:?}");
        assert!(err.to_string().contains("--http-addr"), "{err}");
    }

    #[tokio::test]
    async fn the_address_the_system_chose_is_written_down_whole() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("addr");
        write_addr_file(&path, &listener).unwrap();
        let written = std::fs::read_to_string(&path).unwrap();
        assert_eq!(written, format!("{}\n", listener.local_addr().unwrap()));
        assert_ne!(listener.local_addr().unwrap().port(), 0);
        // Nothing half-written is left beside it.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        let nowhere = dir.path().join("missing/addr");
        let err = write_addr_file(&nowhere, &listener).unwrap_err();
        assert!(matches!(err, CommandError::HttpAddrFile { .. }), "{err:?}");
        assert!(err.to_string().contains("--http-addr-file"), "{err}");
    }
}
