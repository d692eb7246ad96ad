//! PURE: a Debezium Postgres connector config (with the Outbox Event Router)
//! turned into the relay's flags.
//!
//! A team leaving Kafka Connect has a connector config, either the JSON body
//! they `POST`ed to `/connectors` or a `.properties` file. [`parse`] reads
//! either into a flat key/value map, [`import`] maps it onto flags, and
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
//!   [`DebeziumError`] that says what to do. Warnings name keys, never values,
//!   so secrets in the config do not leak into them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::PostgresConnInfo;
use super::PostgresUrlError;
use crate::outbox::{TableName, TopicTemplate};

const POSTGRES_CONNECTOR: &str = "io.debezium.connector.postgresql.PostgresConnector";
const EVENT_ROUTER: &str = "io.debezium.transforms.outbox.EventRouter";
const DEFAULT_ROUTE_REGEX: &str = "(?<routedByValue>.*)";
const ROUTED_BY_VALUE: &str = "${routedByValue}";

/// The syntax of a connector config file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceFormat {
    /// `{"name": ..., "config": {...}}` (the REST body) or the bare config object.
    Json,
    /// Java `.properties` (standalone Connect, or a hand-kept file).
    Properties,
}

/// A connector config that cannot be imported; each message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum DebeziumError {
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
    #[error("connector config line {line}: {reason}")]
    Properties {
        /// 1-based line where the logical line starts.
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// Not Debezium's Postgres connector.
    #[error(
        "connector.class is {class:?}, not {POSTGRES_CONNECTOR}: outbox-relay replaces only Debezium's Postgres connector"
    )]
    NotPostgres {
        /// The class found.
        class: String,
    },
    /// A logical decoding plugin other than pgoutput.
    #[error(
        "plugin.name={plugin}: the relay decodes pgoutput only, and a {plugin} slot cannot be read as pgoutput. Set plugin.name=pgoutput and slot.name to a new slot name (the relay creates it), then import again; run the relay alongside Debezium until it streams, then stop Debezium (consumers deduplicate on the id header)"
    )]
    UnsupportedPlugin {
        /// The plugin configured.
        plugin: String,
    },
    /// A table list entry that is a regular expression.
    #[error(
        "{key} entry {entry:?} is a regular expression; the relay needs explicit table names: list each outbox table as schema.table (a `\\.` escape is fine)"
    )]
    TableRegex {
        /// `table.include.list` or its old name `table.whitelist`.
        key: &'static str,
        /// The entry.
        entry: String,
    },
    /// A required key is absent.
    #[error("{key} is missing: {hint}")]
    Missing {
        /// The key.
        key: &'static str,
        /// What to add.
        hint: &'static str,
    },
    /// The connector does not use the Outbox Event Router.
    #[error(
        "no transform of type {EVENT_ROUTER} in `transforms`: this connector publishes raw change events, which the relay does not produce; it replaces only the Outbox Event Router"
    )]
    NoEventRouter,
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
        source: PostgresUrlError,
    },
}

/// The result of [`import`]: flags in command-line order, and what differs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Imported {
    /// `(flag, value)` pairs, e.g. `("--slot", "debezium")` or `("-X", "linger.ms=5")`.
    pub args: Vec<(String, String)>,
    /// One sentence per option that is ignored or behaves differently.
    pub warnings: Vec<String>,
}

/// Reads a connector config into a flat key/value map.
///
/// JSON values may be strings, numbers or booleans (stringified); `null` is
/// treated as unset. Properties follow `java.util.Properties.load`: `key=value`,
/// `key: value` or `key value`, `#`/`!` comments, a trailing backslash
/// continues the line, backslash escapes including `\uXXXX`.
pub fn parse(text: &str, format: SourceFormat) -> Result<BTreeMap<String, String>, DebeziumError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    match format {
        SourceFormat::Json => parse_json(text),
        SourceFormat::Properties => parse_properties(text),
    }
}

/// Guesses the format: by extension (`.json`, `.properties`), else JSON when
/// the first non-blank character is `{`.
pub fn detect_format(path: &Path, text: &str) -> SourceFormat {
    let extension = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    match extension.as_deref() {
        Some("json") => SourceFormat::Json,
        Some("properties" | "props") => SourceFormat::Properties,
        _ if text
            .trim_start_matches('\u{feff}')
            .trim_start()
            .starts_with('{') =>
        {
            SourceFormat::Json
        }
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
        used: BTreeSet::new(),
        args: Vec::new(),
        warnings: Vec::new(),
    };
    importer.run()?;
    Ok(Imported {
        args: importer.args,
        warnings: importer.warnings,
    })
}

