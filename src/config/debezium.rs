//! A Debezium Postgres connector config (with the Outbox Event Router) as the relay's flags,
//! Debezium's defaults written out, as a migrating user expects Debezium's behaviour. Every key
//! is mapped, warned about (what consumers will see change) or refused with a remedy; warnings
//! never show `database.*` values.

use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde_json::Value;

use super::{PostgresConnInfo, PostgresUrlError};
use crate::outbox::connect::transforms::Chain;
use options::{Class, Reads};

mod options;
mod registry;
use crate::outbox::{TableName, TopicTemplate};

const POSTGRES_CONNECTOR: &str = "io.debezium.connector.postgresql.PostgresConnector";
const EVENT_ROUTER: &str = "io.debezium.transforms.outbox.EventRouter";
const DEFAULT_ROUTE_REGEX: &str = "(?<routedByValue>.*)";
const ROUTED_BY_VALUE: &str = "${routedByValue}";
const PROVIDER: &str = "a Kafka Connect config-provider reference; resolve it and import again";
const NO_EVENT_ROUTER: &str = "no transform of type io.debezium.transforms.outbox.EventRouter: the relay replaces only the Outbox Event Router, not raw change events";
const NO_REGEX_ROUTING: &str = "the relay has no regex routing (${routedByValue} is the whole route-by value): write the topic as route.topic.replacement without the regex, or route by a column holding the topic part";
const PLACEMENT: &str = "expected COLUMN:PLACEMENT or COLUMN:PLACEMENT:ALIAS, PLACEMENT being header, envelope or partition";
const NEW_SLOT: &str = "give the relay a new slot (slot.name or --slot; it creates it with pgoutput), start it before stopping Debezium, and let consumers deduplicate on the id header";
/// RFC 3986's unreserved characters: what user, password and database keep unencoded.
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
        "not valid JSON (line {}, column {}); export it with `curl http://CONNECT:8083/connectors/NAME/config`",
        .0.line(), .0.column()
    )]
    Json(#[source] serde_json::Error),
    /// The JSON is not an object.
    #[error("the connector config must be a JSON object: the REST body or its \"config\"")]
    JsonShape,
    /// The key of a JSON value that is an array or an object.
    #[error("{0:?} is nested; Kafka Connect values are strings, numbers or booleans")]
    JsonValue(String),
    /// A `.properties` line that does not parse (line 0: unknown).
    #[error("line {} is not valid .properties syntax", .0.line_number().unwrap_or_default())]
    Properties(#[source] java_properties::PropertiesError),
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
    PostgresUrl(#[source] PostgresUrlError),
}

type Error = DebeziumError;

fn invalid(key: impl Into<String>, value: &str, reason: impl Into<String>) -> Error {
    let (key, value, reason) = (key.into(), value.to_owned(), reason.into());
    Error::Invalid { key, value, reason }
}

/// The result of [`import`]: flags in command-line order, and what differs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Imported {
    /// `(flag, value)` pairs, e.g. `("--slot", "debezium")` or `("-X", "linger.ms=5")`.
    pub args: Vec<(String, String)>,
    /// One sentence per option that is ignored or behaves differently.
    pub warnings: Vec<String>,
    /// The record-shaping options reproduced byte for byte, as `key=value`.
    pub identical: Vec<String>,
    /// The options that do not change the records, as `key=value: why`.
    pub no_effect: Vec<String>,
    /// Where Debezium 3.6.3 itself stops with this configuration, and what the relay does there.
    pub debezium_stops: Vec<String>,
}

/// Reads and translates a connector config file, with the Connect worker's properties
/// (`worker`: its converters apply where the connector names none).
pub fn import_file(path: &Path, worker: Option<&Path>) -> Result<Imported, ImportError> {
    let at = |path: &Path| {
        let path = path.to_owned();
        move |source| ImportError { path, source }
    };
    let read = |path: &Path| {
        let text = std::fs::read_to_string(path).map_err(Error::Read);
        text.and_then(|text| parse(&text, detect_format(path, &text)))
            .map_err(at(path))
    };
    let worker = worker.map(read).transpose()?;
    import_with(&read(path)?, worker.as_ref()).map_err(at(path))
}

/// Reads a connector config into a flat map (JSON `null` is unset; properties are read as UTF-8).
pub fn parse(text: &str, format: SourceFormat) -> Result<BTreeMap<String, String>, Error> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    if format == SourceFormat::Properties {
        let mut out = BTreeMap::new();
        java_properties::PropertiesIter::new_with_encoding(text.as_bytes(), encoding_rs::UTF_8)
            .read_into(|key, value| drop(out.insert(key, value)))
            .map_err(Error::Properties)?;
        return Ok(out);
    }
    let Value::Object(mut object) = serde_json::from_str(text).map_err(Error::Json)? else {
        return Err(Error::JsonShape);
    };
    if let Some(Value::Object(config)) = object.get("config") {
        object = config.clone();
    }
    let scalars = object.into_iter().filter(|(_, value)| !value.is_null());
    scalars
        .map(|(key, value)| match value {
            Value::String(text) => Ok((key, text)),
            Value::Number(_) | Value::Bool(_) => Ok((key, value.to_string())),
            _ => Err(Error::JsonValue(key)),
        })
        .collect()
}

/// Guesses the format by extension, else JSON when the text starts with `{`.
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

/// Maps a Debezium Postgres connector config onto the relay's flags, with the Connect worker's
/// properties, whose converters apply where the connector names none (without them: Kafka's
/// sample worker config, JsonConverter with schemas).
pub fn import_with(
    config: &BTreeMap<String, String>,
    worker: Option<&BTreeMap<String, String>>,
) -> Result<Imported, Error> {
    let (used, out) = (BTreeSet::from(["name"]), Imported::default());
    Importer {
        config,
        worker,
        used,
        out,
        registry: registry::RegistryImport::default(),
    }
    .run()
}

/// The equivalent command line, shell-quoted, one flag per line, then the warnings as comments.
pub fn explain(imported: &Imported) -> String {
    let mut out = String::from("outbox-relay");
    let mut hidden = Vec::new();
    for (flag, value) in &imported.args {
        let Some(shown) = explained(flag, value) else {
            hidden.push(flag.as_str());
            continue;
        };
        out += &format!(" \\\n  {flag} {}", shell_words::quote(&shown));
    }
    for flag in hidden {
        let env = format!(
            "OUTBOX_RELAY_{}",
            flag.trim_start_matches('-')
                .replace('-', "_")
                .to_uppercase()
        );
        out += &format!("\n# {flag} is not shown (a credential): set {env}");
    }
    out.push('\n');
    if !imported.identical.is_empty() {
        out.push_str("# Records identical to Debezium's for:\n");
    }
    for option in &imported.identical {
        let verdict = match stops_with(imported, option) {
            true => "identical up to where Debezium itself stops (below)",
            false => "identical",
        };
        out += &format!("# - {option}: {verdict}\n");
    }
    if !imported.no_effect.is_empty() {
        out.push_str("# No effect on the records:\n");
    }
    for option in &imported.no_effect {
        out += &format!("# - {option}\n");
    }
    if !imported.debezium_stops.is_empty() {
        out.push_str("# Where Debezium 3.6.3 itself stops with this configuration:\n");
    }
    for stop in &imported.debezium_stops {
        out += &format!("# - {stop}\n");
    }
    if !imported.warnings.is_empty() {
        out.push_str("# Differences from the Debezium connector:\n");
    }
    for warning in &imported.warnings {
        out += &format!("# - {warning}\n");
    }
    out
}

