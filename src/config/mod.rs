//! Command-line flags (each also read from `OUTBOX_RELAY_<NAME>`) and the validated [`Config`]
//! they become. Every mistake is caught before any connection is opened, with a message naming
//! the flag: clap checks single values while parsing, [`Config::from_cli`] the rest.

mod cloud;
mod commands;
pub mod debezium;
mod format;
pub mod heading;
mod kafka;
mod mapping;
mod observability;
mod postgres;
mod registry;
mod tables;

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::builder::RangedU64ValueParser;
use clap::{Args, Parser, ValueEnum};
use secrecy::{ExposeSecret, SecretString};

pub use crate::observability::LogFormat;
pub use cloud::{CloudArgs, KafkaAuthMode, PostgresAuthMode};
pub use commands::{
    BackfillArgs, Command, DebeziumConfigArgs, DemoArgs, DropSlotArgs, PeekArgs, ReshardArgs,
    SetupArgs, StatusArgs,
};
pub use format::FormatArgs;
pub use kafka::{KafkaProperties, KafkaProperty, is_sensitive_property};
pub use observability::{ObservabilityArgs, ReadinessArgs};
pub use postgres::{PostgresConnInfo, PostgresUrlError, SslMode, TargetSessionAttrs};
pub use registry::{RegistryArgs, SchemaRegistryConfig};

pub use mapping::PerTable;
use tables::parse_tables;
pub use tables::per_table_flags;

use crate::cloud::KafkaAuth;
use crate::outbox::{EventMapper, HeaderColumn, MappingConfig, Shard, TableName};

/// Relays transactional-outbox rows from Postgres logical replication to Kafka.
///
/// Every committed insert into an outbox table becomes one Kafka record, routed to a topic by its
/// event type (like Debezium's Outbox Event Router). The replication slot moves only past events
/// the broker has acknowledged, so a crash or restart never loses an event. Every flag is
/// described in docs/configuration.md.
#[derive(Debug, Clone, Parser)]
#[command(name = "outbox-relay", version, about, long_about)]
pub struct Cli {
    /// Postgres URL, libpq style: postgres://USER:PASSWORD@HOST:PORT/DB?sslmode=require. Required.
    #[arg(help_heading = heading::SOURCE)]
    #[arg(long, env = "OUTBOX_RELAY_POSTGRES_URL", hide_env_values = true)]
    pub postgres_url: Option<SecretString>,
    /// Postgres password; overrides the file and the URL (prefer the env var: `ps` shows flags).
    #[arg(help_heading = heading::SOURCE)]
    #[arg(long, env = "OUTBOX_RELAY_POSTGRES_PASSWORD", hide_env_values = true)]
    pub postgres_password: Option<SecretString>,
    /// File holding the Postgres password (e.g. a mounted secret), overriding the URL's password.
    #[arg(help_heading = heading::SOURCE)]
    #[arg(long, env = "OUTBOX_RELAY_POSTGRES_PASSWORD_FILE", value_name = "PATH")]
    pub postgres_password_file: Option<PathBuf>,
    /// Kafka bootstrap servers, comma separated (host:port,...). Required to run the relay.
    #[arg(help_heading = heading::SOURCE)]
    #[arg(long, env = "OUTBOX_RELAY_KAFKA_BROKERS")]
    pub kafka_brokers: Option<String>,

    /// Outbox table as SCHEMA.TABLE, repeatable; `none` for none. This table's values of the
    /// flags under "Mapping, also per table" follow a colon, named without their dashes:
    /// 'billing.outbox:topic-template=billing.${event_type};key-column=account_id'.
    #[arg(long = "table", env = "OUTBOX_RELAY_TABLE")]
    #[arg(help_heading = heading::SOURCE)]
    #[arg(value_delimiter = ',', default_value = "public.outbox")]
    pub tables: Vec<String>,
    /// Prefix of transactional logical decoding messages carrying outbox events. Repeatable.
    #[arg(long = "message-prefix", env = "OUTBOX_RELAY_MESSAGE_PREFIX")]
    #[arg(help_heading = heading::SOURCE)]
    #[arg(value_delimiter = ',')]
    pub message_prefixes: Vec<String>,

