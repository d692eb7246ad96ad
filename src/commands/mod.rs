//! The binary's commands: the relay itself (no subcommand) and the
//! subcommands. Each prints its result on stdout (logs go to stderr) and maps
//! its failure to one of [`crate::pipeline::exit_code`]'s codes.

mod backfill;
pub mod debezium;
mod demo;
mod drop_slot;
mod peek;
mod print;
mod relay;
mod reshard;
mod setup;
mod status;

use std::process::ExitCode;

use crate::config::{Cli, Command, Config, ConfigError};
use crate::observability::Chain;
use crate::pipeline::{RelayError, exit_code};
use crate::postgres::{PostgresError, query_err};
use crate::sink::KafkaClients;
use crate::sink::lineage::LineageError;
use crate::source::SourceError;
use crate::startup::StartupError;

/// Why a subcommand failed.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// A flag is wrong.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Postgres refused or failed.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// A Postgres connection or query failed.
    #[error(transparent)]
    Postgres(#[from] PostgresError),
    /// Start-up refused or failed.
    #[error(transparent)]
    Startup(#[from] StartupError),
    /// The lineage topic cannot be read or written.
    #[error(transparent)]
    Lineage(#[from] LineageError),
    /// The command declined to act; the message says why and what to do.
    #[error("{0}")]
    Refused(String),
    /// Kafka refused.
    #[error(transparent)]
    Sink(#[from] crate::sink::SinkError),
    /// Kafka's records could not be read back (`backfill --delivery exactly-once`).
    #[error(transparent)]
    Tail(#[from] crate::sink::exactly_once::TailError),
    /// The HTTP endpoint's address is taken or not ours.
    #[error(
        "cannot listen on --http-addr {addr} (pick another address, or --http-addr none to disable)"
    )]
    Http {
        /// The `--http-addr` that could not be bound.
        addr: std::net::SocketAddr,
        /// The bind error.
        #[source]
        source: std::io::Error,
    },
    /// `--http-addr-file` cannot be written.
    #[error("cannot write the HTTP endpoint's address to --http-addr-file {}", .path.display())]
    HttpAddrFile {
        /// `--http-addr-file`.
        path: std::path::PathBuf,
        /// The write error.
        #[source]
        source: std::io::Error,
    },
    /// `backfill`: a row that cannot be delivered, under `--on-poison fail`.
    #[error(
        "event id {id:?} from {} cannot be delivered: {}; the rows after it were not \
         re-published. Fix the row or the mapping flags, or divert such events with \
         --on-poison dead-letter --dead-letter-topic TOPIC, then rerun the backfill (it is \
         at-least-once)",
        .info.table, .info.error
    )]
    Poison {
        /// Empty when NULL.
        id: String,
        /// Where the row came from and why it failed.
        info: crate::outbox::DeadLetterInfo,
    },
    /// The relay (or `peek`, decoding and mapping as it does) stopped with an error.
    #[error(transparent)]
    Relay(#[from] RelayError),
    /// The demo could not set up its cluster or broker.
    #[error(transparent)]
    Demo(#[from] demo::DemoError),
    /// The AWS identity (`--kafka-auth aws-msk-iam`, `--postgres-auth aws-rds-iam`) has no
    /// credentials or region.
    #[error(transparent)]
    Cloud(#[from] crate::cloud::CloudError),
    /// The async runtime could not start.
    #[error("cannot start the async runtime")]
    Runtime(#[source] std::io::Error),
    /// Writing the result failed (closed stdout, say).
    #[error("cannot write the output")]
    Output(#[from] std::io::Error),
}

impl CommandError {
    /// This failure as the refusal it comes from: a lineage read or write that failed
    /// because the brokers refused the MSK IAM token is that configuration problem (see
    /// [`RelayError::blaming`]).
    fn blaming(self, auth: &crate::cloud::KafkaAuth) -> CommandError {
        let lineage = matches!(
            self,
            CommandError::Lineage(_) | CommandError::Startup(StartupError::Lineage(_))
        );
        match (lineage, auth.refusal()) {
            (true, Some(reason)) => {
                CommandError::Cloud(crate::cloud::CloudError::KafkaRefused { reason })
            }
            _ => match self {
                CommandError::Relay(error) => CommandError::Relay(error.blaming(auth)),
                other => other,
            },
        }
    }

    /// The process exit code, shared with the relay's.
    pub fn exit_code(self) -> u8 {
        match self {
            CommandError::Config(_)
            | CommandError::Refused(_)
            | CommandError::Http { .. }
            | CommandError::HttpAddrFile { .. }
            | CommandError::Cloud(_) => exit_code::CONFIG,
            CommandError::Source(e) => RelayError::Source(e).exit_code(),
            CommandError::Postgres(e) => exit_code::postgres(&e),
            CommandError::Startup(e) => exit_code::startup(&e),
            CommandError::Lineage(_) => exit_code::KAFKA,
            CommandError::Relay(e) => e.exit_code(),
            CommandError::Demo(demo::DemoError::NoServer(_)) => exit_code::CONFIG,
            CommandError::Sink(_) | CommandError::Tail(_) => exit_code::KAFKA,
            CommandError::Poison { .. } => exit_code::POISON,
            CommandError::Demo(_) | CommandError::Runtime(_) | CommandError::Output(_) => 1,
        }
    }
}

/// Runs what the command line asks for.
pub fn run(cli: &Cli) -> ExitCode {
    let result = match &cli.command {
        None => relay::run(cli),
        Some(Command::Setup(args)) if args.print => setup::print(cli),
        Some(Command::Setup(_)) => connected(cli, setup::apply),
        Some(Command::DropSlot(args)) if !args.yes_i_know => (cli.flags.sharded())
            .map_err(CommandError::from)
            .and_then(|flags| Err(CommandError::Refused(drop_slot::refusal(&flags.slot)))),
        Some(Command::DropSlot(args)) => connected(cli, async |c| drop_slot::run(c, args).await),
        Some(Command::Status(args)) => connected(cli, async |c| status::run(c, args).await),
        Some(Command::Peek(args)) => connected(cli, async |c| peek::run(c, args).await),
        Some(Command::Backfill(args)) => connected(cli, async |c| backfill::run(c, args).await),
        Some(Command::Reshard(args)) => connected(cli, async |c| reshard::run(c, args).await),
        Some(Command::Demo(args)) => demo::run(cli, args),
        Some(Command::DebeziumConfig(args)) => {
            debezium::run(args, cli.debezium_worker_config.as_deref())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // The relay logged why it stopped.
        Err(CommandError::Relay(e)) if cli.command.is_none() => ExitCode::from(e.exit_code()),
        Err(e) => {
            eprintln!("error: {}", Chain(&e));
            ExitCode::from(e.exit_code())
        }
    }
}

/// Runs `command` with the validated flags, on a [`block_on`] runtime, once the AWS
/// identity (if any) has its credentials.
fn connected(
    cli: &Cli,
    command: impl AsyncFnOnce(&Config) -> Result<(), CommandError>,
) -> Result<(), CommandError> {
    let config = Config::from_cli(cli)?;
    block_on(async {
        crate::cloud::start(&config.kafka_auth, &config.postgres.auth, None).await?;
        command(&config)
            .await
            .map_err(|error| error.blaming(&config.kafka_auth))
    })?
}

/// A single-threaded runtime, the relay's too: its parts hand each other every
/// event, which costs no wake-ups on one thread (see docs/benchmark.md).
fn block_on<F: std::future::Future>(future: F) -> Result<F::Output, CommandError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(CommandError::Runtime)?;
    Ok(runtime.block_on(future))
}

/// Runs `sql` (one or more statements); a failure says it was trying to `what`.
async fn execute(
    client: &tokio_postgres::Client,
    sql: &str,
    what: &'static str,
) -> Result<(), PostgresError> {
    client.batch_execute(sql).await.map_err(query_err(what))
}

/// The Kafka clients `config` names.
fn kafka(config: &Config) -> KafkaClients {
    KafkaClients::new(&config.kafka_brokers, &config.kafka_properties)
        .with_auth(config.kafka_auth.clone())
}

/// `1536` → `1.5 KiB`.
fn human_bytes(bytes: i64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let unit = (bytes.unsigned_abs().max(1).ilog2() / 10).min(5) as usize;
    let scaled = bytes as f64 / (1u64 << (10 * unit)) as f64;
    match unit {
        0 => format!("{bytes} B"),
        _ => format!("{scaled:.1} {}", UNITS[unit]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_humanised() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(3 << 30), "3.0 GiB");
        assert_eq!(human_bytes(-1536), "-1.5 KiB");
        assert_eq!(human_bytes(i64::MAX), "8192.0 PiB");
    }
}
