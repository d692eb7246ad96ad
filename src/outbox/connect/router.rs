//! PURE: Debezium 3.6's Outbox Event Router, from an inserted row to a Kafka Connect record
//! ([`ConnectRecord`]): the key column, the payload (expanded, tombstoned or wrapped in an
//! envelope), the `id`, context, trace and placed headers, the partition. Each column is read
//! as Debezium's Postgres connector reads it ([`columns`](super::columns)); like the router,
//! every value a null column gives is its default (`Struct.get`).

use std::collections::HashMap;
use std::sync::{Arc, PoisonError};

use bytes::Bytes;

use super::columns::{Column, ColumnSite, PgType};
use super::data::{Data, Kind, Schema};
use super::expand::{self, Expanded};
use super::record::{ConnectRecord, Datum, Header};
use super::{CacheKey, ColumnFacts, ConnectConfig, Converter, SCHEMA_CACHE_CAPACITY};
use crate::outbox::{BindError, EventError, MappingConfig, column_index, invalid};
use crate::pgoutput::{Relation, TupleData, Value};

/// Debezium's logical decoding plugin name, its `__debezium.context.connectorName` header.
const CONNECTOR_NAME: &str = "postgresql";

/// A bound column: its index, name, how Debezium reads it, and its schema (shared by every
/// event's record).
#[derive(Clone, Debug)]
struct Col {
    index: usize,
    name: String,
    column: Column,
    schema: Arc<Schema>,
}

impl Col {
    fn bind(
        relation: &Relation,
        table: &str,
        facts: &[ColumnFacts],
        config: &ConnectConfig,
        flag: &'static str,
        name: &str,
    ) -> Result<Col, BindError> {
        let index = column_index(relation, table, flag, name)?;
        let announced = &relation.columns[index];
        let Some(pg) = PgType::of(announced.type_oid, announced.type_modifier) else {
            let oid = announced.type_oid;
            let ty = tokio_postgres::types::Type::from_oid(oid)
                .map_or_else(|| format!("oid {oid}"), |t| t.to_string());
            let why = format!(
                "its type {ty} is not one whose Debezium encoding the relay reproduces (text, varchar, char, name, uuid, json, jsonb, smallint, integer, bigint, boolean, bytea, numeric, real, double precision, date, time, timestamp, timestamptz)"
            );
            return Err(refuse(table, flag, name, why));
        };
        let fact = facts.iter().find(|f| f.name == name);
        let site = ColumnSite {
            table,
            name,
            not_null: fact.is_some_and(|f| f.not_null),
            default: fact.and_then(|f| f.default.as_deref()),
        };
        let column =
            Column::new(pg, site, &config.columns).map_err(|why| refuse(table, flag, name, why))?;
        Ok(Col {
            index,
            name: name.to_owned(),
            schema: Arc::new(column.schema.clone()),
            column,
        })
    }

    fn schema(&self) -> &Schema {
        &self.schema
    }

    /// The column's value in `row` as the router reads it (`Struct.get`): a null gives the
    /// column's default.
    fn get(&self, row: &TupleData) -> Result<Data, EventError> {
        match self.raw(row)? {
            Data::Null => Ok(self.schema().default.clone().unwrap_or(Data::Null)),
            data => Ok(data),
        }
    }

    /// The column's value in `row`, null as null.
    fn raw(&self, row: &TupleData) -> Result<Data, EventError> {
        let invalid = |reason: &str| invalid(self.name.clone(), reason);
        match row.0.get(self.index) {
            Some(Value::Text(text)) => self.column.read(text).map_err(|why| invalid(&why)),
            Some(Value::Null) => Ok(Data::Null),
            _ => Err(invalid("not a text-format value")),
        }
    }

    /// The column's value with its schema.
    fn datum(&self, row: &TupleData) -> Result<Datum, EventError> {
        Ok(Datum::new(Arc::clone(&self.schema), self.get(row)?))
    }
}

/// A refusal naming the option and why Debezium's bytes are out of reach.
pub(super) fn refuse(table: &str, option: &str, column: &str, why: impl Into<String>) -> BindError {
    BindError::Unreproducible {
        table: table.to_owned(),
        option: format!("{option} {column}"),
        reason: why.into(),
    }
}

/// [`ConnectConfig`]'s router bound to one table.
#[derive(Clone, Debug)]
pub struct Router {
    config: ConnectConfig,
    /// `topic.prefix.schema.table`, before the route and `.Value` in envelope schema names.
    record_name: String,
    route: Col,
    key: Col,
    id: Col,
    payload: Col,
    headers: Vec<(Col, Arc<str>)>,
    /// Debezium's context headers, built once.
    context: Vec<Header>,
    /// `id`, the header name.
    id_header: Arc<str>,
    envelope: Vec<(Col, String)>,
    partition: Option<Col>,
    version: Option<Col>,
    trace: Option<usize>,
}

