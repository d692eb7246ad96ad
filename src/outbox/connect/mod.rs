//! PURE: records as Debezium 3.6's Outbox Event Router and Kafka Connect's converters write
//! them, so that a consumer of a Debezium deployment reads the relay's records unchanged.
//!
//! The router turns a row into a key, a value and headers of Connect data, each column typed
//! as Debezium's Postgres connector types it (with the catalog's `NOT NULL` and `DEFAULT`);
//! the worker's converters then make bytes of them. [`ConnectConfig`] holds the connector's
//! settings; [`ConnectPlan`] binds them to one table's columns, refusing at start-up what
//! Debezium could not have produced or what the relay does not reproduce. Without a
//! `ConnectConfig`, nothing here runs: the relay's own output is untouched.

pub mod data;
pub mod expand;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use tokio_postgres::types::Type;

use super::{
    BindError, EventError, HeaderColumn, MappingConfig, OutboxRecord, column_index, invalid, values,
};
use crate::pgoutput::{Relation, TupleData, Value};
use data::{Data, Kind, Schema};
use expand::Expanded;

/// How a key or value becomes bytes: the relay's own way, or a Kafka Connect converter's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Converter {
    /// The column's bytes as the relay sends them without Debezium compatibility.
    #[default]
    Relay,
    /// `org.apache.kafka.connect.storage.StringConverter`
    String,
    /// `org.apache.kafka.connect.converters.ByteArrayConverter`
    Bytearray,
    /// `org.apache.kafka.connect.json.JsonConverter` with `schemas.enable=false`
    Json,
    /// `org.apache.kafka.connect.json.JsonConverter` with `schemas.enable=true`
    JsonWithSchemas,
}

impl Converter {
    /// Whether the converter writes a column's `NOT NULL` and `DEFAULT` (so needs the catalog).
    fn reads_catalog(self) -> bool {
        matches!(self, Converter::Json | Converter::JsonWithSchemas)
    }
}

/// Debezium's logical decoding plugin name, its `__debezium.context.connectorName` header.
const CONNECTOR_NAME: &str = "postgresql";
/// Debezium's payload schema cache holds this many schemas; the relay's stops growing there.
const SCHEMA_CACHE_CAPACITY: usize = 10_000;

/// The Debezium settings that shape records (`debezium-config` imports them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectConfig {
    /// `key.converter`
    pub key: Converter,
    /// `value.converter`
    pub value: Converter,
    /// `topic.prefix`: the context header's logical name and the envelope schema's prefix.
    pub topic_prefix: String,
    /// `extended.headers.enabled`: the `__debezium.context.*` headers, with this run's id.
    pub context_headers: Option<Arc<str>>,
    /// `table.expand.json.payload`
    pub expand_json_payload: bool,
    /// `table.json.payload.null.behavior=optional_bytes`
    pub json_nulls_as_bytes: bool,
    /// `table.fields.additional.placement` envelope fields: column and field name.
    pub envelope: Vec<HeaderColumn>,
    /// `table.fields.additional.placement` partition field.
    pub partition_column: Option<String>,
    /// `table.field.event.schema.version`
    pub schema_version_column: Option<String>,
    /// `route.tombstone.on.empty.payload`
    pub tombstone_on_empty: bool,
    /// `tracing.span.context.field`, when the Connect worker ran an OpenTelemetry agent.
    pub trace_column: Option<String>,
    /// The envelope schemas named so far, shared by every table as Debezium's router shares them.
    pub schema_cache: SchemaCache,
}

impl ConnectConfig {
    /// Whether binding a table needs its columns' `NOT NULL` and `DEFAULT`.
    pub fn reads_catalog(&self) -> bool {
        self.key.reads_catalog() || self.value.reads_catalog()
    }
}

/// Envelope schemas by cache key (the version, or the payload's schema), first come first kept.
#[derive(Clone, Debug, Default)]
pub struct SchemaCache(Arc<Mutex<HashMap<CacheKey, Schema>>>);

impl PartialEq for SchemaCache {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl Eq for SchemaCache {}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum CacheKey {
    Version(Option<i32>),
    Payload(Option<Schema>),
}

/// A column's `NOT NULL` and `DEFAULT` expression, read from the catalog when its table is
/// announced (Debezium reads them then too).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ColumnFacts {
    /// The column.
    pub name: String,
    /// `attnotnull`
    pub not_null: bool,
    /// `pg_get_expr(adbin, adrelid)`, when the column has a default.
    pub default: Option<String>,
}