/// The equivalent command line, shell-quoted, one flag per line, followed by
/// the warnings as `#` comments.
pub fn explain(imported: &Imported) -> String {
    let mut out = String::from("outbox-relay");
    for (flag, value) in &imported.args {
        out.push_str(" \\\n  ");
        out.push_str(flag);
        out.push(' ');
        out.push_str(&shell_quote(value));
    }
    out.push('\n');
    if !imported.warnings.is_empty() {
        out.push_str("# Differences from the Debezium connector:\n");
        for warning in &imported.warnings {
            out.push_str("# - ");
            out.push_str(warning);
            out.push('\n');
        }
    }
    out
}

fn parse_json(text: &str) -> Result<BTreeMap<String, String>, DebeziumError> {
    use serde_json::Value;
    let value: Value = serde_json::from_str(text).map_err(|source| DebeziumError::Json {
        line: source.line(),
        column: source.column(),
        source,
    })?;
    let Value::Object(mut object) = value else {
        return Err(DebeziumError::JsonShape);
    };
    let object = match object.remove("config") {
        Some(Value::Object(config)) => config,
        Some(other) => {
            object.insert("config".to_owned(), other);
            object
        }
        None => object,
    };
    let mut out = BTreeMap::new();
    for (key, value) in object {
        let text = match value {
            Value::String(s) => s,
            Value::Number(n) => n.to_string(),
            Value::Bool(b) => b.to_string(),
            Value::Null => continue,
            Value::Array(_) => {
                return Err(DebeziumError::JsonValue {
                    key,
                    kind: "an array",
                });
            }
            Value::Object(_) => {
                return Err(DebeziumError::JsonValue {
                    key,
                    kind: "an object",
                });
            }
        };
        out.insert(key, text);
    }
    Ok(out)
}

fn is_property_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\u{c}')
}

fn parse_properties(text: &str) -> Result<BTreeMap<String, String>, DebeziumError> {
    let mut out = BTreeMap::new();
    let mut lines = text.lines().enumerate();
    while let Some((index, natural)) = lines.next() {
        let line = index + 1;
        let mut current = natural.trim_start_matches(is_property_space);
        if current.is_empty() || current.starts_with('#') || current.starts_with('!') {
            continue;
        }
        let mut logical = String::new();
        loop {
            let trailing = current.len() - current.trim_end_matches('\\').len();
            if trailing % 2 == 0 {
                logical.push_str(current);
                break;
            }
            logical.push_str(&current[..current.len() - 1]);
            match lines.next() {
                Some((_, next)) => current = next.trim_start_matches(is_property_space),
                None => break,
            }
        }
        let (key, value) = split_property(&logical, line)?;
        out.insert(key, value);
    }
    Ok(out)
}

/// Splits a logical line at the first unescaped `=`, `:` or blank.
fn split_property(logical: &str, line: usize) -> Result<(String, String), DebeziumError> {
    let mut key_end = logical.len();
    let mut value_start = logical.len();
    let mut ended_by_space = false;
    let mut escaped = false;
    for (i, c) in logical.char_indices() {
        if escaped {
            escaped = false;
            continue;
        }
        match c {
            '\\' => escaped = true,
            '=' | ':' => {
                key_end = i;
                value_start = i + 1;
                break;
            }
            c if is_property_space(c) => {
                key_end = i;
                value_start = i + c.len_utf8();
                ended_by_space = true;
                break;
            }
            _ => {}
        }
    }
    let mut rest = logical
        .get(value_start..)
        .unwrap_or_default()
        .trim_start_matches(is_property_space);
    if ended_by_space && let Some(after) = rest.strip_prefix(['=', ':']) {
        rest = after.trim_start_matches(is_property_space);
    }
    let key = unescape_property(logical.get(..key_end).unwrap_or_default(), line)?;
    let value = unescape_property(rest, line)?;
    Ok((key, value))
}