/// Whether `option` (`key=value`) is one of those Debezium itself stops with.
fn stops_with(imported: &Imported, option: &str) -> bool {
    let key = option.split_once('=').map_or(option, |(key, _)| key);
    let named = |stop: &String| {
        (stop.strip_prefix(key)).is_some_and(|rest| rest.starts_with([' ', '=', ':']))
    };
    imported.debezium_stops.iter().any(named)
}

const JSON_CONVERTER: &str = "org.apache.kafka.connect.json.JsonConverter";
const BINARY_DATA_CONVERTER: &str = "io.debezium.converters.BinaryDataConverter";
const HEADER_CONVERTER: &str = "the relay writes header values as SimpleHeaderConverter (Kafka Connect's default) or JsonConverter do";
const CONVERTERS: &str = "the relay reproduces StringConverter, ByteArrayConverter, JsonConverter, Debezium's BinaryDataConverter and Confluent's AvroConverter and ProtobufConverter";
const WORKER_DEFAULT: &str = "Kafka's sample worker config (JsonConverter, schemas.enable=true), as neither the connector config nor --debezium-worker-config names one";

/// How `--explain` shows an imported flag: credentials never (`None`), a URL's user info
/// masked.
fn explained(flag: &str, value: &str) -> Option<String> {
    match flag {
        "--schema-registry-user-info" => None,
        "--schema-registry-url" => Some(
            value
                .split(',')
                .map(|url| match url::Url::parse(url.trim()) {
                    Ok(mut parsed)
                        if !parsed.username().is_empty() || parsed.password().is_some() =>
                    {
                        let _ = parsed.set_username("***");
                        let _ = parsed.set_password(None);
                        parsed.to_string()
                    }
                    _ => url.to_owned(),
                })
                .collect::<Vec<_>>()
                .join(","),
        ),
        _ => Some(value.to_owned()),
    }
}

/// A converter as the import maps it.
struct ConverterChoice {
    /// The `--ROLE-converter` value.
    flag: &'static str,
    /// JsonConverter's `decimal.format=NUMERIC`.
    numeric_decimals: bool,
}

impl ConverterChoice {
    /// Kafka Connect's header converter when none is set.
    fn default_header() -> Self {
        ConverterChoice {
            flag: "simple",
            numeric_decimals: false,
        }
    }
}

/// Why a producer setting (the connector's `producer.override.*` or the worker's
/// `producer.*`) changes where records go or what they hold, which the relay does not
/// reproduce; `None` when it does not.
fn producer_refusal(name: &str, value: &str) -> Option<&'static str> {
    let value = value.trim();
    match name {
        "partitioner.class"
            if !matches!(
                value,
                "" | "org.apache.kafka.clients.producer.internals.DefaultPartitioner"
            ) =>
        {
            Some(
                "it places records by another rule than the key's murmur2 hash, which the relay uses: remove it",
            )
        }
        "partitioner.ignore.keys" if value.eq_ignore_ascii_case("true") => Some(
            "it spreads keyed records without their key's hash, which the relay uses: remove it",
        ),
        "interceptor.classes" if !value.is_empty() => Some(
            "producer interceptors may change records the relay does not reproduce: remove them",
        ),
        _ => None,
    }
}

/// What becomes of a producer property: passed on with a note (`""`: none), or refused by
/// librdkafka, so not passed on (`Err`: what to do instead).
fn producer_note(name: &str, value: &str) -> Result<&'static str, &'static str> {
    match name {
        "key.serializer" | "value.serializer" => Err("the relay sends the columns' bytes"),
        "partitioner.class" => Err("the relay uses murmur2_random, the Java default"),
        "max.block.ms" | "metric.reporters" | "interceptor.classes" => Err("no equivalent"),
        "partitioner.ignore.keys" => Err("the relay hashes keys, as the Java default does"),
        "buffer.memory" => Err("use -X queue.buffering.max.kbytes"),
        "sasl.jaas.config" => Err("use -X sasl.username=... -X sasl.password=..."),
        "transactional.id" => Err("the relay does not use Kafka transactions"),
        n if n.starts_with("ssl.truststore.") => Err("use -X ssl.ca.location=CA.pem"),
        n if n.starts_with("ssl.keystore.") => {
            Err("use -X ssl.certificate.location, ssl.key.location")
        }
        _ if value.contains(';') => Err("';' separates -X values"),
        "acks" if !matches!(value, "all" | "-1") => Ok("acknowledged events may be lost"),
        "enable.idempotence" if value.eq_ignore_ascii_case("false") => {
            Ok("retries may duplicate or reorder records")
        }
        "delivery.timeout.ms" => Ok("an expired delivery stops the relay"),
        "max.request.size" => Ok("passed as librdkafka's message.max.bytes"),
        _ => Ok(""),
    }
}

/// What a producer setting of AWS's MSK IAM library (`aws-msk-iam-auth`) says.
#[derive(Debug, PartialEq, Eq)]
enum MskIam {
    /// `sasl.mechanism=AWS_MSK_IAM`: `--kafka-auth aws-msk-iam`.
    Mechanism,
    /// The login module's `awsRoleArn`: `--aws-role-arn`.
    Role(String),
    /// The library's login module or callback handler, which `--kafka-auth` replaces.
    Implied,
}

/// PURE: the MSK IAM library's meaning of producer property `name`, if it is one of its.
fn msk_iam(name: &str, value: &str) -> Option<MskIam> {
    match name {
        "sasl.mechanism" if value.trim() == "AWS_MSK_IAM" => Some(MskIam::Mechanism),
        "sasl.jaas.config" if value.contains("software.amazon.msk.auth.iam.") => {
            let role = value.split("awsRoleArn=").nth(1).and_then(|rest| {
                let quoted = rest.strip_prefix('"')?;
                quoted.split('"').next().map(str::to_owned)
            });
            Some(role.map_or(MskIam::Implied, MskIam::Role))
        }
        "sasl.client.callback.handler.class" if value.contains("software.amazon.msk.auth.iam.") => {
            Some(MskIam::Implied)
        }
        _ => None,
    }
}

