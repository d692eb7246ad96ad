//! The `outbox-relay` binary: flags → logging → the relay or an operator
//! subcommand → exit code.

use std::process::ExitCode;

use outbox_relay::commands;
use outbox_relay::config::Cli;
use outbox_relay::observability;
use outbox_relay::pipeline::exit_code;

fn main() -> ExitCode {
    let (args, import_warnings) =
        match commands::debezium::expand_args(std::env::args_os().collect()) {
            Ok(expanded) => expanded,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(exit_code::CONFIG);
            }
        };
    let cli = Cli::parse_global_from(args);
    if let Err(message) = observability::init(cli.log_format, &cli.log_level) {
        eprintln!("error: {message}");
        return ExitCode::from(exit_code::CONFIG);
    }
    for warning in import_warnings {
        tracing::warn!("Debezium config: {warning}");
    }
    commands::run(&cli)
}
