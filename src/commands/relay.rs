//! Running the relay: the pipeline plus its observability companions (the
//! HTTP endpoint, the slot poller, the progress line).

use std::future::Future;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use super::CommandError;
use crate::config::{Cli, Config};
use crate::observability::health::Health;
use crate::observability::{http, metrics, progress};
use crate::pipeline::{Pipeline, RelayError, Summary, exit_code};
use crate::sink::exactly_once::TailReader;
use crate::sink::{KafkaSink, SinkError};
use crate::source::cleanup::Cleanup;
use crate::source::slot_monitor;
use crate::source::{PgSource, heartbeat, setup};

/// How long the HTTP endpoint may take to close after the relay stopped.
const HTTP_CLOSE_TIMEOUT: Duration = Duration::from_secs(2);

/// Validates the flags, runs the relay until SIGINT/SIGTERM or a fatal error.
pub fn run(cli: &Cli) -> ExitCode {
    let config = match Config::from_cli(cli) {
        Ok(config) => config,
        Err(e) => {
            tracing::error!(error = %e, "invalid configuration");
            eprintln!("error: {e}");
            return ExitCode::from(exit_code::CONFIG);
        }
    };
    // One thread: the replication reader, the pipeline and the endpoints hand
    // each other every event, and on one thread that costs no wake-ups
    // (a multi-threaded runtime doubled the relay's CPU per event, see
    // docs/benchmark.md). librdkafka runs its own threads; blocking Kafka
    // calls go to the blocking pool.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let health = Arc::new(Health::new(config.observability.readiness));
    match runtime.block_on(run_with(config, health, shutdown_signal())) {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => ExitCode::from(e.exit_code()),
    }
}

/// Runs the relay with `config` until `shutdown` resolves or a fatal error:
/// the binary's relay, and the one `demo` runs in-process. `health` is the
/// relay's one readiness state, shared by the HTTP endpoint, the producer,
/// the pipeline and the slot poller.
pub(super) async fn run_with(
    config: Config,
    health: Arc<Health>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<Summary, CommandError> {
    let (stop_http, http_stopped) = tokio::sync::oneshot::channel::<()>();
    let http = match config.observability.http_addr {
        Some(addr) => {
            let listener = match http::bind(addr).await {
                Ok(listener) => listener,
                Err(e) => {
                    tracing::error!(error = %e, "cannot start the HTTP endpoint");
                    eprintln!("error: {}", super::report(&e));
                    return Err(e.into());
                }
            };
            let health = health.clone();
            Some(tokio::spawn(async move {
                let handle = install_metrics().await;
                http::serve_on(listener, handle, health, async {
                    let _ = http_stopped.await;
                })
                .await
            }))
        }
        None => None,
    };
    let mut background = vec![tokio::spawn(slot_monitor::run(
        config.clone(),
        health.clone(),
        config.observability.slot_poll_interval,
    ))];
    if let Some(interval) = config.observability.progress_interval {
        background.push(tokio::spawn(progress::run(health.clone(), interval)));
    }

    let metrics_ready = config.observability.http_addr.is_some();
    let outcome = relay(config, health.clone(), shutdown, async move {
        if metrics_ready {
            install_metrics().await;
        }
    })
    .await;

    for task in background {
        task.abort();
    }
    let _ = stop_http.send(());
    if let Some(server) = http {
        match tokio::time::timeout(HTTP_CLOSE_TIMEOUT, server).await {
            Ok(Ok(Err(e))) => tracing::warn!(error = %e, "the HTTP endpoint failed"),
            Ok(_) => {}
            Err(_) => tracing::debug!("the HTTP endpoint did not close in time"),
        }
    }
    match outcome {
        Ok(summary) => {
            tracing::info!(
                frontier = %summary.frontier,
                acked = summary.events_acked,
                abandoned = summary.abandoned,
                "outbox-relay stopped cleanly"
            );
            Ok(summary)
        }
        Err(e) => {
            let code = e.exit_code();
            tracing::error!(error = %super::report(&e), exit_code = code, "outbox-relay stopped");
            Err(e.into())
        }
    }
}

/// Start-up checks, the real source and sink, then the pipeline until
/// `shutdown` resolves or a fatal error. `observability_ready` resolves once
/// the metrics recorder is in place (the pipeline's handles bind to it).
async fn relay(
    config: Config,
    health: Arc<Health>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    observability_ready: impl Future<Output = ()>,
) -> Result<Summary, RelayError> {
    let control = setup::connect(&config).await?;
    let slot = setup::prepare(&control, &config).await?;
    let cleanup = match config.cleanup {
        crate::config::Cleanup::None => None,
        crate::config::Cleanup::Delete => {
            let keys = setup::cleanup_keys(&control, &config).await?;
            Some(Cleanup::new(control, keys, &config, slot.confirmed_flush))
        }
    };
    let (mut sink, deliveries) = KafkaSink::new(
        &config.kafka_brokers,
        &config.kafka_properties,
        config.max_in_flight_events,
        Some(health.clone()),
    )
    .map_err(RelayError::Producer)?;
    if config.delivery == crate::config::Delivery::ExactlyOnce {
        let tails =
            TailReader::new(&config.kafka_brokers, &config.kafka_properties).map_err(|error| {
                RelayError::Producer(SinkError::create(error, &config.kafka_properties))
            })?;
        sink = sink.with_tails(tails);
    }
    observability_ready.await;
    let source = PgSource::new(config.clone(), slot.publication.clone());
    let mut pipeline = Pipeline::new(
        config.clone(),
        source,
        Arc::new(sink),
        deliveries,
        health,
        &slot,
    );
    if let Some(cleanup) = cleanup {
        pipeline = pipeline.with_cleanup(cleanup);
    }
    let heartbeat = config
        .heartbeat_interval
        .map(|interval| tokio::spawn(heartbeat::run(config.clone(), interval)));
    let outcome = pipeline.run(shutdown).await;
    if let Some(task) = heartbeat {
        task.abort();
    }
    outcome
}

/// Installs the Prometheus recorder (only with an endpoint: its upkeep keeps
/// histograms bounded) on the blocking pool. Building it calibrates the TSC
/// clock (`quanta`), which takes up to 200 ms on a busy machine; this way it
/// overlaps the Postgres checks instead of delaying them. Every caller gets
/// the one handle.
async fn install_metrics() -> metrics_exporter_prometheus::PrometheusHandle {
    match tokio::task::spawn_blocking(metrics::install).await {
        Ok(handle) => handle,
        // Only a panic inside the install stops the task; try once more here.
        Err(_) => metrics::install(),
    }
}

/// Resolves on SIGINT or SIGTERM.
pub(super) async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGTERM; only SIGINT stops the relay");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
    }
}
