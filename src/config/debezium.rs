//! A Debezium Postgres connector config (with the Outbox Event Router) as a
//! configuration source: the relay's flags, their values taken from the config.
//!
//! A team leaving Kafka Connect has a connector config, either the JSON body
//! they `POST`ed to `/connectors` or a `.properties` file. [`parse`] reads
//! either into a flat key/value map, [`import`] maps it onto flags (both pure),
//! [`with_defaults`] makes those values the flags' defaults, so a flag given on
//! the command line or through its `OUTBOX_RELAY_*` variable wins, and
//! [`explain`] prints the equivalent command line.
//!
//! Two rules shape the mapping:
//!
//! - **Debezium's defaults are written out.** The relay's own defaults follow a
//!   snake_case schema (`event_type`, `aggregate_id`, topic `${routedByValue}`)
//!   while Debezium's are `aggregatetype`, `aggregateid` and
//!   `outbox.event.${routedByValue}`. A migrating user expects Debezium's
//!   behaviour, so every mapped option is emitted, set or not; likewise the
//!   slot and publication default to Debezium's `debezium` and
//!   `dbz_publication`.
//! - **Nothing is dropped silently.** What has no equivalent, or behaves
//!   differently (converters, tombstones, envelope fields, regex routing), is
//!   a warning that says what consumers will see change; what cannot work
//!   (another connector, another decoding plugin, regex table lists) is a
//!   [`DebeziumError`] that says what to do. Warnings never show the
//!   `database.*` settings' values, so the password does not leak into them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

use super::{PostgresConnInfo, PostgresUrlError};
use crate::outbox::{TableName, TopicTemplate};

const POSTGRES_CONNECTOR: &str = "io.debezium.connector.postgresql.PostgresConnector";
const EVENT_ROUTER: &str = "io.debezium.transforms.outbox.EventRouter";
const DEFAULT_ROUTE_REGEX: &str = "(?<routedByValue>.*)";
const ROUTED_BY_VALUE: &str = "${routedByValue}";
const NO_REGEX_ROUTING: &str = "the relay has no regex routing: its topic is --topic-template, where ${routedByValue} is the whole route-by value and ${COLUMN} any column. Remove route.topic.regex and write the topic as route.topic.replacement, or add a column holding the topic part and route by it";
const NO_EVENT_ROUTER: &str = "no transform of type io.debezium.transforms.outbox.EventRouter: this connector publishes raw change events, which the relay does not produce; it replaces only the Outbox Event Router";
const PROVIDER: &str = "a Kafka Connect config-provider reference; resolve it and import again";
/// What a user name, password or database name keeps unencoded in the URL:
/// RFC 3986's unreserved characters.
const URL_PART: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// The syntax of a connector config file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceFormat {
    /// `{"name": ..., "config": {...}}` (the REST body) or the bare config object.
    Json,
    /// Java `.properties` (standalone Connect, or a hand-kept file).
    Properties,
}

/// A connector config file that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("Debezium config {}", path.display())]
pub struct ImportError {
    /// The file.
    pub path: PathBuf,
    /// Why.
    #[source]
    pub source: DebeziumError,
}

/// A connector config that cannot be imported; each message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum DebeziumError {
    /// The file cannot be read.
    #[error("cannot read the file")]
    Read(#[source] std::io::Error),
    /// The JSON does not parse.
    #[error(
        "the connector config is not valid JSON (line {line}, column {column}); export it with `curl http://CONNECT:8083/connectors/NAME/config`"
    )]
    Json {
        /// 1-based line of the problem.
        line: usize,
        /// 1-based column of the problem.
        column: usize,
        /// What the JSON parser said.
        #[source]
        source: serde_json::Error,
    },
    /// The JSON is not an object.
    #[error(
        "the connector config must be a JSON object: {{\"name\": ..., \"config\": {{...}}}} or the config object itself"
    )]
    JsonShape,
    /// A JSON value that is not a string, number or boolean.
    #[error(
        "connector config key {key:?} has {kind} value; Kafka Connect config values are strings, numbers or booleans"
    )]
    JsonValue {
        /// The key.
        key: String,
        /// `an array` or `an object`.
        kind: &'static str,
    },
    /// A `.properties` line that does not parse.
    #[error("connector config line {line} is not valid .properties syntax")]
    Properties {
        /// 1-based line where the logical line starts (0: unknown).
        line: usize,
        /// What the parser said.
        #[source]
        source: java_properties::PropertiesError,
    },
    /// A required key is absent.
    #[error("{key} is missing: {hint}")]
    Missing {
        /// The key.
        key: &'static str,
        /// What to add.
        hint: &'static str,
    },
    /// A value the relay cannot reproduce.
    #[error("{key}={value:?}: {reason}")]
    Invalid {
        /// The key.
        key: String,
        /// The value (never a password).
        value: String,
        /// What is wrong and what would work.
        reason: String,
    },
    /// The `database.*` settings do not make a usable `--postgres-url`.
    #[error("the database.* settings do not make a usable --postgres-url")]
    PostgresUrl {
        /// What the URL parser said.
        #[source]
        source: PostgresUrlError,
    },
}

fn invalid(key: impl Into<String>, value: &str, reason: impl Into<String>) -> DebeziumError {
    DebeziumError::Invalid {
        key: key.into(),
        value: value.to_owned(),
        reason: reason.into(),
    }
}