    /// The flags a `--table` may set for its own table.
    #[command(flatten)]
    pub mapping: PerTable,
    /// Extra column copied into a record header, as COLUMN or COLUMN:HEADER. Repeatable.
    #[arg(long = "header-column", env = "OUTBOX_RELAY_HEADER_COLUMN")]
    #[arg(help_heading = heading::EVERY_TABLE)]
    #[arg(value_delimiter = ',')]
    pub header_columns: Vec<String>,
    /// Debezium record-format flags.
    #[command(flatten, next_help_heading = heading::DEBEZIUM_FORMAT)]
    pub format: FormatArgs,
    /// Schema Registry flags (the avro and protobuf converters').
    #[command(flatten, next_help_heading = heading::SCHEMA_REGISTRY)]
    pub registry: RegistryArgs,
    /// Add the CloudEvents Kafka binding's binary-mode headers (ce_id, ce_type, ce_source...).
    #[arg(help_heading = heading::EVERY_TABLE)]
    #[arg(long, env = "OUTBOX_RELAY_CLOUDEVENTS")]
    pub cloudevents: bool,
    /// ce_source of every event with --cloudevents (default: /DATABASE/SCHEMA/TABLE).
    #[arg(long, env = "OUTBOX_RELAY_CLOUDEVENTS_SOURCE")]
    #[arg(help_heading = heading::EVERY_TABLE)]
    #[arg(requires = "cloudevents")]
    pub cloudevents_source: Option<String>,
    /// librdkafka producer property KEY=VALUE (e.g. -X security.protocol=SASL_SSL). Repeatable.
    #[arg(short = 'X', long = "kafka-property", value_delimiter = ';')]
    #[arg(help_heading = heading::KAFKA)]
    #[arg(env = "OUTBOX_RELAY_KAFKA_PROPERTY", hide_env_values = true)]
    pub kafka_properties: Vec<KafkaProperty>,
    /// AWS IAM for Kafka and Postgres.
    #[command(flatten, next_help_heading = heading::CLOUD)]
    pub cloud: CloudArgs,
    /// What to do with an event that cannot be delivered (NULL id, bad topic, too large...).
    #[arg(help_heading = heading::KAFKA)]
    #[arg(long, env = "OUTBOX_RELAY_ON_POISON", value_enum, default_value_t = PoisonPolicy::Fail)]
    pub on_poison: PoisonPolicy,
    /// Topic for dead-lettered events (required with --on-poison dead-letter).
    #[arg(help_heading = heading::KAFKA)]
    #[arg(long, env = "OUTBOX_RELAY_DEAD_LETTER_TOPIC", value_parser = topic_name)]
    pub dead_letter_topic: Option<String>,
    /// Log line format.
    #[arg(help_heading = heading::OBSERVABILITY)]
    #[arg(long, env = "OUTBOX_RELAY_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// A Debezium connector configuration (JSON or .properties) whose settings become defaults.
    #[arg(help_heading = heading::SOURCE)]
    #[arg(long, env = "OUTBOX_RELAY_DEBEZIUM_CONFIG", value_name = "FILE")]
    pub debezium_config: Option<PathBuf>,
    /// The Kafka Connect worker's properties, whose converters apply where the connector config
    /// names none (default: Kafka's sample worker config, JsonConverter with schemas).
    #[arg(help_heading = heading::SOURCE)]
    #[arg(long, env = "OUTBOX_RELAY_DEBEZIUM_WORKER_CONFIG", value_name = "FILE")]
    pub debezium_worker_config: Option<PathBuf>,
    /// Log filter: a level (info, debug) or a tracing filter (outbox_relay=debug,librdkafka=warn).
    #[arg(help_heading = heading::OBSERVABILITY)]
    #[arg(long, env = "OUTBOX_RELAY_LOG_LEVEL", default_value = "info")]
    pub log_level: String,
    /// Slot, delivery and observability flags (each in its group of `--help`).
    #[command(flatten)]
    pub flags: RelayFlags,

    /// An operator command; without one, the relay runs.
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// The flags the relay uses as given, so that [`Config`] keeps them whole instead of copying them.
#[derive(Debug, Clone, Args)]
pub struct RelayFlags {
    /// Logical replication slot to stream from (created with pgoutput if missing).
    #[arg(help_heading = heading::SOURCE)]
    #[arg(long, env = "OUTBOX_RELAY_SLOT", default_value = "outbox_relay", value_parser = slot_name)]
    pub slot: String,
    /// Create the slot with FAILOVER true (or alter it), so that a failover loses nothing. PG 17+.
    #[arg(help_heading = heading::SOURCE)]
    #[arg(long, env = "OUTBOX_RELAY_SLOT_FAILOVER")]
    pub slot_failover: bool,
    /// Create the slot even where this relay streamed before (then `backfill` what it missed).
    #[arg(help_heading = heading::SOURCE)]
    #[arg(long, env = "OUTBOX_RELAY_ALLOW_NEW_SLOT")]
    pub allow_new_slot: bool,
    /// Kafka topic recording which slots the relay created, so a lost slot is refused (compacted).
    #[arg(help_heading = heading::SOURCE)]
    #[arg(long, env = "OUTBOX_RELAY_LINEAGE_TOPIC", default_value = "outbox-relay.lineage", value_parser = topic_name)]
    pub lineage_topic: String,
    /// Publication to stream (created FOR TABLE the outbox tables, inserts only, if missing).
    #[arg(help_heading = heading::SOURCE)]
    #[arg(long, env = "OUTBOX_RELAY_PUBLICATION", default_value = "outbox_relay", value_parser = publication_name)]
    pub publication: String,
    /// Relay shard I of K: only events whose key hashes to I, on the shard's own slot and
    /// publication (--slot and --publication + `_shard_I_of_K`). PostgreSQL 15+.
    #[arg(help_heading = heading::SOURCE)]
    #[arg(long, env = "OUTBOX_RELAY_SHARD", value_name = "I/K")]
    pub shard: Option<Shard>,