/// A bound column: its index and Connect schema.
#[derive(Clone, Debug)]
struct Col {
    index: usize,
    schema: Schema,
}

impl Col {
    fn bind(
        relation: &Relation,
        table: &str,
        facts: &[ColumnFacts],
        flag: &'static str,
        name: &str,
    ) -> Result<Col, BindError> {
        let index = column_index(relation, table, flag, name)?;
        let oid = relation.columns[index].type_oid;
        // The types whose Connect encoding the relay reproduces (Debezium's default modes).
        let (kind, logical) = match Type::from_oid(oid) {
            Some(Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME) => (Kind::String, None),
            Some(Type::UUID) => (Kind::String, Some("io.debezium.data.Uuid")),
            Some(Type::JSON | Type::JSONB) => (Kind::String, Some("io.debezium.data.Json")),
            Some(Type::INT2) => (Kind::Int16, None),
            Some(Type::INT4) => (Kind::Int32, None),
            Some(Type::INT8) => (Kind::Int64, None),
            Some(Type::BOOL) => (Kind::Boolean, None),
            Some(Type::BYTEA) => (Kind::Bytes, None),
            other => {
                let ty = other.map_or_else(|| format!("oid {oid}"), |t| t.to_string());
                let why = format!(
                    "its type {ty} is not one whose Debezium encoding the relay reproduces (text, varchar, char, uuid, json, jsonb, smallint, integer, bigint, boolean, bytea)"
                );
                return Err(refuse(table, flag, name, why));
            }
        };
        let facts = facts.iter().find(|f| f.name == name);
        let default = facts.and_then(|f| parse_default(f.default.as_deref()?, &kind));
        let schema = Schema {
            kind,
            optional: !facts.is_some_and(|f| f.not_null),
            name: logical.map(str::to_owned),
            version: logical.map(|_| 1),
            doc: None,
            parameters: Vec::new(),
            default,
        };
        Ok(Col { index, schema })
    }

    /// The column's Connect value in `row`.
    fn data(&self, row: &TupleData, name: &str) -> Result<Data, EventError> {
        let invalid = |reason: &str| invalid(name.to_owned(), reason);
        let text = match row.0.get(self.index) {
            Some(Value::Text(text)) => text,
            Some(Value::Null) => return Ok(Data::Null),
            _ => return Err(invalid("not a text-format value")),
        };
        let utf8 = || std::str::from_utf8(text).map_err(|_| invalid("not UTF-8"));
        Ok(match self.schema.kind {
            Kind::Int16 | Kind::Int32 | Kind::Int64 => {
                Data::Int(utf8()?.parse().map_err(|_| invalid("not an integer"))?)
            }
            Kind::Boolean => Data::Bool(text.as_ref() == b"t"),
            Kind::Bytes => Data::Bytes(
                values::decode_bytea_hex(text)
                    .ok_or_else(|| invalid("bytea text is not in hex format"))?
                    .to_vec(),
            ),
            _ => Data::Str(utf8()?.to_owned()),
        })
    }
}

/// A refusal naming the option and why Debezium's bytes are out of reach.
fn refuse(table: &str, option: &str, column: &str, why: impl Into<String>) -> BindError {
    BindError::Unreproducible {
        table: table.to_owned(),
        option: format!("{option} {column}"),
        reason: why.into(),
    }
}

/// Debezium's reading of a column default: a literal (`'Event'::character varying`, `42`,
/// `true`); anything computed (`now()`, `gen_random_uuid()`) is no default.
fn parse_default(expr: &str, kind: &Kind) -> Option<Data> {
    let (literal, cast) = match expr.strip_prefix('\'') {
        Some(rest) => {
            let (inner, cast) = rest.rsplit_once('\'')?;
            (Some(inner.replace("''", "'")), cast)
        }
        None => (None, ""),
    };
    let type_name = |c: char| c.is_ascii_alphanumeric() || " _:".contains(c);
    if !(cast.is_empty() || cast.starts_with("::") && cast.chars().all(type_name)) {
        return None;
    }
    match (kind, literal) {
        (Kind::String, Some(text)) => Some(Data::Str(text)),
        (Kind::Int16 | Kind::Int32 | Kind::Int64, text) => {
            text.as_deref().unwrap_or(expr).parse().ok().map(Data::Int)
        }
        // Only `true` and `false` parse.
        (Kind::Boolean, None) => expr.parse().ok().map(Data::Bool),
        _ => None,
    }
}

