//! Command-line flags (each also read from `OUTBOX_RELAY_<NAME>`) and the
//! validated [`Config`] they become.
//!
//! Everything a user can get wrong is checked here, once, before any
//! connection is opened, so a typo fails in milliseconds with a message that
//! names the flag.

pub mod debezium;
mod postgres;

use std::time::Duration;

use clap::{Parser, ValueEnum};

pub use postgres::{PostgresConnInfo, PostgresUrlError, SslMode, redact_url};

use crate::outbox::{HeaderColumn, MappingConfig, TableName, TopicTemplate};

/// Relays transactional-outbox rows from Postgres logical replication to Kafka.
///
/// Every committed insert into an outbox table becomes one Kafka record, routed
/// to a topic by its event type (like Debezium's Outbox Event Router). The
/// replication slot's confirmed position moves only past events the broker has
/// acknowledged, so a crash or restart never loses an event.
#[derive(Debug, Clone, Parser)]
#[command(name = "outbox-relay", version, about, long_about)]
pub struct Cli {
    /// Postgres URL, libpq style: postgres://USER:PASSWORD@HOST:PORT/DB?sslmode=require.
    /// The role needs REPLICATION (or superuser) and SELECT on the outbox tables.
    #[arg(long, env = "OUTBOX_RELAY_POSTGRES_URL", hide_env_values = true)]
    pub postgres_url: String,

    /// Kafka bootstrap servers, comma separated (host:port,...).
    #[arg(long, env = "OUTBOX_RELAY_KAFKA_BROKERS")]
    pub kafka_brokers: String,