impl Router {
    /// Binds `config` to the table's columns (those `mapping`'s flags name), or refuses what
    /// Debezium could not have produced.
    pub fn bind(
        config: &ConnectConfig,
        relation: &Relation,
        facts: &[ColumnFacts],
        mapping: &MappingConfig,
    ) -> Result<Self, BindError> {
        let table = format!("{}.{}", relation.namespace, relation.name);
        let refusal = |flag: &str, name: &str, why: &str| refuse(&table, flag, name, why);
        if facts.is_empty() {
            let why = "the catalog's NOT NULL and DEFAULT of its columns were not read";
            return Err(refusal("--key-converter/--value-converter", "", why));
        }
        let col = |flag, name: &str| Col::bind(relation, &table, facts, config, flag, name);
        // A column Debezium reads as `kind` (`named`), stopping on any other type.
        let typed = |flag, name: &str, kind: Kind, named: &str| {
            let col = col(flag, name)?;
            if col.schema().kind != kind {
                let why = format!("Debezium reads it as {named} and stops on any other type");
                return Err(refusal(flag, name, &why));
            }
            Ok(col)
        };
        let route = typed("--route-by", &mapping.route_by, Kind::String, "a string")?;
        let key = col("--key-column", &mapping.key_column)?;
        let id = col("--id-column", &mapping.id_column)?;
        let payload = col("--payload-column", &mapping.payload_column)?;
        for (writer, col, flag) in [
            (config.key_writer(), &key, "--key-converter"),
            (config.value_writer(), &payload, "--value-converter"),
        ] {
            let why = match writer.of(Some(&col.schema().kind)) {
                None => {
                    "BinaryDataConverter passes only bytea through (under binary.handling.mode=bytes), and other columns need its delegate.converter.type; Debezium stops at the first event"
                }
                Some(Converter::Bytearray) if col.schema().kind != Kind::Bytes => {
                    "ByteArrayConverter takes only bytea (under binary.handling.mode=bytes); Debezium stops at the first event"
                }
                Some(_) => continue,
            };
            return Err(refusal(flag, &col.name, why));
        }
        let mut headers = Vec::new();
        for h in &mapping.header_columns {
            let c = col("--header-column", &h.column)?;
            headers.push((c, Arc::from(h.header.as_str())));
        }
        let envelope = (config.envelope.iter())
            .map(|e| Ok((col("--envelope-column", &e.column)?, e.header.clone())))
            .collect::<Result<Vec<_>, BindError>>()?;
        let int32 = |flag, name: &Option<String>| {
            let name = name.as_deref()?;
            Some(typed(flag, name, Kind::Int32, "an int32 (integer)"))
        };
        let partition = int32("--partition-column", &config.partition_column).transpose()?;
        let version = int32("--schema-version-column", &config.schema_version_column);
        // Debezium traces only rows of tables that have the column.
        let trace = (config.trace_column.as_deref()).and_then(|name| relation.column_index(name));
        Ok(Router {
            context: context_headers(config),
            id_header: Arc::from(crate::outbox::ID_HEADER),
            config: config.clone(),
            record_name: format!("{}.{table}", config.topic_prefix),
            route,
            key,
            id,
            payload,
            headers,
            envelope,
            partition,
            version: version.transpose()?,
            trace,
        })
    }

    /// The value's schema when it does not depend on the event (no expansion, no envelope):
    /// what start-up checks a value converter against.
    pub fn fixed_value_schema(&self) -> Option<&Schema> {
        let fixed = !self.config.expand_json_payload && self.envelope.is_empty();
        fixed.then(|| self.payload.schema())
    }

    /// The key's schema.
    pub fn key_schema(&self) -> &Schema {
        self.key.schema()
    }

    /// The headers the router adds from columns (`id` and the placed ones): name and schema.
    pub fn header_schemas(&self) -> Vec<(&str, &Schema)> {
        let id = std::iter::once((self.id.name.as_str(), self.id.schema()));
        let placed = self
            .headers
            .iter()
            .map(|(col, _)| (col.name.as_str(), col.schema()));
        id.chain(placed).collect()
    }

    /// Debezium's `__debezium.context.*` headers, the same in every record: written once by
    /// `write` (the header converter) rather than per record.
    pub fn write_context_headers(
        &mut self,
        write: impl Fn(&Datum) -> Result<Option<Bytes>, EventError>,
    ) {
        for header in &mut self.context {
            header.written = write(&header.value).ok();
        }
    }