    /// On SIGINT/SIGTERM, how long to read to the open commit and wait for in-flight deliveries.
    #[arg(help_heading = heading::KAFKA)]
    #[arg(long, env = "OUTBOX_RELAY_SHUTDOWN_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub shutdown_timeout: Duration,
    /// How often the acknowledged position is reported to Postgres.
    #[arg(help_heading = heading::KAFKA)]
    #[arg(long, env = "OUTBOX_RELAY_STATUS_INTERVAL", default_value = "100ms", value_parser = positive_duration)]
    pub status_interval: Duration,
    /// Most events sent to Kafka but not yet acknowledged (under `--cleanup delete`, also most
    /// outbox rows waiting to be deleted); reading the WAL pauses there.
    #[arg(help_heading = heading::KAFKA)]
    #[arg(long, env = "OUTBOX_RELAY_MAX_IN_FLIGHT_EVENTS", default_value_t = 50_000, value_parser = at_least(1))]
    pub max_in_flight_events: usize,
    /// Most payload+key bytes sent to Kafka but not yet acknowledged.
    #[arg(help_heading = heading::KAFKA)]
    #[arg(long, env = "OUTBOX_RELAY_MAX_IN_FLIGHT_BYTES", default_value_t = 16 * 1024 * 1024, value_parser = at_least(1024))]
    pub max_in_flight_bytes: usize,
    /// Delivery guarantee.
    #[arg(help_heading = heading::KAFKA)]
    #[arg(long, env = "OUTBOX_RELAY_DELIVERY", value_enum, default_value_t = Delivery::AtLeastOnce)]
    pub delivery: Delivery,
    /// With --delivery exactly-once, what to do when a partition's tail cannot prove what was sent.
    #[arg(help_heading = heading::KAFKA)]
    #[arg(long, env = "OUTBOX_RELAY_EXACTLY_ONCE_FALLBACK", value_enum, default_value_t = ExactlyOnceFallback::Fail)]
    pub exactly_once_fallback: ExactlyOnceFallback,
    /// Write a logical decoding message this often, so the slot advances on an idle database.
    #[arg(help_heading = heading::SOURCE)]
    #[arg(long, env = "OUTBOX_RELAY_HEARTBEAT_INTERVAL", value_parser = parse_duration)]
    pub heartbeat_interval: Option<Duration>,
    /// First wait before reconnecting to Postgres after the stream broke, or before start-up
    /// tries again while Postgres or Kafka does not answer; doubles per attempt.
    #[arg(help_heading = heading::KAFKA)]
    #[arg(long, env = "OUTBOX_RELAY_RECONNECT_BACKOFF_MIN", default_value = "500ms", value_parser = positive_duration)]
    pub reconnect_backoff_min: Duration,
    /// Longest wait between reconnect (and start-up) attempts; also the standby's polling
    /// interval.
    #[arg(help_heading = heading::KAFKA)]
    #[arg(long, env = "OUTBOX_RELAY_RECONNECT_BACKOFF_MAX", default_value = "30s", value_parser = parse_duration)]
    pub reconnect_backoff_max: Duration,
    /// What happens to outbox rows once the broker has acknowledged their events.
    #[arg(help_heading = heading::SOURCE)]
    #[arg(long, env = "OUTBOX_RELAY_CLEANUP", value_enum, default_value_t = Cleanup::None)]
    pub cleanup: Cleanup,
    /// Metrics, health and slot monitoring flags.
    #[command(flatten, next_help_heading = heading::OBSERVABILITY)]
    pub observability: ObservabilityArgs,
}

impl RelayFlags {
    /// The flags with `--slot` and `--publication` named for `--shard` (as given without one),
    /// as every command uses them.
    pub fn sharded(&self) -> Result<RelayFlags, ConfigError> {
        let Some(shard) = self.shard else {
            return Ok(self.clone());
        };
        let name = |flag, base: &str, valid: fn(&str) -> Result<String, &'static str>| {
            valid(&shard.name(base)).map_err(|_| {
                let reason = format!(
                    "{flag} {base:?} with the shard's suffix {:?} is over 63 characters; use a \
                     shorter {flag}",
                    shard.name("")
                );
                invalid("--shard", shard.to_string(), reason)
            })
        };
        let mut flags = self.clone();
        flags.slot = name("--slot", &self.slot, slot_name)?;
        flags.publication = name("--publication", &self.publication, publication_name)?;
        Ok(flags)
    }
}

/// The delivery guarantee.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Delivery {
    /// Every event at least once; duplicates only for unacknowledged transactions after a restart.
    AtLeastOnce,
    /// Every event exactly once in Kafka, deduplicated against each partition's tail.
    ExactlyOnce,
}

/// What exactly-once does when a partition's tail proves nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ExactlyOnceFallback {
    /// Stop with an error explaining why.
    Fail,
    /// Continue that partition at-least-once, with a warning.
    AtLeastOnce,
}

/// What happens to relayed outbox rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Cleanup {
    /// Leave them; the application deletes them (see docs/operations.md, Cleaning the outbox).
    None,
    /// Delete them by primary key once the broker has acknowledged their events; a row whose
    /// event was dead-lettered without its payload stays.
    Delete,
}

/// What happens to an event that can never be delivered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PoisonPolicy {
    /// Stop before acknowledging it; exit non-zero.
    Fail,
    /// Produce it to --dead-letter-topic, then acknowledge as usual.
    DeadLetter,
}