    /// Outbox table as SCHEMA.TABLE (schema defaults to public). Repeatable.
    #[arg(
        long = "table",
        env = "OUTBOX_RELAY_TABLE",
        value_delimiter = ',',
        default_value = "public.outbox"
    )]
    pub tables: Vec<String>,

    /// Logical replication slot to stream from (created with pgoutput if missing).
    #[arg(long, env = "OUTBOX_RELAY_SLOT", default_value = "outbox_relay")]
    pub slot: String,

    /// Publication to stream (created FOR TABLE <tables> WITH (publish = 'insert') if missing).
    #[arg(long, env = "OUTBOX_RELAY_PUBLICATION", default_value = "outbox_relay")]
    pub publication: String,

    /// Column whose value routes the event: `${routedByValue}` in --topic-template.
    /// Debezium: route.by.field.
    #[arg(long, env = "OUTBOX_RELAY_ROUTE_BY", default_value = "event_type")]
    pub route_by: String,

    /// Topic name template: `${routedByValue}` is the --route-by value, `${COLUMN}` any
    /// outbox column. Debezium's default is 'outbox.event.${routedByValue}'.
    #[arg(
        long,
        env = "OUTBOX_RELAY_TOPIC_TEMPLATE",
        default_value = "${routedByValue}"
    )]
    pub topic_template: String,

    /// Column whose text is the record key (raw UTF-8, NULL = null key).
    /// Debezium: table.field.event.key.
    #[arg(long, env = "OUTBOX_RELAY_KEY_COLUMN", default_value = "aggregate_id")]
    pub key_column: String,

    /// Column whose text is the `id` header of every record (the dedupe key).
    /// Debezium: table.field.event.id.
    #[arg(long, env = "OUTBOX_RELAY_ID_COLUMN", default_value = "id")]
    pub id_column: String,

    /// Column that becomes the record value: json/jsonb/text as sent by Postgres,
    /// bytea as raw bytes, NULL as a tombstone. Debezium: table.field.event.payload.
    #[arg(long, env = "OUTBOX_RELAY_PAYLOAD_COLUMN", default_value = "payload")]
    pub payload_column: String,

    /// Column (timestamptz, timestamp as UTC, or bigint epoch milliseconds) for the
    /// record timestamp; the transaction's commit time when not given.
    /// Debezium: table.field.event.timestamp.
    #[arg(long, env = "OUTBOX_RELAY_TIMESTAMP_COLUMN")]
    pub timestamp_column: Option<String>,

    /// Extra column copied into a record header, as COLUMN or COLUMN:HEADER. Repeatable.
    /// Debezium: table.fields.additional.placement=COLUMN:header:HEADER.
    #[arg(
        long = "header-column",
        env = "OUTBOX_RELAY_HEADER_COLUMN",
        value_delimiter = ','
    )]
    pub header_columns: Vec<String>,

    /// librdkafka producer property KEY=VALUE, passed through and overriding the
    /// relay's defaults (e.g. -X security.protocol=SASL_SSL). Repeatable.
    #[arg(
        short = 'X',
        long = "kafka-property",
        env = "OUTBOX_RELAY_KAFKA_PROPERTY",
        value_delimiter = ';',
        hide_env_values = true
    )]
    pub kafka_properties: Vec<String>,

    /// On SIGINT/SIGTERM, how long to wait for in-flight deliveries before exiting.
    #[arg(long, env = "OUTBOX_RELAY_SHUTDOWN_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub shutdown_timeout: Duration,

    /// How often the acknowledged position is reported to Postgres.
    #[arg(long, env = "OUTBOX_RELAY_STATUS_INTERVAL", default_value = "500ms", value_parser = parse_duration)]
    pub status_interval: Duration,

    /// Most events enqueued to Kafka but not yet acknowledged; reading the WAL
    /// pauses at this many (backpressure, bounded memory).
    #[arg(
        long,
        env = "OUTBOX_RELAY_MAX_IN_FLIGHT_EVENTS",
        default_value_t = 50_000
    )]
    pub max_in_flight_events: usize,

    /// Most payload+key bytes enqueued to Kafka but not yet acknowledged.
    #[arg(long, env = "OUTBOX_RELAY_MAX_IN_FLIGHT_BYTES", default_value_t = 16 * 1024 * 1024)]
    pub max_in_flight_bytes: usize,

    /// What to do with an event that cannot be delivered (NULL id or routing
    /// value, invalid topic name, payload over message.max.bytes, a value invalid
    /// for its type, a broker-side rejection): stop before acknowledging it
    /// (`fail`), or produce it to --dead-letter-topic and go on (`dead-letter`).
    #[arg(long, env = "OUTBOX_RELAY_ON_POISON", value_enum, default_value_t = PoisonPolicy::Fail)]
    pub on_poison: PoisonPolicy,

    /// Topic for dead-lettered events (required with --on-poison dead-letter).
    #[arg(long, env = "OUTBOX_RELAY_DEAD_LETTER_TOPIC")]
    pub dead_letter_topic: Option<String>,

    /// First wait before reconnecting to Postgres after the stream broke; doubles per attempt.
    #[arg(long, env = "OUTBOX_RELAY_RECONNECT_BACKOFF_MIN", default_value = "500ms", value_parser = parse_duration)]
    pub reconnect_backoff_min: Duration,

    /// Longest wait between reconnect attempts (also the standby's polling interval).
    #[arg(long, env = "OUTBOX_RELAY_RECONNECT_BACKOFF_MAX", default_value = "30s", value_parser = parse_duration)]
    pub reconnect_backoff_max: Duration,

    /// Log line format.
    #[arg(long, env = "OUTBOX_RELAY_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Log filter: a level (info, debug) or a tracing filter (outbox_relay=debug,rdkafka=warn).
    #[arg(long, env = "OUTBOX_RELAY_LOG_LEVEL", default_value = "info")]
    pub log_level: String,
}

/// What happens to an event that can never be delivered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PoisonPolicy {
    /// Stop before acknowledging it; exit non-zero.
    Fail,
    /// Produce it to the dead-letter topic, then acknowledge as usual.
    DeadLetter,
}

/// Log line format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (examples: 30s, 500ms, 2m)"))
}

/// A flag value that cannot work, found before connecting anywhere.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The Postgres URL is unusable.
    #[error(transparent)]
    PostgresUrl(#[from] PostgresUrlError),
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

/// The relay's settings, validated.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where Postgres is.
    pub postgres: PostgresConnInfo,
    /// Kafka bootstrap servers.
    pub kafka_brokers: String,
    /// Outbox tables, in flag order.
    pub tables: Vec<TableName>,
    /// Replication slot name.
    pub slot: String,
    /// Publication name.
    pub publication: String,
    /// How rows become records.
    pub mapping: MappingConfig,
    /// librdkafka properties given with `-X`, in order.
    pub kafka_properties: Vec<(String, String)>,
    /// Grace period for in-flight deliveries on shutdown.
    pub shutdown_timeout: Duration,
    /// Standby status update cadence.
    pub status_interval: Duration,
    /// In-flight cap, events.
    pub max_in_flight_events: usize,
    /// In-flight cap, bytes.
    pub max_in_flight_bytes: usize,
    /// Dead-letter topic when poison events are diverted; `None` means stop on them.
    pub dead_letter_topic: Option<String>,
    /// Reconnect backoff bounds.
    pub reconnect_backoff: (Duration, Duration),
}

