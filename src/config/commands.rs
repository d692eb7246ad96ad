//! Operator subcommands and how the command line is parsed with them. Every relay flag is global
//! (before or after the subcommand); clap cannot require a global flag, so `--postgres-url` and
//! `--kafka-brokers` are checked in [`Config::from_cli`](super::Config::from_cli) instead.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, CommandFactory, FromArgMatches, Subcommand};

use super::debezium::{self, ImportError, Imported};
use super::{Cli, ConfigError, parse_duration, parse_tables};
use crate::outbox::TableName;

/// What to do; the relay runs when no subcommand is given.
#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// See it work: a throwaway PostgreSQL and Kafka (or --postgres-url, --kafka-brokers), a
    /// writer of orders with outbox events, the relay, and a consumer printing what arrives.
    Demo(DemoArgs),
    /// Show the slot (position, lag, WAL retention), the publication and the server settings.
    Status(StatusArgs),
    /// Create the publication and the slot (skipping what exists), or print the SQL.
    Setup(SetupArgs),
    /// Drop the replication slot (and optionally the publication).
    DropSlot(DropSlotArgs),
    /// Print the records the relay would produce for what is pending in the slot, without
    /// consuming it (the slot must be inactive: stop the relay first).
    Peek(PeekArgs),
    /// Translate a Debezium connector configuration into outbox-relay flags.
    DebeziumConfig(DebeziumConfigArgs),
    /// Re-publish outbox rows still in the tables, e.g. what a lost slot missed after a failover.
    Backfill(BackfillArgs),
    /// Move the outbox from --from K relays to --to K' (1: one relay without --shard): create
    /// the new shards' slots and wait until the old ones pass them; then, the old relays
    /// stopped, --finish starts the new slots where the old ones stopped and drops the old.
    Reshard(ReshardArgs),
}

/// `reshard` flags.
#[derive(Debug, Clone, Args)]
pub struct ReshardArgs {
    /// How many shards relay the outbox now (1: one relay without --shard).
    #[arg(long, value_name = "K", value_parser = shard_count)]
    pub from: u32,
    /// How many shards will relay it (1: one relay without --shard).
    #[arg(long, value_name = "K", value_parser = shard_count)]
    pub to: u32,
    /// The second step, with every old relay (standbys too) stopped.
    #[arg(long)]
    pub finish: bool,
    /// How long the first step waits for the old slots to pass the new ones' start.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub timeout: Duration,
}

fn shard_count(raw: &str) -> Result<u32, String> {
    let max = crate::outbox::shard::MAX_SHARDS;
    let count = raw.parse::<u32>().ok().filter(|k| (1..=max).contains(k));
    count.ok_or_else(|| format!("expected 1 to {max}"))
}

/// `backfill` flags.
#[derive(Debug, Clone, Args)]
pub struct BackfillArgs {
    /// Re-publish rows whose --column is at or after this timestamptz ('2026-11-23 10:00:00+00').
    #[arg(long)]
    pub since: String,
    /// The timestamp column --since applies to.
    #[arg(long, default_value = "created_at")]
    pub column: String,
}

/// `debezium-config` flags.
#[derive(Debug, Clone, Args)]
pub struct DebeziumConfigArgs {
    /// The connector configuration (JSON or .properties) to print as flags, with what is lost.
    #[arg(long, value_name = "FILE")]
    pub explain: PathBuf,
}

/// `status` flags.
#[derive(Debug, Clone, Args)]
pub struct StatusArgs {
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `demo` flags.
#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// Directory of initdb, pg_ctl and postgres (default: `pg_config --bindir`, usual places).
    #[arg(long, value_name = "DIR")]
    pub pg_bin: Option<PathBuf>,
    /// Orders (each with its outbox event) committed per second.
    #[arg(long, default_value_t = 2.0)]
    pub rate: f64,
    /// Stop after this long (e.g. 30s); without it, run until Ctrl-C.
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
}

/// `peek` flags.
#[derive(Debug, Clone, Args)]
pub struct PeekArgs {
    /// One JSON object per record instead of text.
    #[arg(long)]
    pub json: bool,
    /// Show at most this many records.
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
}

/// `setup` flags.
#[derive(Debug, Clone, Args)]
pub struct SetupArgs {
    /// Print the SQL instead of running it (does not connect).
    #[arg(long)]
    pub print: bool,
}

/// `drop-slot` flags.
#[derive(Debug, Clone, Args)]
pub struct DropSlotArgs {
    /// Confirms that the slot's position may be discarded.
    #[arg(long = "yes-i-know")]
    pub yes_i_know: bool,
    /// Also drop the publication.
    #[arg(long)]
    pub drop_publication: bool,
}