/// `--postgres-url` with the password the flags give, if any.
fn postgres_conn_info(cli: &Cli) -> Result<PostgresConnInfo, ConfigError> {
    let Some(url) = &cli.postgres_url else {
        let reason = "required (or set OUTBOX_RELAY_POSTGRES_URL)";
        return Err(invalid("--postgres-url", "", reason));
    };
    let mut postgres = PostgresConnInfo::parse(url.expose_secret())?;
    // Precedence: --postgres-password > --postgres-password-file > the URL's password.
    if let Some(password) = &cli.postgres_password {
        postgres.password = Some(password.expose_secret().to_owned());
    } else if let Some(path) = &cli.postgres_password_file {
        postgres.password = Some(read_password_file(path)?);
    }
    Ok(postgres)
}

/// `--kafka-brokers`, required by the subcommands that use Kafka.
fn kafka_brokers(cli: &Cli) -> Result<&str, ConfigError> {
    let kafka_brokers = cli.kafka_brokers.as_deref().unwrap_or_default().trim();
    // `setup`, `drop-slot` and `reshard` record slots in the lineage topic.
    let uses_kafka = match &cli.command {
        None | Some(Command::DropSlot(_) | Command::Backfill(_) | Command::Reshard(_)) => true,
        // `setup --print` connects only to read a shard's column types.
        Some(Command::Setup(args)) => !args.print,
        Some(_) => false,
    };
    if kafka_brokers.is_empty() && uses_kafka {
        let reason = "give at least one host:port (the relay, setup, drop-slot, reshard and \
                      backfill use Kafka: setup, drop-slot and reshard record slots in \
                      --lineage-topic)";
        return Err(invalid("--kafka-brokers", "", reason));
    }
    Ok(kafka_brokers)
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (examples: 30s, 500ms, 2m)"))
}

/// A duration where zero would spin.
fn positive_duration(s: &str) -> Result<Duration, String> {
    let positive = Some(parse_duration(s)?).filter(|d| !d.is_zero());
    positive.ok_or_else(|| "must be positive".to_owned())
}

fn at_least(min: u64) -> RangedU64ValueParser<usize> {
    RangedU64ValueParser::new().range(min..)
}

/// Postgres restricts slot names to `[a-z0-9_]{1,63}`.
fn slot_name(name: &str) -> Result<String, &'static str> {
    let allowed = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_';
    match !name.is_empty() && name.len() <= 63 && name.chars().all(allowed) {
        true => Ok(name.to_owned()),
        false => Err("use lower-case letters, digits and underscores (at most 63)"),
    }
}

/// A publication name goes into replication commands unquoted: an unquoted identifier.
fn publication_name(name: &str) -> Result<String, &'static str> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || c == '_';
    match !name.is_empty() && name.len() <= 63 && name.chars().all(allowed) {
        true => Ok(name.to_owned()),
        false => Err("use letters, digits and underscores (at most 63)"),
    }
}

fn topic_name(topic: &str) -> Result<String, &'static str> {
    crate::outbox::check_topic_name(topic).map(|()| topic.to_owned())
}

/// A flag value that cannot work, found before connecting anywhere.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The Postgres URL is unusable.
    #[error(transparent)]
    PostgresUrl(#[from] PostgresUrlError),
    /// `--postgres-password-file` cannot be read; only its path is shown.
    #[error(
        "--postgres-password-file {}: cannot read it; check the path and that the relay's user \
         may read the file",
        path.display()
    )]
    PasswordFile {
        /// The file.
        path: PathBuf,
        /// Why it cannot be read.
        #[source]
        source: std::io::Error,
    },
    /// A flag has a value the relay cannot use.
    #[error("{flag} {value:?}: {reason}")]
    Invalid {
        /// The flag, e.g. `--table`.
        flag: &'static str,
        /// The value given (never a secret).
        value: String,
        /// What is wrong and what would work.
        reason: String,
    },
}

fn invalid(flag: &'static str, value: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        flag,
        value: value.into(),
        reason: reason.into(),
    }
}

/// The relay's settings: what validation builds from the flags, plus [`RelayFlags`] as given.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where Postgres is.
    pub postgres: PostgresConnInfo,
    /// Kafka bootstrap servers; empty for a subcommand that needs none.
    pub kafka_brokers: String,
    /// Outbox tables, in flag order.
    pub tables: Vec<TableName>,
    /// Prefixes of logical decoding messages carrying outbox events.
    pub message_prefixes: Vec<String>,
    /// How rows become records.
    pub mapping: MappingConfig,
    /// Tables whose mapping differs from [`Config::mapping`] (per-table overrides).
    pub table_mappings: Vec<(TableName, MappingConfig)>,
    /// librdkafka properties given with `-X`, in order.
    pub kafka_properties: KafkaProperties,
    /// How Kafka clients log in beyond the `-X` properties (`--kafka-auth`).
    pub kafka_auth: KafkaAuth,
    /// Dead-letter topic when poison events are diverted; `None` means stop on them.
    pub dead_letter_topic: Option<String>,
    /// The flags used as given.
    pub flags: RelayFlags,
    /// The Schema Registry, when a converter writes through one.
    pub schema_registry: Option<SchemaRegistryConfig>,
}

