//! The `outbox-relay` binary: flags → logging → the relay or an operator
//! subcommand → exit code.

use std::process::ExitCode;

use outbox_relay::commands;
use outbox_relay::config::Cli;
use outbox_relay::observability;
use outbox_relay::pipeline::exit_code;

fn main() -> ExitCode {
    let cli = Cli::parse_global();
    if let Err(message) = observability::init(cli.log_format, &cli.log_level) {
        eprintln!("error: {message}");
        return ExitCode::from(exit_code::CONFIG);
    }
    commands::run(&cli)
}