/// The result of [`import`]: flags in command-line order, and what differs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Imported {
    /// `(flag, value)` pairs, e.g. `("--slot", "debezium")` or `("-X", "linger.ms=5")`.
    pub args: Vec<(String, String)>,
    /// One sentence per option that is ignored or behaves differently.
    pub warnings: Vec<String>,
}

/// Reads and translates a connector config file.
pub fn import_file(path: &Path) -> Result<Imported, ImportError> {
    std::fs::read_to_string(path)
        .map_err(DebeziumError::Read)
        .and_then(|text| import(&parse(&text, detect_format(path, &text))?))
        .map_err(|source| ImportError {
            path: path.to_owned(),
            source,
        })
}

/// `command` with the imported values as its flags' defaults. clap then takes a
/// flag from the command line, else its environment variable, else the import,
/// else its own default; a repeatable flag given explicitly replaces every
/// imported value.
pub fn with_defaults(command: clap::Command, imported: &Imported) -> clap::Command {
    let mut values: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (flag, value) in &imported.args {
        values.entry(flag).or_default().push(value.clone());
    }
    values.into_iter().fold(command, |command, (flag, values)| {
        let named = |arg: &&clap::Arg| {
            arg.get_long().is_some_and(|l| flag == format!("--{l}"))
                || arg.get_short().is_some_and(|s| flag == format!("-{s}"))
        };
        let id = command
            .get_arguments()
            .find(named)
            .map(|a| a.get_id().clone());
        match id {
            Some(id) => command.mut_arg(id, |arg| arg.default_values(values)),
            None => command,
        }
    })
}

/// Reads a connector config into a flat key/value map.
///
/// JSON values may be strings, numbers or booleans (stringified); `null` is
/// treated as unset. Properties follow `java.util.Properties.load`, read as UTF-8.
pub fn parse(text: &str, format: SourceFormat) -> Result<BTreeMap<String, String>, DebeziumError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    if format == SourceFormat::Json {
        return parse_json(text);
    }
    let mut out = BTreeMap::new();
    java_properties::PropertiesIter::new_with_encoding(text.as_bytes(), encoding_rs::UTF_8)
        .read_into(|key, value| {
            out.insert(key, value);
        })
        .map_err(|source| DebeziumError::Properties {
            line: source.line_number().unwrap_or_default(),
            source,
        })?;
    Ok(out)
}

/// Guesses the format: by extension (`.json`, `.properties`), else JSON when
/// the first non-blank character is `{`.
pub fn detect_format(path: &Path, text: &str) -> SourceFormat {
    let extension = path.extension().and_then(|e| e.to_str());
    let brace = text.trim_start_matches(|c: char| c == '\u{feff}' || c.is_whitespace());
    match extension.map(str::to_ascii_lowercase).as_deref() {
        Some("json") => SourceFormat::Json,
        Some("properties" | "props") => SourceFormat::Properties,
        _ if brace.starts_with('{') => SourceFormat::Json,
        _ => SourceFormat::Properties,
    }
}

/// Maps a Debezium Postgres connector config onto the relay's flags.
///
/// `--kafka-brokers` comes only from `producer.override.bootstrap.servers`;
/// otherwise a warning asks for it (it lives in the Connect worker's config).
pub fn import(config: &BTreeMap<String, String>) -> Result<Imported, DebeziumError> {
    let mut importer = Importer {
        config,
        used: BTreeSet::from(["name"]),
        out: Imported::default(),
    };
    importer.run()?;
    Ok(importer.out)
}

/// The equivalent command line, shell-quoted, one flag per line, followed by
/// the warnings as `#` comments.
pub fn explain(imported: &Imported) -> String {
    let mut out = String::from("outbox-relay");
    for (flag, value) in &imported.args {
        out += &format!(" \\\n  {flag} {}", shell_words::quote(value));
    }
    out.push('\n');
    if !imported.warnings.is_empty() {
        out.push_str("# Differences from the Debezium connector:\n");
        for warning in &imported.warnings {
            out += &format!("# - {warning}\n");
        }
    }
    out
}

fn parse_json(text: &str) -> Result<BTreeMap<String, String>, DebeziumError> {
    use serde_json::Value;
    let value = serde_json::from_str(text).map_err(|source| DebeziumError::Json {
        line: source.line(),
        column: source.column(),
        source,
    })?;
    let Value::Object(mut object) = value else {
        return Err(DebeziumError::JsonShape);
    };
    let object = match object.remove("config") {
        Some(Value::Object(config)) => config,
        other => {
            object.extend(other.map(|value| ("config".to_owned(), value)));
            object
        }
    };
    object
        .into_iter()
        .filter(|(_, value)| !value.is_null())
        .map(|(key, value)| match value {
            Value::String(text) => Ok((key, text)),
            Value::Number(_) | Value::Bool(_) => Ok((key, value.to_string())),
            Value::Array(_) => Err(DebeziumError::JsonValue {
                key,
                kind: "an array",
            }),
            _ => Err(DebeziumError::JsonValue {
                key,
                kind: "an object",
            }),
        })
        .collect()
}