    /// The record the router makes of `row`, routed to `topic`.
    pub fn route(&self, row: &TupleData, topic: String) -> Result<ConnectRecord, EventError> {
        let mut headers = Vec::with_capacity(self.context.len() + 2 + self.headers.len());
        headers.extend(self.context.iter().cloned());
        if let Some(Value::Text(context)) = self.trace.and_then(|i| row.0.get(i)) {
            headers.extend(trace_headers(context));
        }
        headers.push(Header::new(
            Arc::clone(&self.id_header),
            self.id.datum(row)?,
        ));
        for (col, header) in &self.headers {
            headers.push(Header::new(Arc::clone(header), col.datum(row)?));
        }
        let partition = int(self.partition.as_ref(), row)?.and_then(|p| i32::try_from(p).ok());
        Ok(ConnectRecord {
            topic,
            partition,
            key: self.key.datum(row)?,
            value: self.value(row)?,
            headers,
        })
    }

    /// The value's schema and data, as the router leaves them for the value converter.
    fn value(&self, row: &TupleData) -> Result<Datum, EventError> {
        let mut schema = Some(Arc::clone(&self.payload.schema));
        let mut data = self.payload.get(row)?;
        if let (true, Data::Str(text)) = (self.config.expand_json_payload, &data) {
            let field = &self.payload.name;
            match expand::expand(text, field, self.config.json_nulls_as_bytes) {
                Expanded::Unchanged => {}
                Expanded::NoSchema => schema = None,
                Expanded::Struct(s, d) => (schema, data) = (Some(Arc::new(s)), d),
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
            return Ok(Datum::null());
        }
        if self.envelope.is_empty() {
            return Ok(Datum { schema, data });
        }
        let Some(payload_schema) = schema else {
            let reason = "a payload expanded without schema (an empty JSON array) cannot go into an envelope: Debezium 3.6.3 fails with a NullPointerException in its schema cache".into();
            return Err(EventError::DebeziumStops { reason });
        };
        let mut fields = vec![("payload".to_owned(), Schema::clone(&payload_schema))];
        let mut values = vec![data];
        for (col, field) in &self.envelope {
            fields.push((field.clone(), col.schema().clone()));
            values.push(col.get(row)?);
        }
        let version =
            int(self.version.as_ref(), row)?.map(|v| i32::try_from(v).unwrap_or_default());
        let route = match self.route.get(row)? {
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
        let schema = self.cached(built, version)?;
        Ok(Datum::new(schema, Data::Struct(values)))
    }

    /// Debezium's cached envelope schema for this one: the first built for its version (with a
    /// version column) or its payload schema, whose name kept the first event's route.
    fn cached(&self, built: Schema, version: Option<i32>) -> Result<Arc<Schema>, EventError> {
        let Kind::Struct(fields) = &built.kind else {
            return Ok(Arc::new(built));
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
            let built = Arc::new(built);
            if cache.len() < SCHEMA_CACHE_CAPACITY {
                cache.insert(key, Arc::clone(&built));
            }
            return Ok(built);
        };
        // Connect checks each value against the cached field's type.
        let Kind::Struct(cached_fields) = &cached.kind else {
            return Ok(Arc::clone(cached));
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
            let reason = "its value does not fit the envelope schema Debezium cached from an earlier event with the same schema version (DataException: Struct schemas do not match)".into();
            return Err(EventError::DebeziumStops { reason });
        }
        Ok(Arc::clone(cached))
    }
}

/// The integer in an optional column (its default when null); `None` without the column, or
/// when null.
fn int(col: Option<&Col>, row: &TupleData) -> Result<Option<i64>, EventError> {
    match col.map(|col| col.get(row)).transpose()? {
        Some(Data::Int(i)) => Ok(Some(i)),
        _ => Ok(None),
    }
}

/// A header of a required string, as `Headers.addString` adds one.
fn text_header(name: &str, value: &str) -> Header {
    let value = Datum::new(Schema::required(Kind::String), Data::Str(value.to_owned()));
    Header::new(Arc::from(name), value)
}

/// Debezium's `__debezium.context.*` headers (`extended.headers.enabled`), with this run's id.
fn context_headers(config: &ConnectConfig) -> Vec<Header> {
    let Some(run_id) = &config.context_headers else {
        return Vec::new();
    };
    let prefix = config.topic_prefix.as_str();
    [
        ("__debezium.context.connectorLogicalName", prefix),
        ("__debezium.context.taskId", "0"),
        ("__debezium.context.connectorName", CONNECTOR_NAME),
        ("__debezium.context.runId", run_id),
    ]
    .into_iter()
    .map(|(name, value)| text_header(name, value))
    .collect()
}

/// The headers an OpenTelemetry agent's W3C propagator writes for a span started under the
/// context in `context` (a Java `.properties` text): `traceparent` with the parent's trace id
/// (a new one without a valid parent) and a new span id, then the parent's `tracestate`.
pub(super) fn trace_headers(context: &[u8]) -> Vec<Header> {
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
        .map(|(name, value)| text_header(name, &value))
        .collect()
}