/// An EventRouter option (after `transforms.NAME.`) the import does not turn into a flag:
/// `Ok("")` when records stay identical, `Ok(why)` for a difference that is not in the records,
/// `Err(why)` when the relay cannot reproduce it, `None` for an option the router lacks.
fn router_note(option: &str, value: &str) -> Option<Result<&'static str, &'static str>> {
    let value = value.to_ascii_lowercase();
    Some(match option {
        "table.op.invalid.behavior" | "debezium.op.invalid.behavior" if value == "fatal" => Ok(
            "Debezium stopped on an UPDATE of the outbox table; the relay ignores UPDATE and DELETE, warning once",
        ),
        "table.op.invalid.behavior" | "debezium.op.invalid.behavior" | "negate" => Ok(""),
        "table.field.event.type" | "tracing.operation.name" => Ok(""),
        "table.expand.json.payload" | "route.tombstone.on.empty.payload" if value == "false" => {
            Ok("")
        }
        "table.json.payload.null.behavior" if value == "ignore" => Ok(""),
        "table.field.additional.missing" if value == "error" => Ok(""),
        "field.name.adjustment.mode" if value == "none" => Ok(""),
        "tracing.with.context.field.only" if value == "true" => Ok(""),
        "table.field.additional.missing" => Err(
            "the relay refuses a table that lacks a placed column; add the column to every outbox table, or relay such tables with their own --table overrides",
        ),
        "field.name.adjustment.mode" => Err(
            "the relay does not rename expanded payload fields; use field.name.adjustment.mode=none",
        ),
        "tracing.with.context.field.only" => {
            Err("the relay traces only rows with a span context, as Debezium's default does")
        }
        _ => return None,
    })
}

/// The import in progress: every key read is marked, so the rest can be warned about.
struct Importer<'a> {
    config: &'a BTreeMap<String, String>,
    /// The Connect worker's properties, when given.
    worker: Option<&'a BTreeMap<String, String>>,
    used: BTreeSet<&'a str>,
    out: Imported,
    /// The AvroConverters' settings, turned into flags once both are read.
    registry: registry::RegistryImport,
}

