//! PURE: records as Debezium 3.6's Outbox Event Router and Kafka Connect's converters write
//! them, so that a consumer of a Debezium deployment reads the relay's records unchanged.
//!
//! As in a Kafka Connect worker, a row goes through three stages: the router ([`router`])
//! makes a Connect record of it (key, value and headers as schema and data, each column typed
//! as Debezium's Postgres connector types it, [`columns`]); the transforms configured after
//! the router change that record; the converters make bytes of its key, value and headers.
//! [`ConnectConfig`] holds the connector's settings; [`ConnectPlan`] binds them to one table's
//! columns, refusing at start-up what Debezium could not have produced or what the relay does
//! not reproduce. Without a `ConnectConfig`, nothing here runs: the relay's own output is
//! untouched.

pub mod avro;
pub mod columns;
mod converters;
pub mod data;
pub mod expand;
pub mod protobuf;
pub mod record;
pub mod registry;
pub mod router;
pub mod temporal;
pub mod transforms;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use super::{
    BindError, EventError, HeaderColumn, ID_HEADER, MappingConfig, OutboxRecord, RawParts,
};
use crate::pgoutput::{Relation, TupleData};
use columns::ColumnModes;
use converters::{convert, header_bytes, text_refusal};
use data::{Data, Kind, Schema};
use record::{ConnectRecord, Datum};
use router::Router;
use transforms::Chain;

pub use registry::PendingSchemas;

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
    /// `io.debezium.converters.BinaryDataConverter`: bytes as they are, anything else through
    /// its `delegate.converter.type` (`--key-delegate-converter`, `--value-delegate-converter`).
    BinaryData,
    /// `io.confluent.connect.avro.AvroConverter`: Avro, its schema in a Schema Registry.
    Avro,
    /// `io.confluent.connect.protobuf.ProtobufConverter`: protobuf, its schema in a Schema
    /// Registry.
    Protobuf,
}

impl Converter {
    /// Whether the converter writes structs (envelopes, expanded payloads) as Debezium did.
    fn writes_structs(self) -> bool {
        matches!(
            self,
            Converter::Json | Converter::JsonWithSchemas | Converter::Avro | Converter::Protobuf
        )
    }

    /// Whether the converter can be a BinaryDataConverter's delegate.
    pub fn delegates(self) -> bool {
        !matches!(self, Converter::Relay | Converter::BinaryData)
    }
}

/// A key's or value's converter with, for a BinaryDataConverter, its delegate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Writer {
    converter: Converter,
    delegate: Option<Converter>,
}

impl Writer {
    /// The converter that writes data of `kind` (`None`: schemaless): a BinaryDataConverter
    /// passes bytes through and hands anything else to its delegate, when it has one.
    pub(crate) fn of(self, kind: Option<&Kind>) -> Option<Converter> {
        match (self.converter, kind) {
            (Converter::BinaryData, Some(Kind::Bytes)) => Some(Converter::BinaryData),
            (Converter::BinaryData, _) => self.delegate,
            (converter, _) => Some(converter),
        }
    }
}

/// How a header value becomes bytes: Kafka Connect's `header.converter`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum HeaderConverter {
    /// `org.apache.kafka.connect.storage.SimpleHeaderConverter`, Connect's default
    #[default]
    Simple,
    /// `org.apache.kafka.connect.json.JsonConverter` with `schemas.enable=false`
    Json,
    /// `org.apache.kafka.connect.json.JsonConverter` with `schemas.enable=true`
    JsonWithSchemas,
}

/// `JsonConverter`'s `decimal.format`: how a `Decimal` is written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum DecimalFormat {
    /// Base64 of the unscaled integer's bytes (Connect's default).
    #[default]
    Base64,
    /// A JSON number.
    Numeric,
}

/// Debezium's payload schema cache holds this many schemas; the relay's stops growing there.
const SCHEMA_CACHE_CAPACITY: usize = 10_000;