fn unescape_property(raw: &str, line: usize) -> Result<String, DebeziumError> {
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('t') => out.push('\t'),
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some('f') => out.push('\u{c}'),
            Some('u') => {
                let hex: String = chars.by_ref().take(4).collect();
                let decoded = (hex.len() == 4 && hex.chars().all(|h| h.is_ascii_hexdigit()))
                    .then(|| u32::from_str_radix(&hex, 16).ok())
                    .flatten()
                    .and_then(char::from_u32);
                match decoded {
                    Some(ch) => out.push(ch),
                    None => {
                        return Err(DebeziumError::Properties {
                            line,
                            reason: format!(
                                "malformed \\u escape \"\\u{hex}\": expected four hex digits naming a character (write non-ASCII characters as themselves)"
                            ),
                        });
                    }
                }
            }
            Some(other) => out.push(other),
            None => {}
        }
    }
    Ok(out)
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

/// Connector keys with no equivalent, and why, for the "ignored" warning.
const IGNORED_NOTES: &[(&str, &str)] = &[
    (
        "snapshot.mode",
        "the relay never snapshots; it streams from the slot's confirmed position",
    ),
    ("topic.prefix", "outbox topics come from --topic-template"),
    (
        "database.server.name",
        "outbox topics come from --topic-template",
    ),
    ("tasks.max", "run one relay per slot"),
    ("slot.drop.on.stop", "the relay never drops its slot"),
    (
        "binary.handling.mode",
        "bytea payloads are sent as raw bytes",
    ),
    (
        "max.batch.size",
        "see --max-in-flight-events and --max-in-flight-bytes",
    ),
    (
        "max.queue.size",
        "see --max-in-flight-events and --max-in-flight-bytes",
    ),
    (
        "tombstones.on.delete",
        "deletes on the outbox table are ignored",
    ),
    ("skipped.operations", "the relay relays inserts only"),
    (
        "schema.include.list",
        "the relay reads exactly the --table tables",
    ),
    (
        "table.exclude.list",
        "the relay reads exactly the --table tables",
    ),
];

/// Java-only producer properties that librdkafka rejects at start-up.
const JAVA_ONLY_PRODUCER: &[(&str, &str)] = &[
    ("key.serializer", "the relay sends the key's raw text"),
    ("value.serializer", "the relay sends the payload's bytes"),
    (
        "partitioner.class",
        "the relay uses murmur2_random, the Java client's default hash",
    ),
    ("interceptor.classes", "no librdkafka equivalent"),
    (
        "buffer.memory",
        "librdkafka's is queue.buffering.max.kbytes",
    ),
    ("max.block.ms", "no librdkafka equivalent"),
    (
        "sasl.jaas.config",
        "use -X sasl.username=... -X sasl.password=...",
    ),
    (
        "transactional.id",
        "the relay does not use Kafka transactions",
    ),
    ("metric.reporters", "no librdkafka equivalent"),
];

/// Java-only producer property prefixes (JKS stores; librdkafka reads PEM).
const JAVA_ONLY_PRODUCER_PREFIXES: &[(&str, &str)] = &[
    (
        "ssl.truststore.",
        "use -X ssl.ca.location=CA.pem (librdkafka reads PEM files)",
    ),
    (
        "ssl.keystore.",
        "use -X ssl.certificate.location=... -X ssl.key.location=... (PEM)",
    ),
];

struct Importer<'a> {
    config: &'a BTreeMap<String, String>,
    used: BTreeSet<&'a str>,
    args: Vec<(String, String)>,
    warnings: Vec<String>,
}