impl Config {
    /// Validates raw flags into a config.
    pub fn from_cli(cli: &Cli) -> Result<Self, ConfigError> {
        let postgres = PostgresConnInfo::parse(&cli.postgres_url)?;
        if cli.kafka_brokers.trim().is_empty() {
            return Err(invalid(
                "--kafka-brokers",
                "",
                "give at least one host:port",
            ));
        }
        let mut tables = Vec::with_capacity(cli.tables.len());
        for raw in &cli.tables {
            let table = TableName::parse(raw).map_err(|reason| invalid("--table", raw, &reason))?;
            if !tables.contains(&table) {
                tables.push(table);
            }
        }
        if tables.is_empty() {
            return Err(invalid("--table", "", "give at least one outbox table"));
        }
        check_identifier("--slot", &cli.slot, true)?;
        check_identifier("--publication", &cli.publication, false)?;
        for (flag, column) in [
            ("--route-by", &cli.route_by),
            ("--key-column", &cli.key_column),
            ("--id-column", &cli.id_column),
            ("--payload-column", &cli.payload_column),
        ] {
            if column.is_empty() {
                return Err(invalid(flag, column, "a column name is required"));
            }
        }
        let topic_template = TopicTemplate::parse(&cli.topic_template)
            .map_err(|reason| invalid("--topic-template", &cli.topic_template, &reason))?;
        let header_columns = cli
            .header_columns
            .iter()
            .map(|raw| {
                HeaderColumn::parse(raw).map_err(|reason| invalid("--header-column", raw, &reason))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let kafka_properties = cli
            .kafka_properties
            .iter()
            .map(|raw| match raw.split_once('=') {
                Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_owned(), v.to_owned())),
                _ => Err(ConfigError::Invalid {
                    flag: "--kafka-property",
                    value: raw.split('=').next().unwrap_or_default().to_owned(),
                    reason: "expected KEY=VALUE, e.g. -X compression.type=zstd".to_owned(),
                }),
            })
            .collect::<Result<Vec<_>, _>>()?;
        if cli.max_in_flight_events == 0 {
            return Err(invalid("--max-in-flight-events", "0", "must be at least 1"));
        }
        if cli.max_in_flight_bytes < 1024 {
            return Err(invalid(
                "--max-in-flight-bytes",
                &cli.max_in_flight_bytes.to_string(),
                "must be at least 1024",
            ));
        }
        if cli.status_interval.is_zero() {
            return Err(invalid("--status-interval", "0", "must be positive"));
        }
        let dead_letter_topic = match (cli.on_poison, &cli.dead_letter_topic) {
            (PoisonPolicy::Fail, _) => None,
            (PoisonPolicy::DeadLetter, None) => {
                return Err(invalid(
                    "--dead-letter-topic",
                    "",
                    "required with --on-poison dead-letter",
                ));
            }
            (PoisonPolicy::DeadLetter, Some(topic)) => {
                crate::outbox::check_topic_name(topic)
                    .map_err(|reason| invalid("--dead-letter-topic", topic, reason))?;
                Some(topic.clone())
            }
        };
        if cli.reconnect_backoff_min.is_zero()
            || cli.reconnect_backoff_max < cli.reconnect_backoff_min
        {
            return Err(invalid(
                "--reconnect-backoff-max",
                &humantime::format_duration(cli.reconnect_backoff_max).to_string(),
                "must be at least --reconnect-backoff-min, which must be positive",
            ));
        }
        Ok(Config {
            dead_letter_topic,
            reconnect_backoff: (cli.reconnect_backoff_min, cli.reconnect_backoff_max),
            postgres,
            kafka_brokers: cli.kafka_brokers.trim().to_owned(),
            tables,
            slot: cli.slot.clone(),
            publication: cli.publication.clone(),
            mapping: MappingConfig {
                route_by: cli.route_by.clone(),
                topic_template,
                key_column: cli.key_column.clone(),
                id_column: cli.id_column.clone(),
                payload_column: cli.payload_column.clone(),
                timestamp_column: cli.timestamp_column.clone().filter(|c| !c.is_empty()),
                header_columns,
            },
            kafka_properties,
            shutdown_timeout: cli.shutdown_timeout,
            status_interval: cli.status_interval,
            max_in_flight_events: cli.max_in_flight_events,
            max_in_flight_bytes: cli.max_in_flight_bytes,
        })
    }
}