/// The Debezium settings that shape records (`debezium-config` imports them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectConfig {
    /// `key.converter`
    pub key: Converter,
    /// `value.converter`
    pub value: Converter,
    /// A BinaryDataConverter's `delegate.converter.type`, for keys and values.
    pub delegates: Delegates,
    /// `header.converter`
    pub header: HeaderConverter,
    /// `key.converter.decimal.format` (JsonConverter)
    pub key_decimal_format: DecimalFormat,
    /// `value.converter.decimal.format` (JsonConverter)
    pub value_decimal_format: DecimalFormat,
    /// `header.converter.decimal.format` (JsonConverter)
    pub header_decimal_format: DecimalFormat,
    /// How columns are read: `time.precision.mode`, `decimal.handling.mode`,
    /// `binary.handling.mode`, `column.propagate.source.type`, `datatype.propagate.source.type`.
    pub columns: ColumnModes,
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
    /// The Kafka Connect transforms after the router (`transforms`, `predicates`).
    pub transforms: Chain,
    /// The Schema Registry converters' settings and the schema ids known.
    pub registry: registry::RegistryFormat,
    /// The envelope schemas named so far, shared by every table as Debezium's router shares them.
    pub schema_cache: SchemaCache,
}

impl ConnectConfig {
    /// Whether binding a table needs its columns' `NOT NULL` and `DEFAULT`: always, as the
    /// router gives a null column its default in keys and headers too.
    pub fn reads_catalog(&self) -> bool {
        true
    }

    /// Whether a key or value is written through a Schema Registry.
    pub fn uses_registry(&self) -> bool {
        let registry = |w: Writer| {
            let through = |c: Converter| matches!(c, Converter::Avro | Converter::Protobuf);
            through(w.converter) || w.delegate.is_some_and(through)
        };
        registry(self.key_writer()) || registry(self.value_writer())
    }

    /// The key's converter, with its delegate.
    pub(crate) fn key_writer(&self) -> Writer {
        Writer {
            converter: self.key,
            delegate: self.delegates.key,
        }
    }

    /// The value's converter, with its delegate.
    pub(crate) fn value_writer(&self) -> Writer {
        Writer {
            converter: self.value,
            delegate: self.delegates.value,
        }
    }
}

/// The delegates of BinaryDataConverter keys and values (`delegate.converter.type`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Delegates {
    /// `key.converter.delegate.converter.type`
    pub key: Option<Converter>,
    /// `value.converter.delegate.converter.type`
    pub value: Option<Converter>,
}

/// Envelope schemas by cache key (the version, or the payload's schema), first come first kept.
#[derive(Clone, Debug, Default)]
pub struct SchemaCache(Arc<Mutex<HashMap<CacheKey, Arc<Schema>>>>);

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