/// [`ConnectConfig`] bound to one table.
#[derive(Clone, Debug)]
pub struct ConnectPlan {
    config: ConnectConfig,
    /// `topic.prefix.schema.table`, before the route and `.Value` in envelope schema names.
    record_name: String,
    route: Col,
    key: Col,
    id: Col,
    payload: Col,
    payload_name: String,
    headers: Vec<(Col, String, Arc<str>)>,
    envelope: Vec<(Col, String)>,
    partition: Option<Col>,
    version: Option<Col>,
    trace: Option<usize>,
}

impl ConnectPlan {
    /// Binds `config` to the table's columns (those `mapping`'s flags name), or refuses what
    /// would not match Debezium.
    pub fn bind(
        config: &ConnectConfig,
        relation: &Relation,
        facts: &[ColumnFacts],
        mapping: &MappingConfig,
    ) -> Result<Self, BindError> {
        let table = format!("{}.{}", relation.namespace, relation.name);
        let refusal = |flag: &str, name: &str, why: &str| refuse(&table, flag, name, why);
        if config.reads_catalog() && facts.is_empty() {
            let why = "the catalog's NOT NULL and DEFAULT of its columns were not read";
            return Err(refusal("--key-converter/--value-converter", "json", why));
        }
        let col = |flag, name: &str| Col::bind(relation, &table, facts, flag, name);
        // A column Debezium reads as `kind` (`named`), stopping on any other type.
        let typed = |flag, name: &str, kind: Kind, named: &str| {
            let col = col(flag, name)?;
            if col.schema.kind != kind {
                let why = format!("Debezium reads it as {named} and stops on any other type");
                return Err(refusal(flag, name, &why));
            }
            Ok(col)
        };
        let route = typed("--route-by", &mapping.route_by, Kind::String, "a string")?;
        let (key_column, payload_column) = (&mapping.key_column, &mapping.payload_column);
        let key = col("--key-column", key_column)?;
        let id = col("--id-column", &mapping.id_column)?;
        let payload = col("--payload-column", payload_column)?;
        for (converter, col, flag, name) in [
            (config.key, &key, "--key-converter", key_column),
            (config.value, &payload, "--value-converter", payload_column),
        ] {
            if converter == Converter::Bytearray && col.schema.kind != Kind::Bytes {
                let why = "ByteArrayConverter takes only bytea; Debezium stops at the first event";
                return Err(refusal(flag, name, why));
            }
        }
        let mut headers = Vec::new();
        for h in &mapping.header_columns {
            let c = col("--header-column", &h.column)?;
            headers.push((c, h.column.clone(), Arc::from(h.header.as_str())));
        }
        for (c, name) in
            std::iter::once((&id, &mapping.id_column)).chain(headers.iter().map(|(c, n, _)| (c, n)))
        {
            if c.schema.kind == Kind::Bytes {
                let why = "SimpleHeaderConverter's text for bytes is not reproduced";
                return Err(refusal("header", name, why));
            }
        }
        let envelope = (config.envelope.iter())
            .map(|e| Ok((col("--envelope-column", &e.column)?, e.header.clone())))
            .collect::<Result<Vec<_>, BindError>>()?;
        if !envelope.is_empty() && !config.value.reads_catalog() {
            let why = "an envelope struct is written only by JsonConverter; other value converters print Java's Struct.toString() or stop";
            let first = &config.envelope[0].column;
            return Err(refusal("--envelope-column", first, why));
        }
        if config.expand_json_payload && !config.value.reads_catalog() {
            let why = "expanded payloads are structs, written only by JsonConverter";
            return Err(refusal("--expand-json-payload", "", why));
        }
        let int32 = |flag, name: &Option<String>| {
            let name = name.as_deref()?;
            Some(typed(flag, name, Kind::Int32, "an int32 (integer)"))
        };
        let partition = int32("--partition-column", &config.partition_column).transpose()?;
        let version = int32("--schema-version-column", &config.schema_version_column);
        // Debezium traces only rows of tables that have the column.
        let trace = (config.trace_column.as_deref()).and_then(|name| relation.column_index(name));
        Ok(ConnectPlan {
            config: config.clone(),
            record_name: format!("{}.{table}", config.topic_prefix),
            route,
            key,
            id,
            payload,
            payload_name: payload_column.clone(),
            headers,
            envelope,
            partition,
            version: version.transpose()?,
            trace,
        })
    }