fn invalid(flag: &'static str, value: &str, reason: &str) -> ConfigError {
    ConfigError::Invalid {
        flag,
        value: value.to_owned(),
        reason: reason.to_owned(),
    }
}

/// Slot names are restricted by Postgres to `[a-z0-9_]{1,63}`; publication
/// names are ordinary identifiers, which we restrict to the unquoted form so
/// they can be interpolated into replication commands without quoting.
fn check_identifier(flag: &'static str, name: &str, slot: bool) -> Result<(), ConfigError> {
    let ok_char = |c: char| {
        c.is_ascii_lowercase()
            || c.is_ascii_digit()
            || c == '_'
            || (!slot && c.is_ascii_uppercase())
    };
    if name.is_empty() || name.len() > 63 || !name.chars().all(ok_char) {
        let rule = if slot {
            "slot names may contain only lower-case letters, digits and underscores (at most 63)"
        } else {
            "use letters, digits and underscores (at most 63)"
        };
        return Err(invalid(flag, name, rule));
    }
    Ok(())
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

    #[test]
    fn defaults_match_the_common_outbox_schema() {
        let config = cli(&[]).unwrap();
        assert_eq!(
            config.tables,
            vec![TableName::parse("public.outbox").unwrap()]
        );
        assert_eq!(config.slot, "outbox_relay");
        assert_eq!(config.publication, "outbox_relay");
        assert_eq!(config.mapping.route_by, "event_type");
        assert_eq!(config.mapping.key_column, "aggregate_id");
        assert_eq!(config.mapping.id_column, "id");
        assert_eq!(config.mapping.payload_column, "payload");
        assert_eq!(config.mapping.timestamp_column, None);
        assert_eq!(config.shutdown_timeout, Duration::from_secs(30));
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
            config.kafka_properties,
            vec![
                ("linger.ms".to_owned(), "5".to_owned()),
                ("compression.type".to_owned(), "zstd".to_owned())
            ]
        );
        assert_eq!(config.mapping.header_columns[0].header, "type");
        assert_eq!(config.mapping.header_columns[1].header, "event_type");
    }

    #[test]
    fn bad_values_name_their_flag() {
        let err = cli(&["--slot", "Bad-Slot"]).unwrap_err().to_string();
        assert!(err.contains("--slot"), "{err}");
        let err = cli(&["-X", "novalue"]).unwrap_err().to_string();
        assert!(err.contains("KEY=VALUE"), "{err}");
        let err = cli(&["--topic-template", "x.${unclosed"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("--topic-template"), "{err}");
        let err = cli(&["--table", "a.b.c"]).unwrap_err().to_string();
        assert!(err.contains("--table"), "{err}");
        let err = cli(&["--on-poison", "dead-letter"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("--dead-letter-topic"), "{err}");
        let err = cli(&["--on-poison", "dead-letter", "--dead-letter-topic", "a b"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("--dead-letter-topic"), "{err}");
        let ok = cli(&[
            "--on-poison",
            "dead-letter",
            "--dead-letter-topic",
            "outbox.dlq",
        ])
        .unwrap();
        assert_eq!(ok.dead_letter_topic.as_deref(), Some("outbox.dlq"));
        let err = cli(&[
            "--reconnect-backoff-min",
            "10s",
            "--reconnect-backoff-max",
            "1s",
        ])
        .unwrap_err()
        .to_string();
        assert!(err.contains("--reconnect-backoff"), "{err}");
    }
}