impl<'a> Importer<'a> {
    /// The trimmed value of `key` (marked as handled); empty counts as unset.
    fn take(&mut self, key: &str) -> Option<&'a str> {
        let (k, v) = self.config.get_key_value(key)?;
        self.used.insert(k.as_str());
        Some(v.trim()).filter(|v| !v.is_empty())
    }

    /// Every `(key, value)` under `prefix` (marked as handled), prefix stripped.
    fn take_prefixed(&mut self, prefix: &str) -> Vec<(&'a str, &'a str)> {
        let config = self.config;
        let found: Vec<(&'a String, &'a String)> = config
            .range::<str, _>((
                std::ops::Bound::Included(prefix),
                std::ops::Bound::Unbounded,
            ))
            .take_while(|(k, _)| k.starts_with(prefix))
            .collect();
        found
            .into_iter()
            .map(|(k, v)| {
                self.used.insert(k.as_str());
                (k.get(prefix.len()..).unwrap_or_default(), v.trim())
            })
            .collect()
    }

    fn required(
        &mut self,
        key: &'static str,
        hint: &'static str,
    ) -> Result<&'a str, DebeziumError> {
        self.take(key).ok_or(DebeziumError::Missing { key, hint })
    }

    fn arg(&mut self, flag: &str, value: impl Into<String>) {
        self.args.push((flag.to_owned(), value.into()));
    }

    fn warn(&mut self, warning: impl Into<String>) {
        self.warnings.push(warning.into());
    }

    fn run(&mut self) -> Result<(), DebeziumError> {
        self.used
            .extend(self.config.get_key_value("name").map(|(k, _)| k.as_str()));
        self.connector_class()?;
        let pgoutput = self.plugin()?;
        let url = self.postgres_url()?;
        self.arg("--postgres-url", url);
        self.kafka_brokers();
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

    fn connector_class(&mut self) -> Result<(), DebeziumError> {
        let class = self.required(
            "connector.class",
            "add connector.class=io.debezium.connector.postgresql.PostgresConnector",
        )?;
        // Kafka Connect also accepts the simple class name and its alias without `Connector`.
        if matches!(class, POSTGRES_CONNECTOR | "PostgresConnector" | "Postgres") {
            Ok(())
        } else {
            Err(DebeziumError::NotPostgres {
                class: class.to_owned(),
            })
        }
    }

    /// Whether Debezium used pgoutput (and so may have created a publication).
    fn plugin(&mut self) -> Result<bool, DebeziumError> {
        match self.take("plugin.name") {
            Some(plugin) if plugin.eq_ignore_ascii_case("pgoutput") => Ok(true),
            Some(plugin) => Err(DebeziumError::UnsupportedPlugin {
                plugin: plugin.to_owned(),
            }),
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
        let port = self.take("database.port");
        for (key, value) in [
            ("database.hostname", Some(host)),
            ("database.user", Some(user)),
            ("database.dbname", Some(dbname)),
            ("database.port", port),
        ] {
            if let Some(value) = value.filter(|v| is_config_provider(v)) {
                return Err(DebeziumError::Invalid {
                    key: key.to_owned(),
                    value: value.to_owned(),
                    reason:
                        "a Kafka Connect config-provider reference; resolve it and import again"
                            .to_owned(),
                });
            }
        }
        let port = match port {
            None => 5432,
            Some(raw) => raw.parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(|| {
                DebeziumError::Invalid {
                    key: "database.port".to_owned(),
                    value: raw.to_owned(),
                    reason: "expected a TCP port number".to_owned(),
                }
            })?,
        };
        // The password is used as written: Connect does not trim it either.
        let password = self
            .config
            .get_key_value("database.password")
            .map(|(k, v)| {
                self.used.insert(k.as_str());
                v.as_str()
            })
            .filter(|v| !v.is_empty());
        let password = match password {
            Some(p) if is_config_provider(p) => {
                self.warn(
                    "database.password is a Kafka Connect config-provider reference (${provider:...}), which the relay cannot resolve, so it is left out of --postgres-url. Pass the password with --postgres-password-file PATH (a mounted secret) or the OUTBOX_RELAY_POSTGRES_PASSWORD environment variable",
                );
                None
            }
            other => other,
        };
        let mut url = format!("postgres://{}", percent_encode(user));
        if let Some(password) = password {
            url.push(':');
            url.push_str(&percent_encode(password));
        }
        url.push('@');
        if host.contains(':') && !host.starts_with('[') {
            url.push_str(&format!("[{host}]"));
        } else {
            url.push_str(host);
        }
        url.push_str(&format!(":{port}/{}", percent_encode(dbname)));
        let mut query = url::form_urlencoded::Serializer::new(String::new());
        let mut any_query = false;
        for (key, param) in [
            ("database.sslmode", "sslmode"),
            ("database.sslrootcert", "sslrootcert"),
            ("database.sslcert", "sslcert"),
            ("database.sslkey", "sslkey"),
        ] {
            if let Some(value) = self.take(key) {
                query.append_pair(param, value);
                any_query = true;
            }
        }
        if any_query {
            url.push('?');
            url.push_str(&query.finish());
        }
        let info = PostgresConnInfo::parse(&url)
            .map_err(|source| DebeziumError::PostgresUrl { source })?;
        let _ = info;
        Ok(url)
    }

    fn kafka_brokers(&mut self) {
        match self.take("producer.override.bootstrap.servers") {
            Some(brokers) => self.arg("--kafka-brokers", brokers),
            None => self.warn(
                "add --kafka-brokers HOST:PORT,...: the brokers are not part of a connector config (they are the Connect worker's bootstrap.servers)",
            ),
        }
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
            let name = literal_table_name(key, entry)?;
            TableName::parse(&name).map_err(|reason| DebeziumError::Invalid {
                key: key.to_owned(),
                value: entry.to_owned(),
                reason,
            })?;
            if !name.contains('.') {
                unqualified.push(name.clone());
            }
            if name.chars().any(|c| c.is_ascii_uppercase()) {
                mixed_case.push(name.clone());
            }
            self.arg("--table", name);
        }
        if !unqualified.is_empty() {
            self.warn(format!(
                "{key} entries without a schema ({}): Debezium matches entries against schema.table; the relay reads them as public.TABLE",
                unqualified.join(", ")
            ));
        }
        if !mixed_case.is_empty() {
            self.warn(format!(
                "{key} entries with upper-case letters ({}): Debezium matched them case-insensitively; the relay uses the name exactly (Postgres folds unquoted names to lower case)",
                mixed_case.join(", ")
            ));
        }
        Ok(())
    }

    fn publication_mode(&mut self, publication: &str, pgoutput: bool) {
        let mode = self.take("publication.autocreate.mode");
        if !pgoutput {
            return;
        }
        match mode.unwrap_or("all_tables") {
            "all_tables" => self.warn(format!(
                "publication.autocreate.mode=all_tables (Debezium's default): Debezium created {publication} FOR ALL TABLES. The relay accepts an existing all-tables publication, but then receives every table's changes and drops those outside --table; it creates a publication only when missing, as FOR TABLE <tables> WITH (publish = 'insert'). To narrow it, pass a new --publication"
            )),
            "no_tables" => self.warn(format!(
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
        let names: Vec<&str> = self
            .take("transforms")
            .map(|list| {
                list.split(',')
                    .map(str::trim)
                    .filter(|n| !n.is_empty())
                    .collect()
            })
            .unwrap_or_default();
        let mut router = None;
        for name in names {
            let kind = self.take(&format!("transforms.{name}.type"));
            match (kind, router) {
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
        let Some(name) = router else {
            return Err(DebeziumError::NoEventRouter);
        };
        let prefix = format!("transforms.{name}.");
        let option = |this: &mut Self, suffix: &str| this.take(&format!("{prefix}{suffix}"));

        let route_by = option(self, "route.by.field").unwrap_or("aggregatetype");
        let regex = option(self, "route.topic.regex");
        let replacement =
            option(self, "route.topic.replacement").unwrap_or("outbox.event.${routedByValue}");
        let template = self.topic_template(&prefix, regex, replacement)?;
        let key = option(self, "table.field.event.key").unwrap_or("aggregateid");
        let id = option(self, "table.field.event.id").unwrap_or("id");
        let payload = option(self, "table.field.event.payload").unwrap_or("payload");
        let timestamp = option(self, "table.field.event.timestamp");
        self.arg("--route-by", route_by);
        self.arg("--topic-template", template);
        self.arg("--key-column", key);
        self.arg("--id-column", id);
        self.arg("--payload-column", payload);
        match timestamp {
            Some(column) => self.arg("--timestamp-column", column),
            None => self.warn(format!(
                "{prefix}table.field.event.timestamp is not set: Debezium stamped records with the time it processed the change (the event's ts_ms); the relay uses the transaction's commit time"
            )),
        }
        let envelope = self.placements(&prefix)?;

        let expand = option(self, "table.expand.json.payload")
            .is_some_and(|v| v.eq_ignore_ascii_case("true"));
        if expand {
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
        if option(self, "table.json.payload.null.behavior").is_some() {
            self.warn(format!(
                "{prefix}table.json.payload.null.behavior not applied: it shapes table.expand.json.payload, which the relay does not do; JSON nulls stay in the payload text"
            ));
        }
        self.tombstones(&prefix, value_converter, envelope);

        for suffix in ["table.op.invalid.behavior", "debezium.op.invalid.behavior"] {
            match option(self, suffix) {
                Some(b) if b.eq_ignore_ascii_case("error") || b.eq_ignore_ascii_case("fatal") => {
                    self.warn(format!(
                        "{prefix}{suffix}={b} not supported: the relay ignores UPDATE and DELETE on the outbox table with one warning per run and goes on"
                    ));
                }
                _ => {}
            }
        }
        if option(self, "table.fields.additional.error.on.missing")
            .is_some_and(|v| v.eq_ignore_ascii_case("false"))
        {
            self.warn(format!(
                "{prefix}table.fields.additional.error.on.missing=false not supported: the relay refuses a table that lacks a --header-column column"
            ));
        }
        for (suffix, what) in [
            (
                "table.field.event.schema.version",
                "the relay sends no Connect schema, so there is no schema version to set",
            ),
            (
                "table.field.event.type",
                "the relay has no event-type field; route or add headers with --route-by / --header-column",
            ),
        ] {
            if option(self, suffix).is_some() {
                self.warn(format!("{prefix}{suffix} not supported: {what}"));
            }
        }
        let tracing: Vec<&str> = self
            .take_prefixed(&format!("{prefix}tracing."))
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        if !tracing.is_empty() {
            self.warn(format!(
                "{prefix}tracing.{} not supported: the relay does not activate tracing spans from an outbox column",
                tracing.join(", tracing.")
            ));
        }
        if let Some(predicate) = option(self, "predicate") {
            option(self, "negate");
            self.warn(format!(
                "{prefix}predicate={predicate} not applied: the relay routes every insert into the --table tables"
            ));
        }
        option(self, "type");
        let unknown: Vec<&str> = self
            .take_prefixed(&prefix)
            .into_iter()
            .filter(|(k, _)| !KNOWN_ROUTER_OPTIONS.contains(k) && !k.starts_with("tracing."))
            .map(|(k, _)| k)
            .collect();
        if !unknown.is_empty() {
            self.warn(format!(
                "unknown EventRouter options not applied: {prefix}{}",
                unknown.join(&format!(", {prefix}"))
            ));
        }
        Ok(())
    }

    fn topic_template(
        &mut self,
        prefix: &str,
        regex: Option<&str>,
        replacement: &str,
    ) -> Result<String, DebeziumError> {
        let shape = match regex {
            None => RouteRegex {
                groups: 1,
                named: true,
            },
            Some(raw) => {
                let shape = route_regex(raw).ok_or_else(|| DebeziumError::Invalid {
                    key: format!("{prefix}route.topic.regex"),
                    value: raw.to_owned(),
                    reason: "the relay has no regex routing: its topic is --topic-template, where ${routedByValue} is the whole route-by value and ${COLUMN} any column. Remove route.topic.regex and write the topic as route.topic.replacement, or add a column holding the topic part and route by it".to_owned(),
                })?;
                if raw.trim() != DEFAULT_ROUTE_REGEX {
                    self.warn(format!(
                        "{prefix}route.topic.regex is treated as the default {DEFAULT_ROUTE_REGEX}: the relay has no regex routing, and this pattern captures the whole route-by value"
                    ));
                }
                shape
            }
        };
        let template =
            convert_replacement(replacement, shape).map_err(|reason| DebeziumError::Invalid {
                key: format!("{prefix}route.topic.replacement"),
                value: replacement.to_owned(),
                reason,
            })?;
        TopicTemplate::parse(&template).map_err(|reason| DebeziumError::Invalid {
            key: format!("{prefix}route.topic.replacement"),
            value: replacement.to_owned(),
            reason,
        })?;
        Ok(template)
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
                    return Err(DebeziumError::Invalid {
                        key,
                        value: entry.to_owned(),
                        reason: "expected COLUMN:PLACEMENT or COLUMN:PLACEMENT:ALIAS".to_owned(),
                    });
                }
            };
            match placement.to_ascii_lowercase().as_str() {
                "header" if alias == column => self.arg("--header-column", column),
                "header" => self.arg("--header-column", format!("{column}:{alias}")),
                "envelope" => envelope.push(entry),
                "partition" => partition.push(entry),
                _ => {
                    return Err(DebeziumError::Invalid {
                        key,
                        value: entry.to_owned(),
                        reason: "the placement must be header, envelope or partition".to_owned(),
                    });
                }
            }
        }
        if !envelope.is_empty() {
            self.warn(format!(
                "{key} envelope placements not supported ({}): Debezium's value was a struct {{\"payload\": ..., ALIAS: ...}}; the relay's value is the payload alone. Place them as headers instead (--header-column COLUMN:ALIAS) and have consumers read the header",
                envelope.join(", ")
            ));
        }
        if !partition.is_empty() {
            self.warn(format!(
                "{key} partition placements not supported ({}): Debezium took the record's partition from the column; the relay partitions by the key's murmur2 hash",
                partition.join(", ")
            ));
        }
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
        let debezium = if envelope {
            "the envelope struct with \"payload\": null, not a tombstone"
        } else {
            match value_converter {
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
            }
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
        if let Some(class) = class {
            let simple = class.rsplit('.').next().unwrap_or(class);
            if !matches!(simple, "SimpleHeaderConverter" | "StringConverter") {
                self.warn(format!(
                    "header.converter={class}: the relay writes header values as the column's text, like SimpleHeaderConverter"
                ));
            }
        }
    }

    fn producer_overrides(&mut self) {
        let mut dropped = Vec::new();
        let mut notes = Vec::new();
        for (name, value) in self.take_prefixed("producer.override.") {
            if name == "bootstrap.servers" {
                continue;
            }
            let java_only = JAVA_ONLY_PRODUCER
                .iter()
                .find(|(n, _)| *n == name)
                .or_else(|| {
                    JAVA_ONLY_PRODUCER_PREFIXES
                        .iter()
                        .find(|(p, _)| name.starts_with(p))
                });
            if let Some((_, hint)) = java_only {
                dropped.push(format!("{name} ({hint})"));
                continue;
            }
            if value.contains(';') {
                dropped.push(format!(
                    "{name} (its value contains ';', which separates -X values; pass it yourself)"
                ));
                continue;
            }
            let name = match name {
                "max.request.size" => {
                    notes.push("max.request.size became librdkafka's message.max.bytes".to_owned());
                    "message.max.bytes"
                }
                "acks" if !matches!(value, "all" | "-1") => {
                    notes.push(format!(
                        "acks={value} weakens the relay's acks=all: an acknowledged event may be lost if the leader fails"
                    ));
                    name
                }
                "enable.idempotence" if value.eq_ignore_ascii_case("false") => {
                    notes.push(
                        "enable.idempotence=false lets retries duplicate or reorder records"
                            .to_owned(),
                    );
                    name
                }
                "delivery.timeout.ms" => {
                    notes.push(format!(
                        "delivery.timeout.ms={value} is librdkafka's message.timeout.ms, which the relay sets to 0 (no deadline); an expired delivery stops the relay"
                    ));
                    name
                }
                _ => name,
            };
            self.arg("-X", format!("{name}={value}"));
        }
        if !dropped.is_empty() {
            self.warn(format!(
                "producer.override properties dropped (Java client only; librdkafka would refuse to start): {}",
                dropped.join(", ")
            ));
        }
        for note in notes {
            self.warn(format!("producer.override: {note}"));
        }
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
        let mut heartbeat = Vec::new();
        let mut ignored = Vec::new();
        for key in self.config.keys() {
            let key = key.as_str();
            if self.used.contains(key)
                || key.starts_with("transforms.")
                || key == "predicates"
                || key.starts_with("predicates.")
            {
                continue;
            }
            if key.starts_with("heartbeat.") {
                heartbeat.push(key);
                continue;
            }
            match IGNORED_NOTES.iter().find(|(k, _)| *k == key) {
                Some((_, note)) => ignored.push(format!("{key} ({note})")),
                None => ignored.push(key.to_owned()),
            }
        }
        if !heartbeat.is_empty() {
            let interval = self
                .config
                .get("heartbeat.interval.ms")
                .and_then(|v| v.trim().parse::<u64>().ok())
                .filter(|ms| *ms > 0);
            let keys = heartbeat.join(", ");
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
        if !ignored.is_empty() {
            self.warn(format!(
                "ignored (no equivalent in the relay): {}",
                ignored.join(", ")
            ));
        }
    }
}

/// EventRouter options handled by name (relative to `transforms.NAME.`).
const KNOWN_ROUTER_OPTIONS: &[&str] = &[
    "type",
    "predicate",
    "negate",
    "route.by.field",
    "route.topic.regex",
    "route.topic.replacement",
    "route.tombstone.on.empty.payload",
    "table.field.event.key",
    "table.field.event.id",
    "table.field.event.payload",
    "table.field.event.timestamp",
    "table.field.event.type",
    "table.field.event.schema.version",
    "table.fields.additional.placement",
    "table.fields.additional.error.on.missing",
    "table.expand.json.payload",
    "table.json.payload.null.behavior",
    "table.op.invalid.behavior",
    "debezium.op.invalid.behavior",
];

/// The capture groups of a `route.topic.regex` that captures the whole value.
#[derive(Clone, Copy)]
struct RouteRegex {
    /// 0 (no group) or 1.
    groups: u32,
    /// Whether group 1 is named `routedByValue`.
    named: bool,
}

/// Recognises the regexes equivalent to the default: an optional `^`/`$`
/// around `.*` or `.+`, bare, in a group, or in the `routedByValue` group.
fn route_regex(raw: &str) -> Option<RouteRegex> {
    let raw = raw.trim();
    let inner = raw.strip_prefix('^').unwrap_or(raw);
    let inner = inner.strip_suffix('$').unwrap_or(inner);
    let (body, shape) = if let Some(body) = inner
        .strip_prefix("(?<routedByValue>")
        .and_then(|b| b.strip_suffix(')'))
    {
        (
            body,
            RouteRegex {
                groups: 1,
                named: true,
            },
        )
    } else if let Some(body) = inner.strip_prefix('(').and_then(|b| b.strip_suffix(')')) {
        (
            body,
            RouteRegex {
                groups: 1,
                named: false,
            },
        )
    } else {
        (
            inner,
            RouteRegex {
                groups: 0,
                named: false,
            },
        )
    };
    matches!(body, ".*" | ".+").then_some(shape)
}

/// Rewrites a Java `Matcher` replacement (`${name}`, `$N`, `\x` escapes) as a
/// topic template, where every group reference is the whole routing value.
fn convert_replacement(replacement: &str, regex: RouteRegex) -> Result<String, String> {
    let mut out = String::with_capacity(replacement.len());
    let mut chars = replacement.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some('$') => out.push_str("$$"),
                Some(other) => out.push(other),
                None => return Err("ends with a lone backslash".to_owned()),
            },
            '$' => match chars.next() {
                Some('{') => {
                    let name: String = chars.by_ref().take_while(|c| *c != '}').collect();
                    if name == "routedByValue" && regex.named {
                        out.push_str(ROUTED_BY_VALUE);
                    } else {
                        return Err(format!(
                            "${{{name}}} names no group of route.topic.regex; use ${{routedByValue}}"
                        ));
                    }
                }
                Some(d) if d.is_ascii_digit() => {
                    let mut group = d.to_digit(10).unwrap_or_default();
                    // Java keeps reading digits while the number is still a group.
                    while let Some(next) = chars.peek().and_then(|c| c.to_digit(10)) {
                        if group * 10 + next > regex.groups {
                            break;
                        }
                        group = group * 10 + next;
                        chars.next();
                    }
                    if group > regex.groups {
                        return Err(format!(
                            "${group} names no group of route.topic.regex; use ${{routedByValue}}"
                        ));
                    }
                    out.push_str(ROUTED_BY_VALUE);
                }
                _ => {
                    return Err(
                        "a '$' must start ${routedByValue} or a group number; write \\$ for a literal dollar"
                            .to_owned(),
                    );
                }
            },
            other => out.push(other),
        }
    }
    Ok(out)
}

/// Unescapes a plain `schema.table` entry; any other regex syntax is an error.
fn literal_table_name(key: &'static str, entry: &str) -> Result<String, DebeziumError> {
    let regex = || DebeziumError::TableRegex {
        key,
        entry: entry.to_owned(),
    };
    let mut out = String::with_capacity(entry.len());
    let mut chars = entry.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some('.') => out.push('.'),
                _ => return Err(regex()),
            },
            '*' | '+' | '?' | '(' | ')' | '[' | ']' | '{' | '}' | '|' | '^' | '$' => {
                return Err(regex());
            }
            other => out.push(other),
        }
    }
    Ok(out)
}

/// `${provider:path:key}`, Kafka Connect's config-provider syntax.
fn is_config_provider(value: &str) -> bool {
    value
        .find("${")
        .and_then(|start| value.get(start + 2..))
        .and_then(|rest| {
            rest.find('}')
                .map(|end| rest.get(..end).unwrap_or_default())
        })
        .is_some_and(|inner| inner.contains(':'))
}

/// Percent-encodes everything but RFC 3986 unreserved characters.
fn percent_encode(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    for b in raw.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Single-quotes a word for a POSIX shell unless it is plainly safe.
fn shell_quote(raw: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "-_./:=,@%+".contains(c);
    if !raw.is_empty() && raw.chars().all(safe) {
        raw.to_owned()
    } else {
        format!("'{}'", raw.replace('\'', "'\\''"))
    }
}

#[cfg(test)]
mod tests;