/// How a Connect converter serialised keys or values.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Converter {
    /// Not in the connector config: the worker's converter applied.
    Unset,
    /// StringConverter or ByteArrayConverter: the bytes the relay sends too.
    Raw,
    /// Kafka's JsonConverter.
    Json { schemas: bool },
    /// Anything else (Avro, Protobuf, JSON Schema, ...).
    Other(String),
}

/// Why a connector key without an equivalent is ignored, for the "ignored" warning.
fn ignored_note(key: &str) -> Option<&'static str> {
    Some(match key {
        "snapshot.mode" => {
            "the relay never snapshots; it streams from the slot's confirmed position"
        }
        "topic.prefix" | "database.server.name" => "outbox topics come from --topic-template",
        "tasks.max" => "run one relay per slot",
        "slot.drop.on.stop" => "the relay never drops its slot",
        "binary.handling.mode" => "bytea payloads are sent as raw bytes",
        "max.batch.size" | "max.queue.size" => {
            "see --max-in-flight-events and --max-in-flight-bytes"
        }
        "tombstones.on.delete" => "deletes on the outbox table are ignored",
        "skipped.operations" => "the relay relays inserts only",
        "schema.include.list" | "table.exclude.list" => {
            "the relay reads exactly the --table tables"
        }
        _ => return None,
    })
}

/// Why a Java-only producer property, which librdkafka would refuse at start-up, is dropped.
fn java_only_producer(name: &str) -> Option<&'static str> {
    Some(match name {
        "key.serializer" => "the relay sends the key's raw text",
        "value.serializer" => "the relay sends the payload's bytes",
        "partitioner.class" => "the relay uses murmur2_random, the Java client's default hash",
        "interceptor.classes" | "max.block.ms" | "metric.reporters" => "no librdkafka equivalent",
        "buffer.memory" => "librdkafka's is queue.buffering.max.kbytes",
        "sasl.jaas.config" => "use -X sasl.username=... -X sasl.password=...",
        "transactional.id" => "the relay does not use Kafka transactions",
        // JKS stores; librdkafka reads PEM.
        n if n.starts_with("ssl.truststore.") => {
            "use -X ssl.ca.location=CA.pem (librdkafka reads PEM files)"
        }
        n if n.starts_with("ssl.keystore.") => {
            "use -X ssl.certificate.location=... -X ssl.key.location=... (PEM)"
        }
        _ => return None,
    })
}

/// Why an EventRouter option (relative to `transforms.NAME.`) with this value
/// is not applied: `Some(None)` when the relay already behaves so, `None` for
/// an option the router does not have.
fn router_option_note(option: &str, value: &str) -> Option<Option<&'static str>> {
    const OP_INVALID: [&str; 2] = ["table.op.invalid.behavior", "debezium.op.invalid.behavior"];
    let why = match (option, value.to_ascii_lowercase().as_str()) {
        (o, "error" | "fatal") if OP_INVALID.contains(&o) => {
            "the relay ignores UPDATE and DELETE on the outbox table with one warning per run and goes on"
        }
        ("table.fields.additional.error.on.missing", "false") => {
            "the relay refuses a table that lacks a --header-column column"
        }
        ("table.json.payload.null.behavior", _) => {
            "it shapes table.expand.json.payload, which the relay does not do; JSON nulls stay in the payload text"
        }
        ("table.field.event.schema.version", _) => {
            "the relay sends no Connect schema, so there is no schema version to set"
        }
        ("table.field.event.type", _) => {
            "the relay has no event-type field; route or add headers with --route-by / --header-column"
        }
        ("predicate", _) => "the relay routes every insert into the --table tables",
        (o, _) if o.starts_with("tracing.") => {
            "the relay does not activate tracing spans from an outbox column"
        }
        (o, _) if OP_INVALID.contains(&o) => return Some(None),
        ("table.fields.additional.error.on.missing" | "negate", _) => return Some(None),
        _ => return None,
    };
    Some(Some(why))
}

struct Importer<'a> {
    config: &'a BTreeMap<String, String>,
    used: BTreeSet<&'a str>,
    out: Imported,
}