impl Config {
    /// Validates raw flags into a config.
    pub fn from_cli(cli: &Cli) -> Result<Self, ConfigError> {
        let mut postgres = postgres_conn_info(cli)?;
        let kafka_brokers = kafka_brokers(cli)?;
        let flags = cli.flags.sharded()?;
        if flags.reconnect_backoff_max < flags.reconnect_backoff_min {
            let max = humantime::format_duration(flags.reconnect_backoff_max).to_string();
            let reason = "must be at least --reconnect-backoff-min";
            return Err(invalid("--reconnect-backoff-max", max, reason));
        }
        let dead_letter = cli.on_poison == PoisonPolicy::DeadLetter;
        if dead_letter && cli.dead_letter_topic.is_none() {
            let reason = "required with --on-poison dead-letter";
            return Err(invalid("--dead-letter-topic", "", reason));
        }
        let mapping = mapping::mapping(cli, &postgres)?;
        let registered = mapping.connect.as_ref().is_some_and(|c| c.uses_registry());
        let schema_registry = cli.registry.client(registered)?;
        let (tables, table_overrides) = parse_tables(cli)?;
        let table_mappings = mapping::table_mappings(cli, table_overrides, &mapping)?;
        let mappings = std::iter::once(&mapping).chain(table_mappings.iter().map(|(_, m)| m));
        mapping::refuse_partition_column_with_exactly_once(flags.delivery, mappings)?;
        let kafka_properties = cli.kafka_properties.iter().map(KafkaProperty::pair);
        let kafka_properties = KafkaProperties(kafka_properties.collect::<Result<_, _>>()?);
        let kafka_auth = cloud::auth(&cli.cloud, &mut postgres, kafka_brokers, &kafka_properties)?;
        let message_prefixes = cli.message_prefixes.iter().filter(|p| !p.is_empty());
        Ok(Config {
            postgres,
            kafka_brokers: kafka_brokers.to_owned(),
            tables,
            message_prefixes: message_prefixes.cloned().collect(),
            mapping,
            table_mappings,
            kafka_properties,
            kafka_auth,
            dead_letter_topic: cli.dead_letter_topic.clone().filter(|_| dead_letter),
            flags,
            schema_registry,
        })
    }

    /// The mapper for these tables and message prefixes: what the relay and `peek` map with.
    pub fn event_mapper(&self) -> EventMapper {
        let table = |t: &TableName| (t.clone(), self.mapping_for(t).clone());
        let prefix = |p: &String| (p.clone(), self.mapping.clone());
        let tables = self.tables.iter().map(table).collect();
        let messages = self.message_prefixes.iter().map(prefix).collect();
        EventMapper::new(tables, messages).sharded(self.flags.shard)
    }

    /// This configuration of one relay of the same outbox as `shard` (`None`: the one
    /// unsharded relay), named from the flags' `--slot` and `--publication`, as `reshard`
    /// addresses old and new shards; refused for a configuration already sharded.
    pub fn with_shard(&self, shard: Option<Shard>) -> Result<Config, ConfigError> {
        if let Some(given) = self.flags.shard {
            let reason = "names a relay; this command addresses every shard itself: drop --shard";
            return Err(invalid("--shard", given.to_string(), reason));
        }
        let mut config = self.clone();
        let mut flags = self.flags.clone();
        flags.shard = shard;
        config.flags = flags.sharded()?;
        Ok(config)
    }

    /// The mapping for one outbox table: its overrides, else the global flags.
    pub fn mapping_for(&self, table: &TableName) -> &MappingConfig {
        let overridden = self.table_mappings.iter().rev().find(|(t, _)| t == table);
        overridden.map_or(&self.mapping, |(_, m)| m)
    }
}

/// The `--header-column` or `--envelope-column` values.
fn columns(flag: &'static str, raw: &[String]) -> Result<Vec<HeaderColumn>, ConfigError> {
    let parse = |raw: &String| HeaderColumn::parse(raw).map_err(|why| invalid(flag, raw, why));
    raw.iter().map(parse).collect()
}