impl<'a> Importer<'a> {
    /// The trimmed value of `key`, now marked as handled; empty counts as unset.
    fn take(&mut self, key: &str) -> Option<&'a str> {
        let (k, v) = self.config.get_key_value(key)?;
        self.used.insert(k);
        Some(v.trim()).filter(|v| !v.is_empty())
    }

    /// Every `(key, trimmed value)` under `prefix` not yet handled, now marked.
    fn take_prefixed(&mut self, prefix: &str) -> Vec<(&'a str, &'a str)> {
        let found = prefixed(self.config, prefix).filter(|(k, _)| !self.used.contains(k));
        let found: Vec<_> = found.collect();
        self.used.extend(found.iter().map(|(k, _)| *k));
        found
    }

    /// The trimmed value of `key`, refused when it is a config-provider reference.
    fn literal(&mut self, key: &'static str) -> Result<Option<&'a str>, Error> {
        match self.take(key) {
            Some(value) if is_config_provider(value) => Err(invalid(key, value, PROVIDER)),
            value => Ok(value),
        }
    }

    fn required(&mut self, key: &'static str, hint: &'static str) -> Result<&'a str, Error> {
        self.literal(key)?.ok_or(Error::Missing { key, hint })
    }

    fn arg(&mut self, flag: &str, value: impl Into<String>) {
        self.out.args.push((flag.to_owned(), value.into()));
    }

    fn warn(&mut self, warning: impl Into<String>) {
        self.out.warnings.push(warning.into());
    }

    fn identical(&mut self, key: &str, value: &str) {
        self.out.identical.push(format!("{key}={value}"));
    }

    fn no_effect(&mut self, key: &str, value: &str, why: &str) {
        self.out.no_effect.push(format!("{key}={value}: {why}"));
    }

    /// One warning about all of `items` (none without any), given their list.
    fn warn_all<S: Borrow<str>>(&mut self, items: &[S], warning: impl FnOnce(&str) -> String) {
        if !items.is_empty() {
            self.warn(warning(&items.join(", ")));
        }
    }

    fn run(mut self) -> Result<Imported, Error> {
        let class = self.required("connector.class", "add connector.class=PostgresConnector")?;
        // Kafka Connect also accepts the simple class name and its alias without `Connector`.
        if !matches!(class, POSTGRES_CONNECTOR | "PostgresConnector" | "Postgres") {
            let why = "outbox-relay replaces only Debezium's Postgres connector, PostgresConnector";
            return Err(invalid("connector.class", class, why));
        }
        let pgoutput = match self.take("plugin.name") {
            Some(plugin) if plugin.eq_ignore_ascii_case("pgoutput") => true,
            Some(plugin) => {
                let why = format!(
                    "the relay reads pgoutput slots only: set plugin.name=pgoutput and import again; {NEW_SLOT}"
                );
                return Err(invalid("plugin.name", plugin, why));
            }
            None => {
                self.warn(format!("plugin.name is not set, so Debezium used decoderbufs, whose slot the relay cannot read (it stops with \"uses the decoderbufs plugin\"): {NEW_SLOT}"));
                false
            }
        };
        let url = self.postgres_url()?;
        self.arg("--postgres-url", url);
        match self.take("producer.override.bootstrap.servers") {
            Some(brokers) => self.arg("--kafka-brokers", brokers),
            None => self.warn("add --kafka-brokers HOST:PORT,...: a connector config has no brokers (they are the Connect worker's bootstrap.servers)"),
        }
        self.tables()?;
        let slot = self.take("slot.name").unwrap_or("debezium");
        self.arg("--slot", slot);
        let publication = self.take("publication.name").unwrap_or("dbz_publication");
        self.arg("--publication", publication);
        match self.take("publication.autocreate.mode").unwrap_or("all_tables") {
            "all_tables" if pgoutput => self.warn(format!("publication.autocreate.mode=all_tables (Debezium's default): {publication} is FOR ALL TABLES, so the relay receives every table's changes and drops those outside --table. To narrow it, pass a new --publication: the relay creates a missing one FOR TABLE <tables> WITH (publish = 'insert')")),
            "no_tables" if pgoutput => self.warn(format!("publication.autocreate.mode=no_tables: {publication} has no tables; the relay stops at start-up until the outbox tables are added (it prints the ALTER PUBLICATION to run)")),
            _ => {}
        }
        self.converters()?;
        self.column_modes()?;
        self.context_headers()?;
        self.event_router()?;
        self.producer_overrides()?;
        self.leftovers()?;
        Ok(self.out)
    }

    fn postgres_url(&mut self) -> Result<String, Error> {
        let host = self.required("database.hostname", "add the Postgres host name or address")?;
        let user = self.required("database.user", "add a role with REPLICATION and SELECT")?;
        let dbname = self.required("database.dbname", "add the database of the outbox tables")?;
        let raw = self.literal("database.port")?.unwrap_or("5432");
        let bad_port = |_| invalid("database.port", raw, "expected a TCP port number");
        let port: std::num::NonZeroU16 = raw.parse().map_err(bad_port)?;
        // Marks the password handled; it is used as written, as Connect does not trim it.
        self.take("database.password");
        let password = match self.config.get("database.password").map(String::as_str) {
            None | Some("") => String::new(),
            Some(p) if is_config_provider(p) => {
                self.warn("database.password is a Kafka Connect config-provider reference, which the relay cannot resolve, so it is left out of --postgres-url: pass --postgres-password-file PATH or OUTBOX_RELAY_POSTGRES_PASSWORD");
                String::new()
            }
            Some(p) => format!(":{}", utf8_percent_encode(p, URL_PART)),
        };
        let ipv6 = host.contains(':') && !host.starts_with('[');
        let (open, close) = if ipv6 { ("[", "]") } else { ("", "") };
        let user = utf8_percent_encode(user, URL_PART);
        let dbname = utf8_percent_encode(dbname, URL_PART);
        let url = format!("postgres://{user}{password}@{open}{host}{close}:{port}/{dbname}?");
        let mut query = url::form_urlencoded::Serializer::for_suffix(url.clone(), url.len());
        for param in ["sslmode", "sslrootcert", "sslcert", "sslkey"] {
            if let Some(value) = self.take(&format!("database.{param}")) {
                query.append_pair(param, value);
            }
        }
        let url = query.finish().trim_end_matches('?').to_owned();
        PostgresConnInfo::parse(&url).map_err(Error::PostgresUrl)?;
        Ok(url)
    }

    fn tables(&mut self) -> Result<(), Error> {
        let found = ["table.include.list", "table.whitelist"]
            .into_iter()
            .find_map(|key| Some((key, self.take(key)?)));
        let Some((key, list)) = found else {
            let hint = "without it Debezium captures every table; list the outbox tables as schema.table, or pass --table";
            let key = "table.include.list";
            return Err(Error::Missing { key, hint });
        };
        let mut read_differently = Vec::new();
        for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            // `\.` is the only regex syntax a plain name needs.
            let name = entry.replace(r"\.", ".");
            if name.contains(|c| "\\*+?()[]{}|^$".contains(c)) {
                let why = "a regular expression; list each outbox table as schema.table (a `\\.` escape is fine)";
                return Err(invalid(key, entry, why));
            }
            TableName::parse(&name).map_err(|reason| invalid(key, entry, reason))?;
            if !name.contains('.') || name.chars().any(|c| c.is_ascii_uppercase()) {
                read_differently.push(name.clone());
            }
            self.arg("--table", name);
        }
        self.warn_all(&read_differently, |list| {
            format!("{key} entries {list}: the relay reads an entry without a schema as public.TABLE, and uses names exactly where Debezium matched them case-insensitively (Postgres folds unquoted names to lower case)")
        });
        Ok(())
    }

    /// `ROLE.converter` as Kafka Connect picks it: the connector's class with the connector's
    /// settings, else the worker's with the worker's; as the `--ROLE-converter` value and its
    /// `decimal.format`.
    fn converter(&mut self, role: &str) -> Result<ConverterChoice, Error> {
        let key = format!("{role}.converter");
        let prefix = format!("{key}.");
        let connector = self.take(&key);
        let connector_settings = self.take_prefixed(&prefix);
        let worker = self.worker.and_then(|w| Some((w.get(&key)?.trim(), w)));
        let (class, settings, origin) = match (connector, worker) {
            (Some(class), _) => (class, connector_settings, "the connector config"),
            (None, worker) => {
                for (setting, value) in connector_settings {
                    self.no_effect(setting, value, &format!("Kafka Connect applies a connector's {key} settings only with its own {key}, which it does not set"));
                }
                match worker {
                    Some((class, worker)) => {
                        let settings = prefixed(worker, &prefix).collect();
                        (class, settings, "the worker config")
                    }
                    None if role == "header" => return Ok(ConverterChoice::default_header()),
                    None => {
                        self.warn(format!("{key}: {WORKER_DEFAULT}"));
                        (JSON_CONVERTER, Vec::new(), "")
                    }
                }
            }
        };
        let short = class.rsplit('.').next().unwrap_or_default();
        let kafka = class == short || class.starts_with("org.apache.kafka.connect.");
        let flag = match (short, role) {
            ("SimpleHeaderConverter", "header") if kafka => Ok("simple"),
            ("JsonConverter", _) if kafka => Ok("json-with-schemas"),
            (_, "header") => Err(HEADER_CONVERTER),
            ("BinaryDataConverter" | "BinaryData", _)
                if class == short || class == BINARY_DATA_CONVERTER =>
            {
                return self.binary_data(role, class, &settings, origin);
            }
            _ => simple_converter(class),
        };
        let flag = flag.map_err(|why| invalid(&key, class, why))?;
        let choice = self.settings(role, flag, &settings, &prefix, origin)?;
        self.identical(&key, class);
        Ok(choice)
    }

    /// A converter's settings: an AvroConverter's become registry flags, the others' are
    /// classified by [`Importer::plain_settings`].
    fn settings(
        &mut self,
        role: &str,
        flag: &'static str,
        settings: &[(&'a str, &'a str)],
        prefix: &str,
        origin: &str,
    ) -> Result<ConverterChoice, Error> {
        let classified = match flag {
            "avro" => self.registry.avro(role, settings, prefix)?,
            "protobuf" => self.registry.protobuf(role, settings, prefix)?,
            _ => return self.plain_settings(flag, settings, prefix, origin),
        };
        self.out.identical.extend(classified.identical);
        self.out.no_effect.extend(classified.no_effect);
        Ok(ConverterChoice {
            flag,
            numeric_decimals: false,
        })
    }

    /// The settings of one of Kafka's converters (`flag`), each reproduced, without effect
    /// (with why) or refused by name.
    fn plain_settings(
        &mut self,
        flag: &'static str,
        settings: &[(&'a str, &'a str)],
        prefix: &str,
        origin: &str,
    ) -> Result<ConverterChoice, Error> {
        let converter = prefix.trim_end_matches('.');
        let mut choice = ConverterChoice {
            flag,
            numeric_decimals: false,
        };
        let json = flag == "json-with-schemas";
        let string = flag == "string";
        for &(setting, value) in settings {
            let name = &setting[prefix.len()..];
            match (name, value.to_ascii_lowercase().as_str()) {
                ("schemas.enable", "false") if json => choice.flag = "json",
                ("schemas.enable", _) if json => {}
                ("decimal.format", "numeric") if json => choice.numeric_decimals = true,
                ("decimal.format", "base64") if json => {}
                ("replace.null.with.default", "true") if json => {}
                ("schemas.cache.size", _) if json => {
                    self.no_effect(setting, value, "a cache size");
                    continue;
                }
                ("encoding" | "converter.encoding", "utf8" | "utf-8") if string => {}
                _ if !json && !string || name == "converter.type" => {
                    let why = format!("{converter} has no such setting; Kafka Connect ignores it");
                    self.no_effect(setting, value, &why);
                    continue;
                }
                _ => {
                    let why = format!(
                        "a {converter} setting (from {origin}) whose effect the relay does not reproduce"
                    );
                    return Err(invalid(setting, value, why));
                }
            }
            self.identical(setting, value);
        }
        Ok(choice)
    }

    /// `ROLE.converter=BinaryDataConverter`, whose delegate (`delegate.converter.type`, with
    /// its settings under that prefix) writes anything but bytes; its other settings have no
    /// effect in Debezium either.
    fn binary_data(
        &mut self,
        role: &str,
        class: &str,
        settings: &[(&'a str, &'a str)],
        origin: &str,
    ) -> Result<ConverterChoice, Error> {
        let key = format!("{role}.converter");
        let delegate_key = format!("{key}.delegate.converter.type");
        let prefix = format!("{delegate_key}.");
        let delegate = settings.iter().find(|(k, _)| *k == delegate_key);
        let mut choice = ConverterChoice {
            flag: "binary-data",
            numeric_decimals: false,
        };
        if let Some((_, delegate_class)) = delegate {
            let flag = simple_converter(delegate_class)
                .map_err(|why| invalid(&delegate_key, delegate_class, why))?;
            let own: Vec<_> = (settings.iter().copied())
                .filter(|(k, _)| k.starts_with(&prefix))
                .collect();
            let delegated = self.settings(role, flag, &own, &prefix, origin)?;
            self.arg(&format!("--{role}-delegate-converter"), delegated.flag);
            self.identical(&delegate_key, delegate_class);
            choice.numeric_decimals = delegated.numeric_decimals;
        }
        for &(setting, value) in settings {
            if setting != delegate_key && !setting.starts_with(&prefix) {
                let why = "BinaryDataConverter has no such setting; Kafka Connect ignores it";
                self.no_effect(setting, value, why);
            }
        }
        self.identical(&key, class);
        Ok(choice)
    }

    /// The key, value and header converters as flags, then the registry's.
    fn converters(&mut self) -> Result<(), Error> {
        for role in ["key", "value", "header"] {
            let choice = self.converter(role)?;
            if role != "header" || choice.flag != "simple" {
                // A delegate's flag is already in; the converter's goes before it.
                let delegate = format!("--{role}-delegate-converter");
                let at = (self.out.args.iter().position(|(f, _)| *f == delegate))
                    .unwrap_or(self.out.args.len());
                let arg = (format!("--{role}-converter"), choice.flag.to_owned());
                self.out.args.insert(at, arg);
            }
            if choice.numeric_decimals {
                self.arg(&format!("--{role}-converter-decimal-format"), "numeric");
            }
        }
        for (flag, value) in self.registry.args() {
            self.arg(&flag, value);
        }
        Ok(())
    }

    /// The connector options that shape column values and schemas.
    fn column_modes(&mut self) -> Result<(), Error> {
        for (key, flag, values) in [
            (
                "time.precision.mode",
                "--time-precision-mode",
                &[
                    "adaptive",
                    "adaptive_time_microseconds",
                    "connect",
                    "isostring",
                ][..],
            ),
            (
                "decimal.handling.mode",
                "--decimal-handling-mode",
                &["precise", "double", "string"][..],
            ),
            (
                "binary.handling.mode",
                "--binary-handling-mode",
                &["bytes", "base64", "base64-url-safe", "hex"][..],
            ),
        ] {
            let Some(value) = self.take(key) else {
                continue;
            };
            let lower = value.to_ascii_lowercase();
            if !values.contains(&lower.as_str()) {
                let why = format!(
                    "the relay reproduces {}; Debezium 3.6.3 has other values the relay does not reproduce (such as time.precision.mode=structured)",
                    values.join(", ")
                );
                return Err(invalid(key, value, why));
            }
            self.arg(flag, lower.replace('_', "-"));
            self.identical(key, value);
        }
        for (key, flag) in [
            (
                "column.propagate.source.type",
                "--column-propagate-source-type",
            ),
            (
                "datatype.propagate.source.type",
                "--datatype-propagate-source-type",
            ),
        ] {
            if let Some(value) = self.take(key) {
                self.arg(flag, value);
                self.identical(key, value);
            }
        }
        Ok(())
    }

    /// `topic.prefix` (the schema names' and context headers' logical name) and
    /// `extended.headers.enabled` (default true in Debezium 3.6).
    fn context_headers(&mut self) -> Result<(), Error> {
        let prefix = self.required(
            "topic.prefix",
            "Debezium requires it; it names the context headers and envelope schemas",
        )?;
        self.arg("--debezium-topic-prefix", prefix);
        let extended = self.take("extended.headers.enabled").unwrap_or("true");
        if !extended.eq_ignore_ascii_case("false") {
            self.arg("--debezium-context-headers", "true");
            self.identical("extended.headers.enabled", extended);
            self.warn("extended.headers.enabled: __debezium.context.runId is a new UUID per relay start, as it was per Debezium task start");
        } else {
            self.identical("extended.headers.enabled", extended);
        }
        Ok(())
    }

    fn event_router(&mut self) -> Result<(), Error> {
        let names = self.take("transforms").unwrap_or_default();
        let list: Vec<&str> = names
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .collect();
        let router = list.iter().position(|name| {
            let class = self.config.get(&format!("transforms.{name}.type"));
            class.map(|c| c.trim()) == Some(EVENT_ROUTER)
        });
        let router = router.ok_or_else(|| invalid("transforms", names, NO_EVENT_ROUTER))?;
        if let Some(before) = list[..router].first() {
            let key = format!("transforms.{before}.type");
            let class = self.config.get(&key).map_or("", |c| c.trim());
            let why = "runs before the Outbox Event Router, on Debezium's change events, which the relay does not build; remove it or move it after the router";
            return Err(invalid(key, class, why));
        }
        // Rewritten below for the predicates the transforms after the router use.
        self.take("predicates");
        self.router_predicate(list[router])?;
        self.transforms_after(&list[router + 1..])?;
        let router = list[router];
        self.take(&format!("transforms.{router}.type"));
        let prefix = format!("transforms.{router}.");
        let option = |this: &mut Self, suffix: &str| this.take(&format!("{prefix}{suffix}"));

        let route_by = option(self, "route.by.field").unwrap_or("aggregatetype");
        let template = self.topic_template(&prefix)?;
        self.arg("--route-by", route_by);
        self.arg("--topic-template", template);
        for (field, flag, default) in [
            ("key", "--key-column", "aggregateid"),
            ("id", "--id-column", "id"),
            ("payload", "--payload-column", "payload"),
        ] {
            let column = option(self, &format!("table.field.event.{field}")).unwrap_or(default);
            self.arg(flag, column);
        }
        match option(self, "table.field.event.timestamp") {
            Some(column) => self.arg("--timestamp-column", column),
            None => self.warn(format!("{prefix}table.field.event.timestamp is not set: Debezium stamped records with the time it processed the change; the relay uses the commit time")),
        }
        self.placements(&prefix)?;
        for (name, flag) in [
            ("table.expand.json.payload", "--expand-json-payload"),
            (
                "table.json.payload.null.behavior",
                "--keep-json-payload-nulls",
            ),
            (
                "route.tombstone.on.empty.payload",
                "--tombstone-on-empty-payload",
            ),
        ] {
            let Some(value) = option(self, name) else {
                continue;
            };
            let key = format!("{prefix}{name}");
            match value.to_ascii_lowercase().as_str() {
                "true" | "optional_bytes" => self.arg(flag, "true"),
                _ if router_note(name, value) == Some(Ok("")) => {}
                _ => return Err(invalid(key, value, "not a value Debezium accepts")),
            }
            self.identical(&key, value);
        }
        if let Some(column) = option(self, "table.field.event.schema.version") {
            self.arg("--schema-version-column", column);
            self.identical(&format!("{prefix}table.field.event.schema.version"), column);
        }
        self.debezium_stops(&prefix);
        let tracing = option(self, "tracing.span.context.field");
        match tracing {
            Some(column) => {
                self.arg("--trace-context-column", column);
                self.identical(&format!("{prefix}tracing.span.context.field"), column);
            }
            None => self.warn(format!("{prefix}tracing.span.context.field: if the Connect worker ran an OpenTelemetry agent, Debezium wrote a traceparent header from the tracingspancontext column; add --trace-context-column tracingspancontext to do the same")),
        }
        let mut unknown = None;
        for (key, value) in self.take_prefixed(&prefix) {
            match router_note(&key[prefix.len()..], value) {
                Some(Ok("")) => self.identical(key, value),
                Some(Ok(why)) => self.warn(format!("{key}={value}: {why}")),
                Some(Err(why)) => return Err(invalid(key, value, why)),
                None => unknown = unknown.or(Some(key)),
            }
        }
        let why = "not an Outbox Event Router option of Debezium 3.6; remove it or fix its name";
        unknown.map_or(Ok(()), |key| Err(invalid(key, &self.config[key], why)))
    }

    /// What Debezium 3.6.3 does with the combinations it fails on, for `--explain`.
    fn debezium_stops(&mut self, prefix: &str) {
        let given = |this: &Self, flag: &str| this.out.args.iter().any(|(f, _)| f == flag);
        if given(self, "--expand-json-payload") && given(self, "--envelope-column") {
            let mut stop = format!(
                "{prefix}table.expand.json.payload with envelope fields: Debezium stops at the first payload that expands to no schema (an empty JSON array []), with a NullPointerException in the router's schema cache"
            );
            if given(self, "--schema-version-column") {
                stop += ", and at the first payload whose expanded schema differs from the first of its schema version (DataException: Struct schemas do not match)";
            }
            stop += ". Records are identical up to there; the relay treats those events as poison (it stops, or dead-letters them with --on-poison dead-letter)";
            self.out.debezium_stops.push(stop);
        }
        for role in ["key", "value"] {
            self.converter_stops(role);
        }
        let avro_values = self.has_arg("--value-converter", "avro")
            || self.has_arg("--value-delegate-converter", "avro");
        if avro_values && given(self, "--expand-json-payload") {
            self.out.debezium_stops.push(format!("{prefix}table.expand.json.payload with AvroConverter values: Debezium stops at the first payload with a field name Avro refuses (such as some-key, unless scrub.invalid.names=true) or with two different objects that would be records of one name, and, with the registry at its default BACKWARD compatibility, at the first expanded schema the registry refuses (409). Records are identical up to there; the relay treats those events as poison (it stops, or dead-letters them with --on-poison dead-letter), naming the subject and the registry's message"));
        }
        if given(self, "--timestamp-column") {
            self.out.debezium_stops.push(format!("{prefix}table.field.event.timestamp: Debezium reads the column as an int64 Timestamp or MicroTimestamp (a timestamp column under time.precision.mode adaptive) and stops on every event with any other type (a timestamptz is a ZonedTimestamp string); the relay also reads timestamptz and bigint (epoch milliseconds)"));
        }
    }

    /// What Debezium 3.6.3 does with a key's or value's converter where it fails.
    fn converter_stops(&mut self, role: &str) {
        let converter = format!("--{role}-converter");
        if self.has_arg(&converter, "bytearray") {
            self.out.debezium_stops.push(format!("{role}.converter=ByteArrayConverter: Debezium stops at the first event whose {role} is not bytes (a bytea column under binary.handling.mode=bytes); the relay refuses any other column type at start-up"));
        }
        let delegate = format!("--{role}-delegate-converter");
        if self.has_arg(&converter, "binary-data")
            && !self.out.args.iter().any(|(f, _)| *f == delegate)
        {
            self.out.debezium_stops.push(format!("{role}.converter=BinaryDataConverter without {role}.converter.delegate.converter.type: Debezium stops at the first event whose {role} is not bytes (a bytea column under binary.handling.mode=bytes); the relay refuses any other column type at start-up"));
        }
        let avro = self.has_arg(&converter, "avro") || self.has_arg(&delegate, "avro");
        let strategy = format!("--{role}-subject-name-strategy");
        let by_record =
            self.has_arg(&strategy, "record") || self.has_arg(&strategy, "topic-record");
        let given = |flag: &str| self.out.args.iter().any(|(f, _)| f == flag);
        let never_a_record = role == "key" || !given("--envelope-column");
        if avro && by_record && never_a_record && !given("--transform") {
            self.out.debezium_stops.push(format!("{role}.subject.name.strategy naming subjects after records: Debezium stops at the first event, as the router's {role} is never an Avro record (only an envelope is one); the relay refuses it at start-up"));
        }
    }

    /// Whether the import gave `flag` the value `value`.
    fn has_arg(&self, flag: &str, value: &str) -> bool {
        (self.out.args.iter()).any(|(f, v)| f == flag && v == value)
    }

    /// `transforms.ROUTER.predicate`: which change events the router applies to. The relay
    /// routes every insert of the `--table` tables, so a predicate that holds for all of their
    /// change events changes nothing; one that does not is refused, naming the table.
    fn router_predicate(&mut self, router: &str) -> Result<(), Error> {
        let key = format!("transforms.{router}.predicate");
        let Some(predicate) = self.take(&key) else {
            return Ok(());
        };
        let negate = self.take(&format!("transforms.{router}.negate"));
        let negate = negate.is_some_and(|v| v.eq_ignore_ascii_case("true"));
        let naming = ["topic.naming.strategy", "topic.delimiter"];
        if let Some(option) = naming.iter().find(|o| self.config.contains_key(**o)) {
            let why = format!(
                "the relay cannot tell which change events the router's predicate selects under {option}"
            );
            return Err(invalid(key, predicate, why));
        }
        let pattern = self.router_pattern(&key, predicate)?;
        let prefix = self.config.get("topic.prefix").map_or("", |p| p.trim());
        let tables = self.out.args.iter().filter(|(flag, _)| flag == "--table");
        let topics: Vec<String> = tables.map(|(_, t)| format!("{prefix}.{t}")).collect();
        for topic in &topics {
            let holds = pattern.as_ref().is_some_and(|p| p.is_match(topic));
            if holds == negate {
                let why = format!(
                    "false for the change events of {topic}: Debezium passed them on without the router, which the relay does not reproduce; leave that table out of table.include.list"
                );
                return Err(invalid(key, predicate, why));
            }
        }
        let why = format!(
            "holds for the change events of every outbox table ({}), so the router routes them all, as the relay does",
            topics.join(", ")
        );
        self.no_effect(&key, predicate, &why);
        for (key, value) in self.take_prefixed(&format!("predicates.{predicate}.")) {
            self.no_effect(key, value, "the router's predicate, above");
        }
        Ok(())
    }

    /// The topics the router's predicate (`key`, naming `predicate`) holds for: a pattern
    /// (`TopicNameMatches`), or `None` for none (`RecordIsTombstone`: an insert's change event
    /// is never a tombstone).
    fn router_pattern(&self, key: &str, predicate: &str) -> Result<Option<regex::Regex>, Error> {
        let predicate_prefix = format!("predicates.{predicate}.");
        let settings: BTreeMap<&str, &str> = prefixed(self.config, &predicate_prefix).collect();
        let setting = |name: &str| {
            settings
                .get(format!("predicates.{predicate}.{name}").as_str())
                .copied()
        };
        let class = setting("type").unwrap_or_default();
        let class = class.rsplit('.').next().unwrap_or_default();
        match class {
            "TopicNameMatches" => {
                let pattern = setting("pattern").unwrap_or_default();
                let regex = regex::Regex::new(&format!("^(?:{pattern})$"));
                let why = |e| {
                    format!(
                        "its pattern {pattern:?} is not a regular expression the relay reads the same way: {e}"
                    )
                };
                Ok(Some(regex.map_err(|e| invalid(key, predicate, why(e)))?))
            }
            "RecordIsTombstone" => Ok(None),
            _ => {
                let why = format!(
                    "a {class:?} predicate on the router: the relay reproduces the router's TopicNameMatches and RecordIsTombstone predicates"
                );
                Err(invalid(key, predicate, why))
            }
        }
    }

    /// The transforms after the router, as `--transform` flags, each checked by the relay's
    /// transform chain (which refuses what it does not reproduce, by name).
    fn transforms_after(&mut self, names: &[&str]) -> Result<(), Error> {
        if names.is_empty() {
            return Ok(());
        }
        let mut settings = vec![("transforms".to_owned(), names.join(","))];
        let mut predicates: Vec<&str> = Vec::new();
        for name in names {
            for (key, value) in self.take_prefixed(&format!("transforms.{name}.")) {
                if key.ends_with(".predicate") && !predicates.contains(&value) {
                    predicates.push(value);
                }
                settings.push((key.to_owned(), value.to_owned()));
            }
        }
        if !predicates.is_empty() {
            settings.push(("predicates".to_owned(), predicates.join(",")));
        }
        for predicate in &predicates {
            let prefix = format!("predicates.{predicate}.");
            let keys: Vec<(&str, &str)> = prefixed(self.config, &prefix).collect();
            self.used.extend(keys.iter().map(|(k, _)| *k));
            settings.extend(keys.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
        }
        Chain::parse(&settings).map_err(|e| invalid(e.key, &e.value, e.reason))?;
        for (key, value) in settings {
            self.identical(&key, &value);
            self.arg("--transform", format!("{key}={value}"));
        }
        Ok(())
    }

    fn topic_template(&mut self, prefix: &str) -> Result<String, Error> {
        let regex_key = format!("{prefix}route.topic.regex");
        let groups = match self.take(&regex_key) {
            None => (1, true),
            Some(raw) => {
                let groups =
                    route_regex(raw).ok_or_else(|| invalid(&regex_key, raw, NO_REGEX_ROUTING))?;
                if raw != DEFAULT_ROUTE_REGEX {
                    self.warn(format!("{regex_key} is treated as the default {DEFAULT_ROUTE_REGEX}: both capture the whole route-by value"));
                }
                groups
            }
        };
        let key = format!("{prefix}route.topic.replacement");
        let replacement = self.take(&key).unwrap_or("outbox.event.${routedByValue}");
        convert_replacement(replacement, groups)
            .and_then(|template| TopicTemplate::parse(&template).map(|_| template))
            .map_err(|reason| invalid(key, replacement, reason))
    }

    /// Maps `table.fields.additional.placement` to header, envelope and partition flags.
    fn placements(&mut self, prefix: &str) -> Result<(), Error> {
        let key = format!("{prefix}table.fields.additional.placement");
        let Some(list) = self.take(&key) else {
            return Ok(());
        };
        for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let parts: Vec<&str> = entry.split(':').map(str::trim).collect();
            let (column, placement, alias) = match parts[..] {
                [column, placement] => (column, placement.to_ascii_lowercase(), column),
                [column, placement, alias] => (column, placement.to_ascii_lowercase(), alias),
                _ => return Err(invalid(key, entry, PLACEMENT)),
            };
            let flag = match placement.as_str() {
                "header" => "--header-column",
                "envelope" => "--envelope-column",
                "partition" => {
                    // Debezium keeps the last partition field.
                    self.out.args.retain(|(f, _)| f != "--partition-column");
                    self.arg("--partition-column", column);
                    continue;
                }
                _ => return Err(invalid(key, entry, PLACEMENT)),
            };
            match alias == column {
                true => self.arg(flag, column),
                false => self.arg(flag, format!("{column}:{alias}")),
            }
        }
        self.identical(&key, list);
        Ok(())
    }

    fn producer_overrides(&mut self) -> Result<(), Error> {
        let mut dropped = Vec::new();
        let worker = self
            .worker
            .into_iter()
            .flat_map(|w| prefixed(w, "producer."));
        for (key, value) in worker.chain(self.take_prefixed("producer.override.")) {
            let name = key
                .strip_prefix("producer.override.")
                .unwrap_or(&key["producer.".len()..]);
            if let Some(why) = producer_refusal(name, value) {
                return Err(invalid(key, value, why));
            }
            if !key.starts_with("producer.override.") {
                // The worker's other producer settings are the deployment's, not the records'.
                continue;
            }
            if let Some(iam) = msk_iam(name, value) {
                self.msk_iam(iam);
                continue;
            }
            match producer_note(name, value) {
                Err(why) => dropped.push(format!("{name} ({why})")),
                Ok(note) => {
                    if !note.is_empty() {
                        self.warn(format!("{key}={value}: {note}"));
                    }
                    let name = name.replace("max.request.size", "message.max.bytes");
                    self.arg("-X", format!("{name}={value}"));
                }
            }
        }
        self.warn_all(&dropped, |list| {
            format!("producer.override properties librdkafka would refuse, not passed on: {list}")
        });
        Ok(())
    }

    /// The flags the MSK IAM library's producer setting becomes.
    fn msk_iam(&mut self, iam: MskIam) {
        match iam {
            MskIam::Mechanism => {
                self.out.args.retain(|(flag, _)| flag != "--kafka-auth");
                self.arg("--kafka-auth", "aws-msk-iam");
            }
            MskIam::Role(role) => self.arg("--aws-role-arn", role),
            MskIam::Implied => {}
        }
    }

    /// Error handling, heartbeats, and what is left: each remaining key classified
    /// ([`options::classify`]): no effect on the records, a difference outside them, or refused.
    fn leftovers(&mut self) -> Result<(), Error> {
        let tolerance = self.take("errors.tolerance").unwrap_or_default();
        let dlq = self.take("errors.deadletterqueue.topic.name");
        self.take_prefixed("errors.deadletterqueue.");
        if tolerance.eq_ignore_ascii_case("all") || dlq.is_some() {
            let topic = dlq.unwrap_or("TOPIC");
            self.warn(format!("errors.tolerance / errors.deadletterqueue.*: a source connector skipped records that failed conversion (Connect's dead-letter queue is for sink connectors only); the relay never skips an event silently but stops before acknowledging one it cannot deliver. To divert such events instead, add --on-poison dead-letter --dead-letter-topic {topic}"));
        }
        let interval = self.config.get("heartbeat.interval.ms");
        if let Some(Ok(ms @ 1..)) = interval.map(|v| v.trim().parse::<u64>()) {
            self.arg("--heartbeat-interval", format!("{ms}ms"));
        }
        let heartbeat = self.take_prefixed("heartbeat.");
        let keys: Vec<_> = heartbeat.iter().map(|(k, _)| *k).collect();
        self.warn_all(&keys, |keys| {
            format!("{keys}: the relay maps heartbeat.interval.ms to --heartbeat-interval, which writes a logical decoding message (no heartbeat.action.query, no heartbeat topic); when nothing is in flight it also acknowledges keepalive positions, so a quiet outbox does not pin WAL")
        });
        for (key, value) in self.take_prefixed("transforms.") {
            self.no_effect(
                key,
                value,
                "a transform not in transforms=, which Kafka Connect ignores",
            );
        }
        for (key, value) in self.take_prefixed("predicates") {
            self.no_effect(key, value, "no transform uses this predicate");
        }
        let tables = self.flag_values(&["--table"]);
        let columns = self.flag_values(&[
            "--route-by",
            "--key-column",
            "--id-column",
            "--payload-column",
            "--timestamp-column",
            "--header-column",
            "--envelope-column",
            "--partition-column",
            "--schema-version-column",
            "--trace-context-column",
        ]);
        let reads = Reads {
            tables: &tables,
            columns: &columns,
        };
        for (key, value) in self.take_prefixed("") {
            match options::classify(key, value, reads) {
                Some(Class::NoEffect(why)) => self.no_effect(key, value, &why),
                Some(Class::Differs(how)) => self.warn(format!("{key}={value}: {how}")),
                Some(Class::Refused(why)) => return Err(invalid(key, value, why)),
                None => self.no_effect(key, value, "not an option of Debezium 3.6.3's Postgres connector or of Kafka Connect; they ignore it too"),
            }
        }
        Ok(())
    }

    /// The values the import gave `flags`, a column flag's alias (`COLUMN:NAME`) left out.
    fn flag_values(&self, flags: &[&str]) -> Vec<String> {
        let given = self
            .out
            .args
            .iter()
            .filter(|(flag, _)| flags.contains(&flag.as_str()));
        let column = |value: &String| value.split(':').next().unwrap_or_default().to_owned();
        given.map(|(_, value)| column(value)).collect()
    }
}