impl<'a> Importer<'a> {
    /// The value of `key` as written (marked as handled); empty counts as unset.
    fn take_raw(&mut self, key: &str) -> Option<&'a str> {
        let (k, v) = self.config.get_key_value(key)?;
        self.used.insert(k);
        Some(v.as_str()).filter(|v| !v.is_empty())
    }

    /// The trimmed value of `key` (marked as handled); empty counts as unset.
    fn take(&mut self, key: &str) -> Option<&'a str> {
        self.take_raw(key).map(str::trim).filter(|v| !v.is_empty())
    }

    /// Every `(key, value)` under `prefix` not yet handled (now marked), prefix stripped.
    fn take_prefixed(&mut self, prefix: &str) -> Vec<(&'a str, &'a str)> {
        let config = self.config;
        let found: Vec<(&'a str, &'a str)> = config
            .iter()
            .filter(|(k, _)| k.starts_with(prefix) && !self.used.contains(k.as_str()))
            .map(|(k, v)| (k.as_str(), v.trim()))
            .collect();
        self.used.extend(found.iter().map(|(k, _)| *k));
        found
            .into_iter()
            .map(|(k, v)| (k.get(prefix.len()..).unwrap_or_default(), v))
            .collect()
    }

    /// The trimmed value of `key`, which must be set and literal.
    fn required(
        &mut self,
        key: &'static str,
        hint: &'static str,
    ) -> Result<&'a str, DebeziumError> {
        let value = self.take(key).ok_or(DebeziumError::Missing { key, hint })?;
        if is_config_provider(value) {
            return Err(invalid(key, value, PROVIDER));
        }
        Ok(value)
    }

    fn arg(&mut self, flag: &str, value: impl Into<String>) {
        self.out.args.push((flag.to_owned(), value.into()));
    }

    fn warn(&mut self, warning: impl Into<String>) {
        self.out.warnings.push(warning.into());
    }

    /// One warning about all of `items` (none without any), given their list.
    fn warn_all(&mut self, items: &[impl AsRef<str>], warning: impl FnOnce(&str) -> String) {
        let items: Vec<&str> = items.iter().map(AsRef::as_ref).collect();
        if !items.is_empty() {
            self.warn(warning(&items.join(", ")));
        }
    }

    fn run(&mut self) -> Result<(), DebeziumError> {
        let class = self.required(
            "connector.class",
            "add connector.class=io.debezium.connector.postgresql.PostgresConnector",
        )?;
        // Kafka Connect also accepts the simple class name and its alias without `Connector`.
        if !matches!(class, POSTGRES_CONNECTOR | "PostgresConnector" | "Postgres") {
            let why = format!(
                "not {POSTGRES_CONNECTOR}: outbox-relay replaces only Debezium's Postgres connector"
            );
            return Err(invalid("connector.class", class, why));
        }
        let pgoutput = self.plugin()?;
        let url = self.postgres_url()?;
        self.arg("--postgres-url", url);
        match self.take("producer.override.bootstrap.servers") {
            Some(brokers) => self.arg("--kafka-brokers", brokers),
            None => self.warn(
                "add --kafka-brokers HOST:PORT,...: the brokers are not part of a connector config (they are the Connect worker's bootstrap.servers)",
            ),
        }
        self.tables()?;
        let slot = self.take("slot.name").unwrap_or("debezium");
        self.arg("--slot", slot);
        let publication = self.take("publication.name").unwrap_or("dbz_publication");
        self.arg("--publication", publication);
        self.publication_mode(publication, pgoutput);
        let key_converter = self.converter("key.converter");
        let value_converter = self.converter("value.converter");
        self.event_router(&value_converter)?;
        self.converter_warnings(&key_converter, &value_converter);
        self.header_converter();
        self.producer_overrides();
        self.error_handling();
        self.leftovers();
        Ok(())
    }

    /// Whether Debezium used pgoutput (and so may have created a publication).
    fn plugin(&mut self) -> Result<bool, DebeziumError> {
        match self.take("plugin.name") {
            Some(plugin) if plugin.eq_ignore_ascii_case("pgoutput") => Ok(true),
            Some(plugin) => Err(invalid(
                "plugin.name",
                plugin,
                "the relay decodes pgoutput only, and a slot of another plugin cannot be read as pgoutput. Set plugin.name=pgoutput and slot.name to a new slot name (the relay creates it), then import again; run the relay alongside Debezium until it streams, then stop Debezium (consumers deduplicate on the id header)",
            )),
            None => {
                self.warn(
                    "plugin.name is not set, so Debezium used its default decoderbufs: the relay decodes pgoutput only and cannot reuse a decoderbufs slot (it stops with \"uses the decoderbufs plugin\"). Pass a new --slot name (the relay creates it with pgoutput), start the relay before stopping Debezium, and let consumers deduplicate on the id header",
                );
                Ok(false)
            }
        }
    }

    fn postgres_url(&mut self) -> Result<String, DebeziumError> {
        let host = self.required(
            "database.hostname",
            "add database.hostname (the Postgres server's host name or IP address)",
        )?;
        let user = self.required(
            "database.user",
            "add database.user (a role with REPLICATION and SELECT on the outbox tables)",
        )?;
        let dbname = self.required(
            "database.dbname",
            "add database.dbname (the database holding the outbox tables)",
        )?;
        let port: u16 = match self.take("database.port") {
            None => 5432,
            Some(raw) => raw.parse().ok().filter(|p| *p != 0).ok_or_else(|| {
                let why = if is_config_provider(raw) {
                    PROVIDER
                } else {
                    "expected a TCP port number"
                };
                invalid("database.port", raw, why)
            })?,
        };
        // The password is used as written: Connect does not trim it either.
        let password = match self.take_raw("database.password") {
            Some(p) if is_config_provider(p) => {
                self.warn(
                    "database.password is a Kafka Connect config-provider reference (${provider:...}), which the relay cannot resolve, so it is left out of --postgres-url. Pass the password with --postgres-password-file PATH (a mounted secret) or the OUTBOX_RELAY_POSTGRES_PASSWORD environment variable",
                );
                None
            }
            other => other,
        };
        let encode = |part| utf8_percent_encode(part, URL_PART);
        let password = password.map(|p| format!(":{}", encode(p)));
        let host = if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]")
        } else {
            host.to_owned()
        };
        let (user, dbname) = (encode(user), encode(dbname));
        let password = password.unwrap_or_default();
        let mut url = format!("postgres://{user}{password}@{host}:{port}/{dbname}");
        let mut query = url::form_urlencoded::Serializer::new(String::new());
        for param in ["sslmode", "sslrootcert", "sslcert", "sslkey"] {
            if let Some(value) = self.take(&format!("database.{param}")) {
                query.append_pair(param, value);
            }
        }
        let query = query.finish();
        if !query.is_empty() {
            url = format!("{url}?{query}");
        }
        PostgresConnInfo::parse(&url).map_err(|source| DebeziumError::PostgresUrl { source })?;
        Ok(url)
    }

    fn tables(&mut self) -> Result<(), DebeziumError> {
        let (key, list) = match self.take("table.include.list") {
            Some(list) => ("table.include.list", list),
            None => match self.take("table.whitelist") {
                Some(list) => ("table.whitelist", list),
                None => {
                    return Err(DebeziumError::Missing {
                        key: "table.include.list",
                        hint: "without it Debezium captures every table; list the outbox table(s) as schema.table, or pass --table yourself",
                    });
                }
            },
        };
        let mut unqualified = Vec::new();
        let mut mixed_case = Vec::new();
        for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            // `\.` is the only regex syntax a plain name needs.
            let name = entry.replace(r"\.", ".");
            if name.contains(|c| "\\*+?()[]{}|^$".contains(c)) {
                let why = "a regular expression; the relay needs explicit table names: list each outbox table as schema.table (a `\\.` escape is fine)";
                return Err(invalid(key, entry, why));
            }
            TableName::parse(&name).map_err(|reason| invalid(key, entry, reason))?;
            if !name.contains('.') {
                unqualified.push(name.clone());
            }
            if name.chars().any(|c| c.is_ascii_uppercase()) {
                mixed_case.push(name.clone());
            }
            self.arg("--table", name);
        }
        self.warn_all(&unqualified, |list| {
            format!("{key} entries without a schema ({list}): Debezium matches entries against schema.table; the relay reads them as public.TABLE")
        });
        self.warn_all(&mixed_case, |list| {
            format!("{key} entries with upper-case letters ({list}): Debezium matched them case-insensitively; the relay uses the name exactly (Postgres folds unquoted names to lower case)")
        });
        Ok(())
    }

    fn publication_mode(&mut self, publication: &str, pgoutput: bool) {
        let mode = self.take("publication.autocreate.mode");
        match mode.unwrap_or("all_tables") {
            "all_tables" if pgoutput => self.warn(format!(
                "publication.autocreate.mode=all_tables (Debezium's default): Debezium created {publication} FOR ALL TABLES. The relay accepts an existing all-tables publication, but then receives every table's changes and drops those outside --table; it creates a publication only when missing, as FOR TABLE <tables> WITH (publish = 'insert'). To narrow it, pass a new --publication"
            )),
            "no_tables" if pgoutput => self.warn(format!(
                "publication.autocreate.mode=no_tables: {publication} was created without tables; the relay stops at start-up until the outbox tables are added (it prints the ALTER PUBLICATION ... ADD TABLE to run)"
            )),
            _ => {}
        }
    }

    fn converter(&mut self, key: &str) -> Converter {
        let class = self.take(key);
        let schemas = self
            .take(&format!("{key}.schemas.enable"))
            .is_none_or(|v| !v.eq_ignore_ascii_case("false"));
        self.take_prefixed(&format!("{key}."));
        let Some(class) = class else {
            return Converter::Unset;
        };
        match class.rsplit('.').next().unwrap_or(class) {
            "StringConverter" | "ByteArrayConverter" => Converter::Raw,
            "JsonConverter"
                if matches!(class, "JsonConverter") || class.starts_with("org.apache.kafka.") =>
            {
                Converter::Json { schemas }
            }
            _ => Converter::Other(class.to_owned()),
        }
    }

    fn event_router(&mut self, value_converter: &Converter) -> Result<(), DebeziumError> {
        let names = self.take("transforms").unwrap_or_default();
        let mut router = None;
        for name in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            match (self.take(&format!("transforms.{name}.type")), router) {
                (Some(EVENT_ROUTER), None) => router = Some(name),
                (Some(EVENT_ROUTER), Some(first)) => self.warn(format!(
                    "transform {name} (a second EventRouter) not applied: the relay applies one Outbox Event Router, transforms.{first}"
                )),
                (Some(other), _) => self.warn(format!(
                    "transform {name} ({other}) not applied: the relay applies only the Outbox Event Router; check that consumers do not depend on what it did"
                )),
                (None, _) => self.warn(format!(
                    "transform {name} has no transforms.{name}.type; not applied"
                )),
            }
        }
        let router = router.ok_or_else(|| invalid("transforms", names, NO_EVENT_ROUTER))?;
        let prefix = format!("transforms.{router}.");
        let option = |this: &mut Self, suffix: &str| this.take(&format!("{prefix}{suffix}"));

        let route_by = option(self, "route.by.field").unwrap_or("aggregatetype");
        let regex = option(self, "route.topic.regex");
        let replacement =
            option(self, "route.topic.replacement").unwrap_or("outbox.event.${routedByValue}");
        let template = self.topic_template(&prefix, regex, replacement)?;
        self.arg("--route-by", route_by);
        self.arg("--topic-template", template);
        for (suffix, flag, default) in [
            ("key", "--key-column", "aggregateid"),
            ("id", "--id-column", "id"),
            ("payload", "--payload-column", "payload"),
        ] {
            let column = option(self, &format!("table.field.event.{suffix}")).unwrap_or(default);
            self.arg(flag, column);
        }
        match option(self, "table.field.event.timestamp") {
            Some(column) => self.arg("--timestamp-column", column),
            None => self.warn(format!(
                "{prefix}table.field.event.timestamp is not set: Debezium stamped records with the time it processed the change (the event's ts_ms); the relay uses the transaction's commit time"
            )),
        }
        let envelope = self.placements(&prefix)?;
        if option(self, "table.expand.json.payload").is_some_and(|v| v.eq_ignore_ascii_case("true"))
        {
            let seen = match value_converter {
                Converter::Json { schemas: false } => {
                    "with JsonConverter (schemas disabled) consumers saw the same JSON document, though whitespace and key order may differ"
                }
                Converter::Json { schemas: true } => {
                    "with JsonConverter consumers saw the document inside a {\"schema\": ..., \"payload\": ...} envelope, which is gone"
                }
                _ => "the serialised form of the expanded struct is gone",
            };
            self.warn(format!(
                "{prefix}table.expand.json.payload=true is not supported: the relay sends the payload column's text as it is, not an expanded struct; {seen}"
            ));
        }
        self.tombstones(&prefix, value_converter, envelope);
        let mut unknown = Vec::new();
        for (name, value) in self.take_prefixed(&prefix) {
            match router_option_note(name, value) {
                Some(Some(why)) => self.warn(format!("{prefix}{name}={value} not applied: {why}")),
                Some(None) => {}
                None => unknown.push(format!("{prefix}{name}")),
            }
        }
        self.warn_all(&unknown, |list| {
            format!("unknown EventRouter options not applied: {list}")
        });
        Ok(())
    }

    fn topic_template(
        &mut self,
        prefix: &str,
        regex: Option<&str>,
        replacement: &str,
    ) -> Result<String, DebeziumError> {
        let groups = match regex {
            None => (1, true),
            Some(raw) => {
                let key = format!("{prefix}route.topic.regex");
                let groups = route_regex(raw).ok_or_else(|| invalid(key, raw, NO_REGEX_ROUTING))?;
                if raw.trim() != DEFAULT_ROUTE_REGEX {
                    self.warn(format!(
                        "{prefix}route.topic.regex is treated as the default {DEFAULT_ROUTE_REGEX}: the relay has no regex routing, and this pattern captures the whole route-by value"
                    ));
                }
                groups
            }
        };
        convert_replacement(replacement, groups)
            .and_then(|template| TopicTemplate::parse(&template).map(|_| template))
            .map_err(|reason| {
                invalid(
                    format!("{prefix}route.topic.replacement"),
                    replacement,
                    reason,
                )
            })
    }

    /// Maps header placements to flags; returns whether any envelope field exists.
    fn placements(&mut self, prefix: &str) -> Result<bool, DebeziumError> {
        let key = format!("{prefix}table.fields.additional.placement");
        let Some(list) = self.take(&key) else {
            return Ok(false);
        };
        let mut envelope = Vec::new();
        let mut partition = Vec::new();
        for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let parts: Vec<&str> = entry.split(':').map(str::trim).collect();
            let (column, placement, alias) = match parts.as_slice() {
                [column, placement] => (*column, *placement, *column),
                [column, placement, alias] => (*column, *placement, *alias),
                _ => {
                    let why = "expected COLUMN:PLACEMENT or COLUMN:PLACEMENT:ALIAS";
                    return Err(invalid(key, entry, why));
                }
            };
            match placement.to_ascii_lowercase().as_str() {
                "header" if alias == column => self.arg("--header-column", column),
                "header" => self.arg("--header-column", format!("{column}:{alias}")),
                "envelope" => envelope.push(entry),
                "partition" => partition.push(entry),
                _ => {
                    let why = "the placement must be header, envelope or partition";
                    return Err(invalid(key, entry, why));
                }
            }
        }
        self.warn_all(&envelope, |list| {
            format!("{key} envelope placements not supported ({list}): Debezium's value was a struct {{\"payload\": ..., ALIAS: ...}}; the relay's value is the payload alone. Place them as headers instead (--header-column COLUMN:ALIAS) and have consumers read the header")
        });
        self.warn_all(&partition, |list| {
            format!("{key} partition placements not supported ({list}): Debezium took the record's partition from the column; the relay partitions by the key's murmur2 hash")
        });
        Ok(!envelope.is_empty())
    }

    fn tombstones(&mut self, prefix: &str, value_converter: &Converter, envelope: bool) {
        let on_empty = self
            .take(&format!("{prefix}route.tombstone.on.empty.payload"))
            .is_some_and(|v| v.eq_ignore_ascii_case("true"));
        if on_empty {
            self.warn(format!(
                "{prefix}route.tombstone.on.empty.payload=true: Debezium also turned empty and whitespace-only payloads into tombstones; the relay sends those bytes as they are (only a NULL payload becomes a tombstone)"
            ));
            return;
        }
        let debezium = match value_converter {
            _ if envelope => "the envelope struct with \"payload\": null, not a tombstone",
            // StringConverter and ByteArrayConverter turn a null value into a
            // null record value: a tombstone, exactly what the relay sends.
            Converter::Raw => return,
            Converter::Json { schemas: true } => {
                "with JsonConverter {\"schema\": ..., \"payload\": null}, not a tombstone"
            }
            Converter::Json { schemas: false } => {
                "with JsonConverter (schemas disabled) the JSON text null, not a tombstone"
            }
            Converter::Unset => {
                "a tombstone with StringConverter/ByteArrayConverter, but JSON (null, or a schema envelope) with the JsonConverter Connect workers commonly default to"
            }
            Converter::Other(_) => "whatever the value converter made of a null value",
        };
        self.warn(format!(
            "{prefix}route.tombstone.on.empty.payload=false (Debezium's default): for a NULL payload Debezium still emitted a record typed with the payload column's schema, which became {debezium}. The relay always sends a NULL payload as a tombstone (null value)"
        ));
    }

    fn converter_warnings(&mut self, key: &Converter, value: &Converter) {
        let unset: Vec<&str> = [("key.converter", key), ("value.converter", value)]
            .into_iter()
            .filter(|(_, c)| **c == Converter::Unset)
            .map(|(name, _)| name)
            .collect();
        if !unset.is_empty() {
            self.warn(format!(
                "{} not in the connector config, so the Connect worker's converter applied (Kafka's sample worker config uses JsonConverter with schemas.enable=true). The relay sends the key column's raw text and the payload column's bytes, like StringConverter; if the worker used JsonConverter, consumers will see the changes described for it",
                unset.join(" and ")
            ));
        }
        let partition_note = "since the partition is the murmur2 hash of the key bytes, an aggregate's records after the switch may land on a different partition than before it";
        match key {
            Converter::Json { schemas: true } => self.warn(format!(
                "key.converter=JsonConverter with schemas.enable=true: Debezium's keys were {{\"schema\": ..., \"payload\": \"KEY\"}}; the relay's key is the raw text KEY. Consumers that parse keys must change, and {partition_note}"
            )),
            Converter::Json { schemas: false } => self.warn(format!(
                "key.converter=JsonConverter: Debezium's keys were JSON strings (\"KEY\", quoted); the relay's key is the raw text KEY. Consumers that parse keys must change, and {partition_note}"
            )),
            Converter::Other(class) => self.warn(format!(
                "key.converter={class}: the relay's key is the raw text, not that converter's format (a schema-registry deserializer will reject it), and {partition_note}"
            )),
            Converter::Raw | Converter::Unset => {}
        }
        match value {
            Converter::Json { schemas: true } => self.warn(
                "value.converter=JsonConverter with schemas.enable=true: Debezium's values were {\"schema\": ..., \"payload\": ...} envelopes holding the payload as a JSON string; the relay's value is the payload column's bytes alone (for json/jsonb, the document itself). Consumers must stop unwrapping the envelope",
            ),
            Converter::Json { schemas: false } => self.warn(
                "value.converter=JsonConverter with schemas.enable=false: unless the payload was expanded, Debezium's values were the payload as a JSON-quoted string (\"{\\\"a\\\":1}\"; bytea as base64); the relay's value is the payload column's bytes ({\"a\":1}; bytea raw). Consumers that decode twice must change",
            ),
            Converter::Other(class) => self.warn(format!(
                "value.converter={class}: the relay's value is the payload column's bytes, not that converter's format (a schema-registry deserializer will reject it)"
            )),
            Converter::Raw | Converter::Unset => {}
        }
    }

    fn header_converter(&mut self) {
        let class = self.take("header.converter");
        self.take_prefixed("header.converter.");
        let text_like = |class: &&str| {
            matches!(
                class.rsplit('.').next(),
                Some("SimpleHeaderConverter" | "StringConverter")
            )
        };
        if let Some(class) = class.filter(|class| !text_like(class)) {
            self.warn(format!(
                "header.converter={class}: the relay writes header values as the column's text, like SimpleHeaderConverter"
            ));
        }
    }

    fn producer_overrides(&mut self) {
        let mut dropped = Vec::new();
        for (name, value) in self.take_prefixed("producer.override.") {
            if let Some(hint) = java_only_producer(name) {
                dropped.push(format!("{name} ({hint})"));
                continue;
            }
            if value.contains(';') {
                dropped.push(format!(
                    "{name} (its value contains ';', which separates -X values; pass it yourself)"
                ));
                continue;
            }
            let note = match name {
                "max.request.size" => {
                    Some("max.request.size became librdkafka's message.max.bytes".to_owned())
                }
                "acks" if !matches!(value, "all" | "-1") => Some(format!(
                    "acks={value} weakens the relay's acks=all: an acknowledged event may be lost if the leader fails"
                )),
                "enable.idempotence" if value.eq_ignore_ascii_case("false") => Some(
                    "enable.idempotence=false lets retries duplicate or reorder records".into(),
                ),
                "delivery.timeout.ms" => Some(format!(
                    "delivery.timeout.ms={value} is librdkafka's message.timeout.ms, which the relay sets to 0 (no deadline); an expired delivery stops the relay"
                )),
                _ => None,
            };
            if let Some(note) = note {
                self.warn(format!("producer.override: {note}"));
            }
            let name = if name == "max.request.size" {
                "message.max.bytes"
            } else {
                name
            };
            self.arg("-X", format!("{name}={value}"));
        }
        self.warn_all(&dropped, |list| {
            format!("producer.override properties dropped (Java client only; librdkafka would refuse to start): {list}")
        });
    }

    fn error_handling(&mut self) {
        let tolerance_all = self
            .take("errors.tolerance")
            .is_some_and(|v| v.eq_ignore_ascii_case("all"));
        let dlq = self.take("errors.deadletterqueue.topic.name");
        self.take_prefixed("errors.deadletterqueue.");
        if !tolerance_all && dlq.is_none() {
            return;
        }
        let topic = dlq.unwrap_or("TOPIC");
        self.warn(format!(
            "errors.tolerance / errors.deadletterqueue.*: Kafka Connect's dead-letter queue applies to sink connectors only, and with errors.tolerance=all a source connector skipped records that failed conversion or transformation. The relay never skips an event silently: by default it stops before acknowledging one it cannot deliver; add --on-poison dead-letter --dead-letter-topic {topic} to divert such events instead"
        ));
    }

    fn leftovers(&mut self) {
        // Other transforms and predicates were warned about by name.
        self.take_prefixed("transforms.");
        self.take_prefixed("predicates");
        let heartbeat: Vec<&str> = self
            .take_prefixed("heartbeat.")
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        let ignored: Vec<String> = self
            .take_prefixed("")
            .into_iter()
            .map(|(key, _)| match ignored_note(key) {
                Some(note) => format!("{key} ({note})"),
                None => key.to_owned(),
            })
            .collect();
        if !heartbeat.is_empty() {
            let interval = self
                .config
                .get("heartbeat.interval.ms")
                .and_then(|v| v.trim().parse::<u64>().ok())
                .filter(|ms| *ms > 0);
            let keys = format!("heartbeat.{}", heartbeat.join(", heartbeat."));
            if let Some(ms) = interval {
                self.arg("--heartbeat-interval", format!("{ms}ms"));
                self.warn(format!(
                    "{keys}: mapped to --heartbeat-interval {ms}ms, which writes a non-transactional logical decoding message instead of running heartbeat.action.query; the relay also acknowledges keepalive positions whenever nothing is in flight, so a quiet outbox does not pin WAL even without it"
                ));
            } else {
                self.warn(format!(
                    "{keys} not needed: when nothing is in flight the relay acknowledges the server's keepalive positions, so a quiet outbox does not pin WAL (add --heartbeat-interval for a database that writes nothing at all)"
                ));
            }
        }
        self.warn_all(&ignored, |list| {
            format!("ignored (no equivalent in the relay): {list}")
        });
    }
}