/// The password in `path`, without one trailing newline (`\n` or `\r\n`), as
/// `echo secret > file` and most secret mounts leave it.
fn read_password_file(path: &Path) -> Result<String, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::PasswordFile {
        path: path.to_owned(),
        source,
    })?;
    let line = text.strip_suffix('\n');
    let password = line.map_or(&*text, |line| line.strip_suffix('\r').unwrap_or(line));
    if password.is_empty() {
        let reason = "the file is empty; write the password into it";
        let shown = path.display().to_string();
        return Err(invalid("--postgres-password-file", shown, reason));
    }
    Ok(password.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cli(extra: &[&str]) -> Result<Config, ConfigError> {
        let mut args = vec![
            "outbox-relay",
            "--postgres-url",
            "postgres://relay:pw@127.0.0.1:5432/app",
            "--kafka-brokers",
            "127.0.0.1:9092",
        ];
        args.extend_from_slice(extra);
        let cli = Cli::try_parse_from(args).unwrap();
        Config::from_cli(&cli)
    }

    /// The error, from clap or from `Config::from_cli`, for these extra flags.
    fn rejected(extra: &[&str]) -> String {
        let head = [
            "outbox-relay",
            "--postgres-url",
            "postgres://u@h/d",
            "--kafka-brokers",
            "k:1",
        ];
        match Cli::try_parse_from(head.iter().chain(extra)) {
            Ok(cli) => Config::from_cli(&cli).unwrap_err().to_string(),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn defaults_match_the_common_outbox_schema() {
        let config = cli(&[]).unwrap();
        assert_eq!(
            config.tables,
            vec![TableName::parse("public.outbox").unwrap()]
        );
        assert_eq!(config.flags.slot, "outbox_relay");
        assert_eq!(config.flags.publication, "outbox_relay");
        assert_eq!(config.mapping.route_by, "event_type");
        assert_eq!(config.mapping.key_column, "aggregate_id");
        assert_eq!(config.mapping.id_column, "id");
        assert_eq!(config.mapping.payload_column, "payload");
        assert_eq!(config.mapping.timestamp_column, None);
        assert_eq!(config.flags.shutdown_timeout, Duration::from_secs(30));
    }

    #[test]
    fn repeatable_flags_accumulate() {
        let config = cli(&[
            "--table",
            "a.outbox",
            "--table",
            "outbox2",
            "-X",
            "linger.ms=5",
            "--kafka-property",
            "compression.type=zstd",
            "--header-column",
            "aggregate_type:type",
            "--header-column",
            "event_type",
        ])
        .unwrap();
        assert_eq!(config.tables.len(), 2);
        assert_eq!(config.tables[1].schema, "public");
        assert_eq!(
            config.kafka_properties.to_vec(),
            vec![
                ("linger.ms".to_owned(), "5".to_owned()),
                ("compression.type".to_owned(), "zstd".to_owned())
            ]
        );
        assert_eq!(config.mapping.header_columns[0].header, "type");
        assert_eq!(config.mapping.header_columns[1].header, "event_type");
    }

    #[test]
    fn per_table_overrides_replace_the_global_mapping_for_that_table() {
        let config = cli(&[
            "--table",
            "public.outbox",
            "--table",
            "billing.outbox:topic-template=billing.${event_type};key-column=account_id",
            "--route-by",
            "kind",
        ])
        .unwrap();
        let billing = TableName::parse("billing.outbox").unwrap();
        let public = TableName::parse("public.outbox").unwrap();
        assert_eq!(config.tables, vec![public.clone(), billing.clone()]);
        let m = config.mapping_for(&billing);
        assert_eq!(m.key_column, "account_id");
        assert_eq!(m.route_by, "kind", "unset keys inherit the global flags");
        assert_eq!(
            m.topic_template,
            crate::outbox::TopicTemplate::parse("billing.${event_type}").unwrap()
        );
        assert_eq!(config.mapping_for(&public).key_column, "aggregate_id");
        let err = cli(&["--table", "a.b:colour=red"]).unwrap_err().to_string();
        assert!(err.contains("unknown override"), "{err}");
        let err = cli(&["--table", "a.b:key-column"]).unwrap_err().to_string();
        assert!(err.contains("KEY=VALUE"), "{err}");
    }

    #[test]
    fn every_per_table_flag_is_a_table_key_parsed_as_the_flag_is() {
        let table = TableName::parse("billing.outbox").unwrap();
        let keys: Vec<String> = per_table_flags()
            .iter()
            .filter_map(|flag| flag.get_long().map(str::to_owned))
            .collect();
        assert_eq!(keys.len(), 6, "{keys:?}");
        let grouped: Vec<String> = (<Cli as clap::CommandFactory>::command().get_arguments())
            .filter(|flag| flag.get_help_heading() == Some(heading::PER_TABLE))
            .filter_map(|flag| flag.get_long().map(str::to_owned))
            .collect();
        assert_eq!(
            grouped, keys,
            "--help groups exactly the table keys as per table"
        );
        for key in &keys {
            let given = format!("billing.outbox:{key}=other_column");
            let config = cli(&["--table", &given]).unwrap();
            assert_ne!(
                config.mapping_for(&table),
                &config.mapping,
                "{key} changes nothing"
            );
        }
        // (overrides, what the error says; None: accepted)
        let cases: [(&str, Option<&str>); 6] = [
            ("topic-template=billing.${event_type", Some("closed by `}`")),
            ("key-column=-dash", None),
            ("key-column=a;key-column=b", None),
            ("route-by=kind ; ", None),
            (
                "header-column=x",
                Some("unknown override \"header-column\""),
            ),
            ("timestamp-column=", Some("KEY=VALUE")),
        ];
        for (overrides, error) in cases {
            let given = format!("billing.outbox:{overrides}");
            let result = cli(&["--table", &given]);
            match (result, error) {
                (Ok(_), None) => {}
                (Err(e), Some(needle)) => {
                    let e = e.to_string();
                    assert!(
                        e.contains(needle) && e.contains("--table"),
                        "{overrides}: {e}"
                    );
                }
                (result, _) => panic!("{overrides}: {result:?}"),
            }
        }
        let config = cli(&["--table", "billing.outbox:key-column=a;key-column=b"]).unwrap();
        assert_eq!(
            config.mapping_for(&table).key_column,
            "b",
            "the last one wins"
        );
    }

    /// Issue 32: the column's partition was silently overridden by exactly-once.
    #[test]
    fn a_partition_column_with_exactly_once_is_refused_by_name() {
        // (flags, refused)
        let table: [(&[&str], bool); 4] = [
            (
                &["--partition-column", "p", "--delivery", "exactly-once"],
                true,
            ),
            (&["--partition-column", "p"], false),
            (&["--delivery", "exactly-once"], false),
            (
                &["--partition-column", "p", "--delivery", "at-least-once"],
                false,
            ),
        ];
        for (flags, refused) in table {
            let result = cli(flags);
            assert_eq!(result.is_err(), refused, "{flags:?}: {:?}", result.err());
            if let Err(e) = result {
                let text = e.to_string();
                assert!(
                    text.contains("--partition-column") && text.contains("exactly-once"),
                    "{text}"
                );
            }
        }
    }

    #[test]
    fn a_shard_has_its_own_slot_and_publication() {
        let config = cli(&["--shard", "1/4", "--slot", "orders"]).unwrap();
        assert_eq!(config.flags.shard, Some(Shard { index: 1, count: 4 }));
        assert_eq!(config.flags.slot, "orders_shard_1_of_4");
        assert_eq!(config.flags.publication, "outbox_relay_shard_1_of_4");
        assert_eq!(cli(&[]).unwrap().flags.slot, "outbox_relay");
        let long = "s".repeat(55);
        let err = rejected(&["--shard", "0/2", "--slot", &long]);
        assert!(
            err.contains("--shard") && err.contains("shorter --slot"),
            "{err}"
        );
        for bad in ["4/4", "0/1", "x"] {
            let err = rejected(&["--shard", bad]);
            assert!(err.contains("--shard"), "{bad}: {err}");
        }
        // `reshard` names every shard from the unsharded flags, and only from them.
        let base = cli(&["--slot", "orders"]).unwrap();
        let third = base.with_shard(Some(Shard { index: 2, count: 3 })).unwrap();
        assert_eq!(third.flags.slot, "orders_shard_2_of_3");
        assert_eq!(base.with_shard(None).unwrap().flags.slot, "orders");
        assert!(config.with_shard(None).is_err(), "already a shard");
    }

    #[test]
    fn message_prefixes_allow_a_table_less_outbox() {
        let config = cli(&["--table", "none", "--message-prefix", "outbox"]).unwrap();
        assert!(config.tables.is_empty());
        assert_eq!(config.message_prefixes, vec!["outbox".to_owned()]);
        let err = cli(&["--table", "none"]).unwrap_err().to_string();
        assert!(err.contains("--message-prefix"), "{err}");
    }

    #[test]
    fn bad_values_name_their_flag() {
        for (flag, extra) in [
            ("--slot", &["--slot", "Bad-Slot"][..]),
            ("KEY=VALUE", &["-X", "novalue"]),
            ("--topic-template", &["--topic-template", "x.${unclosed"]),
            ("--table", &["--table", "a.b.c"]),
            ("--dead-letter-topic", &["--on-poison", "dead-letter"]),
            (
                "--dead-letter-topic",
                &["--on-poison", "dead-letter", "--dead-letter-topic", "a b"],
            ),
            ("--route-by", &["--route-by", ""]),
            ("--http-addr", &["--http-addr", "nowhere"]),
            (
                "--reconnect-backoff",
                &[
                    "--reconnect-backoff-min",
                    "10s",
                    "--reconnect-backoff-max",
                    "1s",
                ],
            ),
        ] {
            let err = rejected(extra);
            assert!(err.contains(flag), "{extra:?}: {err}");
        }
        let ok = cli(&[
            "--on-poison",
            "dead-letter",
            "--dead-letter-topic",
            "outbox.dlq",
        ])
        .unwrap();
        assert_eq!(ok.dead_letter_topic.as_deref(), Some("outbox.dlq"));
    }

    #[test]
    fn debeziums_format_is_off_by_default_and_its_flags_name_what_they_need() {
        assert!(cli(&[]).unwrap().mapping.connect.is_none());
        let config = cli(&[
            "--key-converter",
            "json",
            "--debezium-context-headers",
            "--debezium-topic-prefix",
            "app",
        ])
        .unwrap();
        let connect = config.mapping.connect.unwrap();
        assert_eq!(connect.key, crate::outbox::connect::Converter::Json);
        assert!(connect.context_headers.is_some_and(|run| run.len() == 36));
        for (needle, extra) in [
            ("--value-converter", &["--expand-json-payload"][..]),
            (
                "--value-converter",
                &["--tombstone-on-empty-payload", "true"],
            ),
            (
                "--expand-json-payload",
                &["--value-converter", "json", "--keep-json-payload-nulls"],
            ),
            (
                "--debezium-topic-prefix",
                &["--key-converter", "string", "--debezium-context-headers"],
            ),
            (
                "--message-prefix",
                &["--key-converter", "string", "--message-prefix", "m"],
            ),
        ] {
            let err = rejected(extra);
            assert!(err.contains(needle), "{extra:?}: {err}");
        }
    }

    #[test]
    fn zero_intervals_and_tiny_caps_are_refused_while_parsing() {
        for (flag, value) in [
            ("--status-interval", "0s"),
            ("--reconnect-backoff-min", "0s"),
            ("--slot-poll-interval", "0s"),
            ("--ready-max-ack-staleness", "0s"),
            ("--max-in-flight-events", "0"),
            ("--max-in-flight-bytes", "1023"),
        ] {
            let args = [
                "outbox-relay",
                "--postgres-url",
                "postgres://u@h/d",
                flag,
                value,
            ];
            let err = Cli::try_parse_from(args).unwrap_err().to_string();
            assert!(err.contains(flag), "{flag}: {err}");
        }
    }

    fn password_file(contents: &str) -> tempfile::NamedTempFile {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), contents).unwrap();
        file
    }

    #[test]
    fn password_precedence_is_flag_then_file_then_url() {
        // The URL's password when nothing else is given.
        assert_eq!(cli(&[]).unwrap().postgres.password.as_deref(), Some("pw"));

        // The file overrides the URL; exactly one trailing newline is dropped.
        let file = password_file("from-file\n");
        let path = file.path().to_str().unwrap();
        let config = cli(&["--postgres-password-file", path]).unwrap();
        assert_eq!(config.postgres.password.as_deref(), Some("from-file"));
        for (contents, expected) in [
            ("crlf\r\n", "crlf"),
            ("none", "none"),
            ("two\n\n", "two\n"),
            (" spaced \n", " spaced "),
        ] {
            let file = password_file(contents);
            let config = cli(&["--postgres-password-file", file.path().to_str().unwrap()]).unwrap();
            assert_eq!(config.postgres.password.as_deref(), Some(expected));
        }

        // The flag (or its env var) overrides both.
        let config = cli(&[
            "--postgres-password-file",
            path,
            "--postgres-password",
            "from-flag",
        ])
        .unwrap();
        assert_eq!(config.postgres.password.as_deref(), Some("from-flag"));

        // Also with a URL that has no password.
        let cli = Cli::try_parse_from([
            "outbox-relay",
            "--postgres-url",
            "postgres://relay@127.0.0.1/app",
            "--kafka-brokers",
            "k:9092",
            "--postgres-password-file",
            path,
        ])
        .unwrap();
        let config = Config::from_cli(&cli).unwrap();
        assert_eq!(config.postgres.password.as_deref(), Some("from-file"));
    }

    #[test]
    fn password_flags_never_show_the_secret() {
        let cli = Cli::try_parse_from([
            "outbox-relay",
            "--postgres-url",
            "postgres://relay@127.0.0.1/app",
            "--kafka-brokers",
            "k:9092",
            "--postgres-password",
            "hunter2",
        ])
        .unwrap();
        assert!(!format!("{cli:?}").contains("hunter2"));
        let config = Config::from_cli(&cli).unwrap();
        assert!(!format!("{config:?}").contains("hunter2"));
    }

    #[test]
    fn debug_never_shows_url_or_kafka_secrets() {
        let cli = Cli::try_parse_from([
            "outbox-relay",
            "--postgres-url",
            "postgres://relay:pa/ss@127.0.0.1/app",
            "--kafka-brokers",
            "k:9092",
            "-X",
            "sasl.password=s1",
            "-X",
            "sasl.pasword=s2",
            "-X",
            "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule password=\"s3\"",
            "-X",
            "ssl.key.pem=s4",
            "-X",
            "ssl.keystore.password=s5",
            "-X",
            "sasl.oauthbearer.client.secret=s6",
            "-X",
            "linger.ms=5",
        ])
        .unwrap();
        let shown = format!("{cli:?}");
        for secret in ["pa/ss", "s1", "s2", "s3", "s4", "s5", "s6"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        assert!(
            shown.contains("sasl.pasword") && shown.contains("\"5\""),
            "{shown}"
        );
        let mut cli = cli;
        cli.postgres_url = Some("postgres://relay:hunter2@127.0.0.1/app".into());
        let shown = format!("{:?}", Config::from_cli(&cli).unwrap());
        for secret in ["hunter2", "s1", "s2", "s3", "s4", "s5", "s6"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        assert!(shown.contains("sasl.jaas.config"), "{shown}");
        cli.kafka_properties = "sasl.jaas.config=a;s7\""
            .split(';')
            .map(|p| p.to_owned().into())
            .collect();
        let err = Config::from_cli(&cli).unwrap_err().to_string();
        assert!(
            err.contains("--kafka-property") && !err.contains("s7"),
            "{err}"
        );
    }

    #[test]
    fn unreadable_or_empty_password_files_name_the_path_only() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing");
        let err = cli(&["--postgres-password-file", missing.to_str().unwrap()]).unwrap_err();
        assert!(matches!(err, ConfigError::PasswordFile { .. }), "{err:?}");
        let text = err.to_string();
        assert!(text.contains("--postgres-password-file"), "{text}");
        assert!(text.contains(missing.to_str().unwrap()), "{text}");

        // A directory is not readable as a file; its error must not quote content either.
        let err = cli(&["--postgres-password-file", dir.path().to_str().unwrap()]).unwrap_err();
        assert!(matches!(err, ConfigError::PasswordFile { .. }), "{err:?}");

        let empty = password_file("\n");
        let err = cli(&["--postgres-password-file", empty.path().to_str().unwrap()])
            .unwrap_err()
            .to_string();
        assert!(err.contains("empty"), "{err}");
    }
}
