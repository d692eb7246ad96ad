//! The `outbox-relay` binary: flags (and a `--debezium-config` file) → logging → the relay or an
//! operator subcommand → exit code.

use std::process::ExitCode;

use outbox_relay::config::Cli;
use outbox_relay::pipeline::exit_code;
use outbox_relay::{commands, observability};

/// jemalloc, for Rust and for librdkafka (it replaces `malloc`): librdkafka allocates each
/// message and its headers on the pipeline's thread and frees them on the delivery-report
/// thread, which glibc's allocator serves through its arena locks and bin consolidation
/// (15% of the relay's CPU in the profile in docs/benchmark.md).
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    let (cli, import_warnings) = match Cli::parse_global_from(std::env::args_os().collect()) {
        Ok(parsed) => parsed,
        Err(e) => {
            eprintln!("error: {:#}", anyhow::Error::new(e));
            return ExitCode::from(exit_code::CONFIG);
        }
    };
    // The replication client's own error line is off: the relay reports each error itself.
    let filter = outbox_relay::source::log_filter(&cli.log_level);
    if let Err(message) = observability::init(cli.log_format, &filter) {
        eprintln!("error: {message}");
        return ExitCode::from(exit_code::CONFIG);
    }
    for warning in import_warnings {
        tracing::warn!("Debezium config: {warning}");
    }
    commands::run(&cli)
}
