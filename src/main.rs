//! The `outbox-relay` binary: flags → validated config → logging → run → exit code.

use std::process::ExitCode;

use clap::Parser;
use outbox_relay::config::{Cli, Config};
use outbox_relay::observability;
use outbox_relay::pipeline::{self, exit_code};

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(message) = observability::init(cli.log_format, &cli.log_level) {
        eprintln!("error: {message}");
        return ExitCode::from(exit_code::CONFIG);
    }
    let config = match Config::from_cli(&cli) {
        Ok(config) => config,
        Err(e) => {
            tracing::error!(error = %e, "invalid configuration");
            eprintln!("error: {e}");
            return ExitCode::from(exit_code::CONFIG);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(pipeline::run(config, shutdown_signal())) {
        Ok(summary) => {
            tracing::info!(
                frontier = %summary.frontier,
                acked = summary.events_acked,
                abandoned = summary.abandoned,
                "outbox-relay stopped cleanly"
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            let code = e.exit_code();
            tracing::error!(error = %e, exit_code = code, "outbox-relay stopped");
            ExitCode::from(code)
        }
    }
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
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