/// The `--ROLE-converter` value of one of Kafka's converters, by class name.
fn simple_converter(class: &str) -> Result<&'static str, &'static str> {
    let short = class.rsplit('.').next().unwrap_or_default();
    let kafka = class == short || class.starts_with("org.apache.kafka.connect.");
    if registry::is_avro(class) {
        return Ok("avro");
    }
    if registry::is_protobuf(class) {
        return Ok("protobuf");
    }
    if let Some(why) = registry::refused_converter(class) {
        return Err(why);
    }
    match short {
        "StringConverter" if kafka => Ok("string"),
        "ByteArrayConverter" if kafka => Ok("bytearray"),
        "JsonConverter" if kafka => Ok("json-with-schemas"),
        _ => Err(CONVERTERS),
    }
}

/// Every `(key, trimmed value)` of `map` under `prefix`.
fn prefixed<'m>(
    map: &'m BTreeMap<String, String>,
    prefix: &str,
) -> impl Iterator<Item = (&'m str, &'m str)> {
    let under = map.iter().filter(move |(k, _)| k.starts_with(prefix));
    under.map(|(k, v)| (k.as_str(), v.trim()))
}

/// Recognises the regexes equivalent to the default: an optional `^`/`$` around `.*` or
/// `.+`, bare, in a group, or in the `routedByValue` group. Returns the number of groups
/// (0 or 1) and whether group 1 is `routedByValue`.
fn route_regex(raw: &str) -> Option<(u32, bool)> {
    let inner = raw.strip_prefix('^').unwrap_or(raw);
    match inner.strip_suffix('$').unwrap_or(inner) {
        ".*" | ".+" => Some((0, false)),
        "(.*)" | "(.+)" => Some((1, false)),
        "(?<routedByValue>.*)" | "(?<routedByValue>.+)" => Some((1, true)),
        _ => None,
    }
}

/// Rewrites a Java `Matcher` replacement (`${name}`, `$N`, `\x` escapes) as a topic
/// template, where every group reference is the whole routing value.
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
            ('$', _) => return Err("a '$' must start ${routedByValue} or a group number; write \\$ for a literal dollar".to_owned()),
            (other, _) => out.push(other),
        }
    }
    Ok(out)
}

/// `${provider:path:key}`, Kafka Connect's config-provider syntax.
fn is_config_provider(value: &str) -> bool {
    let rest = value.split_once("${").map_or("", |(_, rest)| rest);
    rest.split_once('}')
        .is_some_and(|(inner, _)| inner.contains(':'))
}

#[cfg(test)]
mod tests;