impl Cli {
    /// Parses `args` with a `--debezium-config` file's flags as defaults, and returns the import's
    /// warnings; help and usage errors exit as clap does.
    pub fn parse_global_from(args: Vec<OsString>) -> Result<(Cli, Vec<String>), ImportError> {
        let parse = |imported: &Imported| {
            Self::try_parse_with(imported, &args).unwrap_or_else(|e| e.exit())
        };
        let cli = parse(&Imported::default());
        let explain = matches!(cli.command, Some(Command::DebeziumConfig(_)));
        let Some(path) = cli.debezium_config.as_deref().filter(|_| !explain) else {
            return Ok((cli, Vec::new()));
        };
        let imported = debezium::import_file(path, cli.debezium_worker_config.as_deref())?;
        Ok((parse(&imported), imported.warnings))
    }

    /// Parses `args` (the first is the program name).
    pub fn try_parse_global_from(
        args: impl IntoIterator<Item = impl Into<OsString> + Clone>,
    ) -> Result<Cli, clap::Error> {
        Self::try_parse_with(&Imported::default(), args)
    }

    /// Parses with every top-level flag made global and `imported`'s values as its defaults,
    /// below the command line and the environment; a repeatable flag given explicitly replaces
    /// every imported value.
    pub(super) fn try_parse_with(
        imported: &Imported,
        args: impl IntoIterator<Item = impl Into<OsString> + Clone>,
    ) -> Result<Cli, clap::Error> {
        let mut cmd = Cli::command().mut_args(|arg| {
            let named = |(flag, _): &&(String, String)| {
                let name = flag.trim_start_matches('-');
                arg.get_long() == Some(name)
                    || arg.get_short().is_some_and(|s| name == s.to_string())
            };
            let values: Vec<&String> = imported.args.iter().filter(named).map(|(_, v)| v).collect();
            let arg = arg.global(true);
            if values.is_empty() {
                arg
            } else {
                arg.default_values(values)
            }
        });
        let matches = cmd.try_get_matches_from_mut(args)?;
        Cli::from_arg_matches(&matches).map_err(|e| e.format(&mut cmd))
    }

    /// The `--table` names, validated as [`Config::from_cli`](super::Config::from_cli) does
    /// but without a `--postgres-url`, which `setup --print` does without.
    pub fn outbox_tables(&self) -> Result<Vec<TableName>, ConfigError> {
        Ok(parse_tables(self)?.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn parse(args: &[&str]) -> Cli {
        Cli::try_parse_global_from(std::iter::once("outbox-relay").chain(args.iter().copied()))
            .unwrap()
    }

    #[test]
    fn setup_reads_tables_like_the_relay() {
        let cli = parse(&[
            "setup",
            "--print",
            "--table",
            "billing.outbox:key-column=a",
            "--table",
            "public.outbox",
        ]);
        assert_eq!(
            cli.outbox_tables().unwrap(),
            vec![
                TableName::parse("billing.outbox").unwrap(),
                TableName::parse("public.outbox").unwrap()
            ]
        );
        let cli = parse(&["setup", "--table", "none", "--message-prefix", "outbox"]);
        assert!(cli.outbox_tables().unwrap().is_empty());
    }

    #[test]
    fn relay_flags_work_before_and_after_a_subcommand() {
        let cli = parse(&["status", "--postgres-url", "postgres://u@h/db", "--json"]);
        assert!(matches!(
            cli.command,
            Some(Command::Status(StatusArgs { json: true }))
        ));
        assert_eq!(
            cli.postgres_url
                .as_ref()
                .map(secrecy::ExposeSecret::expose_secret),
            Some("postgres://u@h/db")
        );
        let cli = parse(&["--slot", "s1", "drop-slot", "--yes-i-know"]);
        assert_eq!(cli.flags.slot, "s1");
        assert!(matches!(
            cli.command,
            Some(Command::DropSlot(DropSlotArgs {
                yes_i_know: true,
                drop_publication: false
            }))
        ));
        let cli = parse(&["setup", "--print", "--table", "a.outbox", "--slot", "x"]);
        assert_eq!(cli.flags.slot, "x");
        assert!(cli.command.is_some());
    }

    #[test]
    fn kafka_brokers_are_required_by_the_commands_that_use_kafka() {
        let url = "postgres://u@127.0.0.1/db";
        for command in [
            &[][..],
            &["setup"],
            &["drop-slot"],
            &["backfill", "--since", "x"],
            &["reshard", "--from", "1", "--to", "2"],
        ] {
            let args = [command, &["--postgres-url", url]].concat();
            let err = Config::from_cli(&parse(&args)).unwrap_err().to_string();
            assert!(err.contains("--kafka-brokers"), "{command:?}: {err}");
        }
        let config = Config::from_cli(&parse(&["status", "--postgres-url", url])).unwrap();
        assert_eq!(config.kafka_brokers, "");
        let err = Config::from_cli(&parse(&["status"]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("--postgres-url"), "{err}");
    }

    #[test]
    fn setup_target_needs_no_url() {
        let cli = parse(&["setup", "--print"]);
        assert_eq!(cli.flags.slot, "outbox_relay");
        assert_eq!(
            cli.outbox_tables().unwrap(),
            vec![TableName::parse("public.outbox").unwrap()]
        );
        let bad = ["outbox-relay", "setup", "--slot", "Bad"];
        assert!(Cli::try_parse_global_from(bad).is_err());
    }
}