/// [`ConnectConfig`] bound to one table: its router, then its converters.
#[derive(Clone, Debug)]
pub struct ConnectPlan {
    router: Router,
    config: ConnectConfig,
    /// Registry schemas derived for this table's keys and values.
    derived: registry::Derivations,
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
        let mut router = Router::bind(config, relation, facts, mapping)?;
        let decimals = config.header_decimal_format;
        router.write_context_headers(|datum| header_bytes(config.header, datum, decimals));
        let table = format!("{}.{}", relation.namespace, relation.name);
        let structs = config.value_writer().of(Some(&Kind::Struct(Vec::new())));
        let writes_structs = structs.is_some_and(Converter::writes_structs);
        if !config.envelope.is_empty() && !writes_structs {
            let why = "an envelope struct is written only by JsonConverter; other value converters print Java's Struct.toString() or stop";
            let first = &config.envelope[0].column;
            return Err(router::refuse(&table, "--envelope-column", first, why));
        }
        if config.expand_json_payload && !writes_structs {
            let why = "expanded payloads are structs, written only by JsonConverter";
            return Err(router::refuse(&table, "--expand-json-payload", "", why));
        }
        if let Some((flag, why)) = protobuf_unmeasured(config) {
            return Err(router::refuse(&table, flag, "", why));
        }
        let simple = config.header == HeaderConverter::Simple;
        let string = |converter| converter == Converter::String;
        // (flag, column, schema, whether a struct is written as Connect's own text).
        let mut texts: Vec<(&str, &str, &Schema, bool)> = Vec::new();
        if string(config.key) {
            texts.push(("--key-converter", "string", router.key_schema(), false));
        }
        if let (true, Some(value)) = (string(config.value), router.fixed_value_schema()) {
            texts.push(("--value-converter", "string", value, false));
        }
        if simple {
            let headers = router.header_schemas().into_iter();
            texts.extend(headers.map(|(column, schema)| ("header", column, schema, true)));
        }
        for (flag, column, schema, structs) in texts {
            if let Some(why) = text_refusal(schema, structs) {
                return Err(router::refuse(&table, flag, column, why));
            }
        }
        check_subject_strategies(config, &router, mapping, &table)?;
        Ok(ConnectPlan {
            router,
            config: config.clone(),
            derived: registry::Derivations::default(),
        })
    }

    /// Makes `record` (mapped from `row`) Debezium's: its key, value, headers and partition; a
    /// [`Converter::Relay`] key or value stays the relay's own. `None` when a `Filter` drops it.
    pub fn convert(
        &self,
        row: &TupleData,
        mut record: OutboxRecord,
    ) -> Result<Option<OutboxRecord>, EventError> {
        let routed = self.router.route(row, std::mem::take(&mut record.topic))?;
        let transformed = self.config.transforms.apply(routed);
        let Some(transformed) =
            transformed.map_err(|reason| EventError::DebeziumStops { reason })?
        else {
            return Ok(None);
        };
        self.write(transformed, &mut record)?;
        Ok(Some(record))
    }

    /// The converters' bytes of `routed`, into `record`.
    fn write(&self, routed: ConnectRecord, record: &mut OutboxRecord) -> Result<(), EventError> {
        let config = &self.config;
        let mut pending = registry::PendingSchemas {
            key: None,
            value: None,
            raw: RawParts::default(),
        };
        if config.key != Converter::Relay {
            let part = Part::key(config, &routed.topic);
            record.key = self.write_part(part, &routed.key, &mut pending.key)?;
        }
        if config.value != Converter::Relay {
            let part = Part::value(config, &routed.topic);
            record.payload = self.write_part(part, &routed.value, &mut pending.value)?;
        }
        if pending.key.is_some() || pending.value.is_some() {
            record.schemas = Some(Box::new(pending));
        }
        let mut headers = Vec::with_capacity(routed.headers.len());
        for header in routed.headers {
            let bytes = match header.written {
                Some(bytes) => bytes,
                None => header_bytes(config.header, &header.value, config.header_decimal_format)?,
            };
            headers.push((header.name, bytes));
        }
        // The relay's id (logs, dead letters, backfill) is the `id` header as written.
        let id = headers.iter().find(|(name, _)| &**name == ID_HEADER);
        record.id = id.and_then(|(_, value)| value.clone()).unwrap_or_default();
        record.headers = headers;
        record.id_header_at = None;
        record.topic = routed.topic;
        record.partition = routed.partition;
        Ok(())
    }

    /// Bytes of a key's or value's `datum` as its converter writes them; a registry
    /// converter's schema whose id is not known yet goes into `pending`.
    fn write_part(
        &self,
        part: Part<'_>,
        datum: &Datum,
        pending: &mut Option<registry::Pending>,
    ) -> Result<Option<Bytes>, EventError> {
        let schema = datum.schema.as_deref();
        let converter = match (part.writer.of(kind_of(schema, &datum.data)), &datum.data) {
            (_, Data::Null)
                if part.writer.converter == Converter::BinaryData && schema.is_none() =>
            {
                return Ok(None);
            }
            (Some(converter), _) => converter,
            (None, _) => {
                let reason = "BinaryDataConverter has no delegate.converter.type for a value that is not bytes";
                return Err(EventError::DebeziumStops {
                    reason: reason.into(),
                });
            }
        };
        let registry = &self.config.registry;
        let written = (schema, &datum.data);
        match converter {
            Converter::Avro => {
                (registry.avro(&self.derived, part.key, part.topic, written, pending))
                    .map_err(|reason| EventError::DebeziumStops { reason })
            }
            // What the derivation refuses was not measured against Confluent's converter.
            Converter::Protobuf => {
                (registry.protobuf(&self.derived, part.key, part.topic, written, pending))
                    .map_err(|reason| EventError::NotReproduced { reason })
            }
            _ => convert(converter, datum, part.decimals),
        }
    }
}