/// Recognises the regexes equivalent to the default: an optional `^`/`$`
/// around `.*` or `.+`, bare, in a group, or in the `routedByValue` group.
/// Returns the number of groups (0 or 1) and whether group 1 is `routedByValue`.
fn route_regex(raw: &str) -> Option<(u32, bool)> {
    let raw = raw.trim();
    let inner = raw.strip_prefix('^').unwrap_or(raw);
    match inner.strip_suffix('$').unwrap_or(inner) {
        ".*" | ".+" => Some((0, false)),
        "(.*)" | "(.+)" => Some((1, false)),
        "(?<routedByValue>.*)" | "(?<routedByValue>.+)" => Some((1, true)),
        _ => None,
    }
}

/// Rewrites a Java `Matcher` replacement (`${name}`, `$N`, `\x` escapes) as a
/// topic template, where every group reference is the whole routing value.
fn convert_replacement(replacement: &str, (groups, named): (u32, bool)) -> Result<String, String> {
    let no_group = |group: &str| {
        format!("${group} names no group of route.topic.regex; use ${{routedByValue}}")
    };
    let mut out = String::with_capacity(replacement.len());
    let mut chars = replacement.chars().peekable();
    while let Some(c) = chars.next() {
        let escaped = matches!(c, '\\' | '$').then(|| chars.next()).flatten();
        match (c, escaped) {
            ('\\', Some('$')) => out.push_str("$$"),
            ('\\', Some(other)) => out.push(other),
            ('\\', None) => return Err("ends with a lone backslash".to_owned()),
            ('$', Some('{')) => {
                let name: String = chars.by_ref().take_while(|c| *c != '}').collect();
                if name != "routedByValue" || !named {
                    return Err(no_group(&format!("{{{name}}}")));
                }
                out.push_str(ROUTED_BY_VALUE);
            }
            ('$', Some(digit)) if digit.is_ascii_digit() => {
                let mut group = digit.to_digit(10).unwrap_or_default();
                // Java keeps reading digits while the number is still a group.
                while let Some(next) = chars
                    .peek()
                    .and_then(|c| c.to_digit(10))
                    .filter(|next| group * 10 + next <= groups)
                {
                    group = group * 10 + next;
                    chars.next();
                }
                if group > groups {
                    return Err(no_group(&group.to_string()));
                }
                out.push_str(ROUTED_BY_VALUE);
            }
            ('$', _) => {
                return Err(
                    "a '$' must start ${routedByValue} or a group number; write \\$ for a literal dollar"
                        .to_owned(),
                );
            }
            (other, _) => out.push(other),
        }
    }
    Ok(out)
}

/// `${provider:path:key}`, Kafka Connect's config-provider syntax.
fn is_config_provider(value: &str) -> bool {
    let inner = value
        .split_once("${")
        .and_then(|(_, rest)| rest.split_once('}'));
    inner.is_some_and(|(inner, _)| inner.contains(':'))
}

#[cfg(test)]
mod tests;