    /// Makes `record` (mapped from `row`) Debezium's: its key, value, headers and partition; a
    /// [`Converter::Relay`] key or value stays the relay's own.
    pub fn convert(&self, row: &TupleData, record: &mut OutboxRecord) -> Result<(), EventError> {
        let stops = |reason: String| EventError::DebeziumStops { reason };
        if self.config.key != Converter::Relay {
            let data = self.key.data(row, "key")?;
            record.key = convert(self.config.key, Some(&self.key.schema), &data).map_err(stops)?;
        }
        if self.config.value != Converter::Relay {
            let (schema, data) = self.value(row)?;
            record.payload = convert(self.config.value, schema.as_ref(), &data).map_err(stops)?;
        }
        record.id = header_bytes(&self.id.data(row, "id")?).unwrap_or_default();
        // The context and trace headers come before `id`, the header columns after it.
        let mut headers = Vec::new();
        if let Some(run_id) = &self.config.context_headers {
            let prefix = self.config.topic_prefix.as_str();
            for (name, value) in [
                ("__debezium.context.connectorLogicalName", prefix),
                ("__debezium.context.taskId", "0"),
                ("__debezium.context.connectorName", CONNECTOR_NAME),
                ("__debezium.context.runId", run_id),
            ] {
                headers.push((
                    Arc::from(name),
                    Some(Bytes::copy_from_slice(value.as_bytes())),
                ));
            }
        }
        if let Some(Value::Text(context)) = self.trace.and_then(|i| row.0.get(i)) {
            headers.extend(trace_headers(context));
        }
        record.headers_before_id = headers.len();
        for (col, name, header) in &self.headers {
            headers.push((Arc::clone(header), header_bytes(&col.data(row, name)?)));
        }
        record.headers = headers;
        record.partition =
            int(self.partition.as_ref(), row, "partition")?.and_then(|p| i32::try_from(p).ok());
        Ok(())
    }

    /// The value's schema and data, as the router leaves them for the value converter.
    fn value(&self, row: &TupleData) -> Result<(Option<Schema>, Data), EventError> {
        let mut schema = Some(self.payload.schema.clone());
        let mut data = self.payload.data(row, &self.payload_name)?;
        if let (true, Data::Str(text)) = (self.config.expand_json_payload, &data) {
            match expand::expand(text, &self.payload_name, self.config.json_nulls_as_bytes) {
                Expanded::Unchanged => {}
                Expanded::NoSchema => schema = None,
                Expanded::Struct(s, d) => (schema, data) = (Some(s), d),
                Expanded::Stops(reason) => return Err(EventError::DebeziumStops { reason }),
            }
        }
        // Java's String.trim() drops every character up to U+0020.
        let empty = match &data {
            Data::Null => true,
            Data::Str(s) => s.trim_matches(|c| c <= ' ').is_empty(),
            _ => false,
        };
        if empty && self.config.tombstone_on_empty {
            return Ok((None, Data::Null));
        }
        if self.envelope.is_empty() {
            return Ok((schema, data));
        }
        let Some(payload_schema) = schema else {
            let reason = "a payload expanded without schema cannot go into an envelope".into();
            return Err(EventError::DebeziumStops { reason });
        };
        let mut fields = vec![("payload".to_owned(), payload_schema)];
        let mut values = vec![data];
        for (col, field) in &self.envelope {
            fields.push((field.clone(), col.schema.clone()));
            values.push(col.data(row, field)?);
        }
        let version = int(self.version.as_ref(), row, "version")?
            .map(|v| i32::try_from(v).unwrap_or_default());
        let route = match self.route.data(row, "route")? {
            Data::Str(route) => route,
            _ => String::new(),
        };
        let built = Schema {
            kind: Kind::Struct(fields),
            optional: false,
            name: Some(format!("{}.{route}.Value", self.record_name)),
            version,
            doc: None,
            parameters: Vec::new(),
            default: None,
        };
        Ok((Some(self.cached(built, version)?), Data::Struct(values)))
    }

    /// Debezium's cached envelope schema for this one: the first built for its version (with a
    /// version column) or its payload schema, whose name kept the first event's route.
    fn cached(&self, built: Schema, version: Option<i32>) -> Result<Schema, EventError> {
        let Kind::Struct(fields) = &built.kind else {
            return Ok(built);
        };
        let key = match &self.version {
            Some(_) => CacheKey::Version(version),
            None => CacheKey::Payload(fields.first().map(|(_, s)| s.clone())),
        };
        let mut cache = self
            .config
            .schema_cache
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let Some(cached) = cache.get(&key) else {
            if cache.len() < SCHEMA_CACHE_CAPACITY {
                cache.insert(key, built.clone());
            }
            return Ok(built);
        };
        // Connect checks each value against the cached field's type.
        let Kind::Struct(cached_fields) = &cached.kind else {
            return Ok(cached.clone());
        };
        let fits = fields.len() == cached_fields.len()
            && fields
                .iter()
                .zip(cached_fields)
                .all(|((_, now), (_, then))| match (&now.kind, &then.kind) {
                    (Kind::Struct(_) | Kind::Array(_), _) => now == then,
                    (now, then) => now == then,
                });
        if !fits {
            let reason = "its value does not fit the envelope schema Debezium cached from an earlier event with the same schema version".into();
            return Err(EventError::DebeziumStops { reason });
        }
        Ok(cached.clone())
    }
}