/// A key or a value on its way to a converter.
#[derive(Clone, Copy)]
struct Part<'a> {
    key: bool,
    writer: Writer,
    decimals: DecimalFormat,
    topic: &'a str,
}

impl<'a> Part<'a> {
    fn key(config: &ConnectConfig, topic: &'a str) -> Self {
        Part {
            key: true,
            writer: config.key_writer(),
            decimals: config.key_decimal_format,
            topic,
        }
    }

    fn value(config: &ConnectConfig, topic: &'a str) -> Self {
        Part {
            key: false,
            writer: config.value_writer(),
            decimals: config.value_decimal_format,
            topic,
        }
    }
}

/// The kind of `data`: its schema's, or where there is none (BinaryDataConverter looks at
/// the value then), bytes for bytes.
fn kind_of<'a>(schema: Option<&'a Schema>, data: &Data) -> Option<&'a Kind> {
    match (schema, data) {
        (Some(schema), _) => Some(&schema.kind),
        (None, Data::Bytes(_)) => Some(&Kind::Bytes),
        (None, _) => None,
    }
}

/// What a `ProtobufConverter` would write that was not measured against Confluent's: the
/// flag and why it is refused.
fn protobuf_unmeasured(config: &ConnectConfig) -> Option<(&'static str, &'static str)> {
    let protobuf =
        |w: Writer| w.converter == Converter::Protobuf || w.delegate == Some(Converter::Protobuf);
    if protobuf(config.value_writer()) && config.expand_json_payload {
        let why = "ProtobufConverter with expanded payloads is not reproduced, as measured against Debezium 3.6.3 with ProtobufConverter 7.0.16 (fixture protobuf-expand): a payload becomes a message whose field numbers follow the order Debezium's struct gives the JSON object's keys, which varies and the relay does not reproduce, and Debezium stops at a payload holding an array of arrays (IllegalArgumentException: Array cannot be nested); use AvroConverter or JsonConverter for expanded payloads";
        return Some(("--expand-json-payload", why));
    }
    let roles = [
        (true, config.key_writer(), "--key-subject-name-strategy"),
        (
            false,
            config.value_writer(),
            "--value-subject-name-strategy",
        ),
    ];
    for (key, writer, flag) in roles {
        if protobuf(writer)
            && config.registry.role(key).subjects != registry::SubjectStrategy::Topic
        {
            let why = "ProtobufConverter's subjects under RecordNameStrategy and TopicRecordNameStrategy are not reproduced (not measured against Confluent's converter); use TopicNameStrategy";
            return Some((flag, why));
        }
    }
    None
}

/// Refuses a record name strategy for an Avro key or value that is never a record (only an
/// envelope is one, as the router leaves it): Confluent's serializer throws on the first event.
/// After transforms (`ValueToKey` makes a struct key) it is judged per event instead.
fn check_subject_strategies(
    config: &ConnectConfig,
    router: &Router,
    mapping: &MappingConfig,
    table: &str,
) -> Result<(), BindError> {
    if !config.transforms.is_empty() {
        return Ok(());
    }
    let value_is_record = !config.envelope.is_empty();
    for (key, writer, schema, flag, column) in [
        (
            true,
            config.key_writer(),
            Some(router.key_schema()),
            "--key-subject-name-strategy",
            &mapping.key_column,
        ),
        (
            false,
            config.value_writer(),
            router.fixed_value_schema(),
            "--value-subject-name-strategy",
            &mapping.payload_column,
        ),
    ] {
        let kind = schema.map(|s| &s.kind);
        let avro = writer.of(kind.or(Some(&Kind::String))) == Some(Converter::Avro);
        let strategy = config.registry.role(key).subjects;
        let never_a_record = key || !value_is_record;
        if avro && strategy != registry::SubjectStrategy::Topic && never_a_record {
            let why = format!(
                "{} names subjects after Avro records, and this is never one; Debezium stops at the first event",
                strategy.class()
            );
            return Err(router::refuse(table, flag, column, why));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
