//! The `outbox-relay` binary: flags (and a `--debezium-config` file) → logging → the relay or an
//! operator subcommand → exit code.

use std::process::ExitCode;

use outbox_relay::config::Cli;
use outbox_relay::pipeline::exit_code;
use outbox_relay::{commands, observability};

fn main() -> ExitCode {
    let (cli, import_warnings) = match Cli::parse_global_from(std::env::args_os().collect()) {
        Ok(parsed) => parsed,
        Err(e) => {
            eprintln!("error: {:#}", anyhow::Error::new(e));
            return ExitCode::from(exit_code::CONFIG);
        }
    };
    if let Err(message) = observability::init(cli.log_format, &cli.log_level) {
        eprintln!("error: {message}");
        return ExitCode::from(exit_code::CONFIG);
    }
    for warning in import_warnings {
        tracing::warn!("Debezium config: {warning}");
    }
    commands::run(&cli)
}