/// The integer in an optional column; `None` without the column, or when NULL.
fn int(col: Option<&Col>, row: &TupleData, name: &str) -> Result<Option<i64>, EventError> {
    match col.map(|col| col.data(row, name)).transpose()? {
        Some(Data::Int(i)) => Ok(Some(i)),
        _ => Ok(None),
    }
}

/// Bytes of `data` as a Connect `converter` writes them (`Err`: Debezium stops).
fn convert(
    converter: Converter,
    schema: Option<&Schema>,
    data: &Data,
) -> Result<Option<Bytes>, String> {
    match (converter, data) {
        (Converter::Json | Converter::JsonWithSchemas, data) => {
            let schemas = converter == Converter::JsonWithSchemas;
            let json = data::to_json(schema, data, schemas).map_err(|refused| refused.0)?;
            Ok(json.map(Bytes::from))
        }
        // ByteArrayConverter takes bytes only (checked at bind); StringConverter prints the
        // Java object: a ByteBuffer's description rather than its bytes.
        (Converter::String, Data::Bytes(b)) => Ok(Some(Bytes::from(format!(
            "java.nio.HeapByteBuffer[pos=0 lim={0} cap={0}]",
            b.len()
        )))),
        (_, data) => Ok(header_bytes(data)),
    }
}

/// `SimpleHeaderConverter` (and `StringConverter`): a value's text.
fn header_bytes(data: &Data) -> Option<Bytes> {
    Some(Bytes::from(match data {
        Data::Null => return None,
        Data::Str(s) => s.clone().into_bytes(),
        Data::Int(i) => i.to_string().into_bytes(),
        Data::Bool(b) => b.to_string().into_bytes(),
        Data::Bytes(b) => b.clone(),
        Data::Float(_) | Data::Decimal(_) | Data::Array(_) | Data::Struct(_) => return None,
    }))
}

/// The headers an OpenTelemetry agent's W3C propagator writes for a span started under the
/// context in `context` (a Java `.properties` text): `traceparent` with the parent's trace id
/// (a new one without a valid parent) and a new span id, then the parent's `tracestate`.
fn trace_headers(context: &[u8]) -> Vec<(Arc<str>, Option<Bytes>)> {
    let text = String::from_utf8_lossy(context);
    let mut properties = HashMap::new();
    let mut parsed = java_properties::PropertiesIter::new(text.as_bytes());
    let _ = parsed.read_into(|k, v| drop(properties.insert(k, v)));
    let random = |len: usize| hex::encode(&uuid::Uuid::new_v4().as_bytes()[..len]);
    // Lower-case hex of `n` digits, not all zero.
    let hex = |s: &str, n: usize| {
        s.len() == n && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    };
    let nonzero = |s: &str| s.bytes().any(|b| b != b'0');
    let parent =
        properties
            .get("traceparent")
            .and_then(|p| match p.split('-').collect::<Vec<_>>()[..] {
                ["00", trace, span, flags]
                    if hex(trace, 32)
                        && hex(span, 16)
                        && hex(flags, 2)
                        && nonzero(trace)
                        && nonzero(span) =>
                {
                    Some((
                        trace.to_owned(),
                        u8::from_str_radix(flags, 16).unwrap_or(0) & 1,
                    ))
                }
                _ => None,
            });
    let state = (parent.as_ref().and(properties.get("tracestate"))).filter(|s| !s.is_empty());
    let (trace, sampled) = parent.unwrap_or_else(|| (random(16), 1));
    let traceparent = format!("00-{trace}-{}-{sampled:02x}", random(8));
    let state = state.map(|state| ("tracestate", state.clone()));
    (std::iter::once(("traceparent", traceparent)).chain(state))
        .map(|(name, value)| (Arc::from(name), Some(Bytes::from(value))))
        .collect()
}

#[cfg(test)]
mod tests;
