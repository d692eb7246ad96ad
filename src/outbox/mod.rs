//! PURE: how an outbox event, an inserted row or a logical decoding message, becomes a Kafka
//! record, as Debezium's Outbox Event Router does. The flags ([`MappingConfig`]) are resolved
//! once into a plan (a table's column indexes when its Relation arrives, or a message prefix's
//! JSON field names), so per-event work is lookups and rows and messages map through one code.

pub mod cloudevents;
pub mod connect;
mod event;
mod mapper;
mod message;
pub mod shard;
mod template;
pub mod values;

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use tokio_postgres::types::Type;

pub use mapper::{EventMapper, Mapped};
pub use shard::Shard;
pub use template::{HeaderColumn, Segment, TableName, TopicTemplate, quote_ident};

use crate::pgoutput::{Relation, TupleData};
use event::{Event, Row, routing_value, timestamp_ms};

/// Name of the header that always carries the event id.
pub const ID_HEADER: &str = "id";

/// The mapping flags, validated but not yet bound to a table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MappingConfig {
    /// `--route-by`
    pub route_by: String,
    /// `--topic-template`
    pub topic_template: TopicTemplate,
    /// `--key-column`
    pub key_column: String,
    /// `--id-column`
    pub id_column: String,
    /// `--payload-column`
    pub payload_column: String,
    /// `--timestamp-column`
    pub timestamp_column: Option<String>,
    /// `--header-column`
    pub header_columns: Vec<HeaderColumn>,
    /// `--cloudevents`: add the CloudEvents binary-mode headers.
    pub cloudevents: Option<cloudevents::CloudEventsConfig>,
    /// Debezium's record format (`--key-converter`, `--value-converter`...); `None`: the relay's.
    pub connect: Option<connect::ConnectConfig>,
}

impl MappingConfig {
    /// Every column the mapping reads, with the flag that names it.
    pub fn required_columns(&self) -> Vec<(&'static str, &str)> {
        let mut columns = Vec::new();
        let Ok(_) = Plan::bind(self, "", |flag, column| {
            columns.push((flag, column));
            Ok::<_, Infallible>(())
        });
        columns
    }
}

/// The table's columns do not fit the mapping (at start-up or after a schema change).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BindError {
    /// A column named by `flag` is not in the table; `available` lists the table's columns.
    #[error(
        "table {table} has no column {column:?} (named by {flag}); its columns are: {available}. \
         Fix {flag} or the table"
    )]
    MissingColumn {
        /// The table, as `schema.name`.
        table: String,
        /// The flag that names the column, e.g. `--key-column`.
        flag: &'static str,
        /// The column name the flag gave.
        column: String,
        /// The table's column names, comma-separated.
        available: String,
    },
    /// A Debezium setting the relay does not reproduce for this table's columns.
    #[error("table {table}: {option}: {reason}")]
    Unreproducible {
        /// The table, as `schema.name`.
        table: String,
        /// The flag (or option) and column.
        option: String,
        /// Why Debezium's records are out of reach, and what would work.
        reason: String,
    },
    /// The timestamp column has a type the relay cannot read as a time.
    #[error(
        "table {table}: --timestamp-column {column:?} has type oid {type_oid}; use a timestamptz, \
         timestamp or bigint (epoch milliseconds) column"
    )]
    TimestampType {
        /// The table, as `schema.name`.
        table: String,
        /// The `--timestamp-column` name.
        column: String,
        /// OID of the column's type, as the Relation message gave it.
        type_oid: u32,
    },
}

/// One event that cannot become a record; names the column, never the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EventError {
    /// The id column is NULL, so the record would have no dedupe key.
    #[error("the id column {column:?} is NULL; every outbox row needs an id")]
    NullId {
        /// The `--id-column` name (or JSON field, for messages).
        column: String,
    },
    /// A column used in the topic name (or as `ce_type`) is NULL or empty.
    #[error("column {column:?}, used in the topic name, is NULL or empty")]
    EmptyRoutingValue {
        /// The column (or JSON field) whose value is missing.
        column: String,
    },
    /// The rendered topic name breaks one of Kafka's rules (`reason`).
    #[error("topic name {topic:?} is not valid in Kafka: {reason}")]
    InvalidTopic {
        /// The topic name as rendered from the template.
        topic: String,
        /// The Kafka rule it breaks.
        reason: &'static str,
    },
    /// An event Debezium stops on (so the relay does too, or dead-letters it).
    #[error("Debezium would stop on this event: {reason}")]
    DebeziumStops {
        /// What Debezium (its router or JsonConverter) refuses.
        reason: String,
    },
    /// An event whose record Debezium wrote in a way the relay does not reproduce: rather than
    /// write other bytes, the relay stops on it (or dead-letters it).
    #[error("the relay does not reproduce Debezium's record of this event: {reason}")]
    NotReproduced {
        /// What Debezium would have written, and why the relay does not.
        reason: String,
    },
    /// The Schema Registry refused the event's schema (incompatible, invalid, or missing where
    /// it must be registered already).
    #[error("{reason}")]
    SchemaRefused {
        /// The subject, the registry's message and the remedy.
        reason: String,
    },
    /// A value is not valid for its column type.
    #[error("column {column:?} holds a value the relay cannot read: {reason}")]
    InvalidValue {
        /// The column (or JSON field) holding the value.
        column: String,
        /// Why the value cannot be read; never the value itself.
        reason: String,
    },
}

/// An outbox event turned into a Kafka record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutboxRecord {
    /// Destination topic.
    pub topic: String,
    /// Record key; `None` is a null key.
    pub key: Option<Bytes>,
    /// Record value; `None` is a tombstone.
    pub payload: Option<Bytes>,
    /// The event id (also the first header).
    pub id: Bytes,
    /// Headers other than `id`, in flag order; a NULL column gives a null header value.
    pub headers: Vec<(Arc<str>, Option<Bytes>)>,
    /// Where the `id` header goes among `headers` (after Debezium's context and trace
    /// headers); `None` when `headers` already holds every header in order, `id` included,
    /// as Kafka Connect's transforms and header converter left them.
    pub id_header_at: Option<usize>,
    /// Record timestamp, Unix milliseconds.
    pub timestamp_ms: i64,
    /// A fixed partition; `None` lets the producer's partitioner choose.
    pub partition: Option<i32>,
    /// Schema Registry schemas whose ids the key or value still lack; `None`: complete.
    pub schemas: Option<Box<connect::PendingSchemas>>,
}

impl OutboxRecord {
    /// Key plus value bytes: what the in-flight byte cap counts.
    pub fn size(&self) -> usize {
        self.key.as_ref().map_or(0, Bytes::len) + self.payload.as_ref().map_or(0, Bytes::len)
    }

    /// The id as text, for logs and errors.
    pub fn id_text(&self) -> String {
        String::from_utf8_lossy(&self.id).into_owned()
    }
}

/// What could be read of an event that failed to map, for its dead letter.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RawParts {
    /// The id (empty when NULL).
    pub id: Bytes,
    /// The key.
    pub key: Option<Bytes>,
    /// The payload (bytea decoded when possible).
    pub payload: Option<Bytes>,
    /// The topic the event would have gone to, when it can be rendered.
    pub intended_topic: Option<String>,
}

/// Why and from where an event is dead-lettered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadLetterInfo {
    /// The error, as text.
    pub error: String,
    /// Commit LSN of the event's transaction.
    pub lsn: crate::lsn::Lsn,
    /// Outbox table (`schema.table`) or `message:<prefix>`.
    pub table: String,
    /// The intended topic, when known.
    pub intended_topic: Option<String>,
    /// Set, saying why, when the payload is left out because it is the problem.
    pub payload_omitted: Option<String>,
}

/// The dead-letter record of an event: its key and payload (unless the payload is the reason),
/// `id`, the `outbox.*` headers, then the event's own extra headers.
pub fn dead_letter_record(
    topic: &str,
    parts: RawParts,
    extra_headers: Vec<(Arc<str>, Option<Bytes>)>,
    info: &DeadLetterInfo,
    timestamp_ms: i64,
) -> OutboxRecord {
    let header = |name: &str, value: &str| (Arc::from(name), Some(Bytes::from(value.to_owned())));
    let mut headers = vec![
        header("outbox.error", &info.error),
        header("outbox.lsn", &info.lsn.to_string()),
        header("outbox.table", &info.table),
        header("outbox.topic", info.intended_topic.as_deref().unwrap_or("")),
    ];
    if let Some(why) = &info.payload_omitted {
        headers.push(header("outbox.payload.omitted", why));
    }
    headers.extend(extra_headers);
    OutboxRecord {
        topic: topic.to_owned(),
        key: parts.key,
        payload: parts.payload.filter(|_| info.payload_omitted.is_none()),
        id: parts.id,
        headers,
        id_header_at: Some(0),
        timestamp_ms,
        partition: None,
        schemas: None,
    }
}

/// Kafka's topic name rules: 1 to 249 characters from `[a-zA-Z0-9._-]`, not `.` or `..`.
pub fn check_topic_name(topic: &str) -> Result<(), &'static str> {
    let allowed = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-');
    match topic {
        "" => Err("empty"),
        "." | ".." => Err("'.' and '..' are reserved"),
        _ if topic.len() > 249 => Err("longer than 249 characters"),
        _ if !topic.bytes().all(allowed) => {
            Err("only ASCII letters, digits, '.', '_' and '-' are allowed")
        }
        _ => Ok(()),
    }
}

/// The position of `column` in `relation`, or the error naming the `flag` and the columns.
pub(crate) fn column_index(
    relation: &Relation,
    table: &str,
    flag: &'static str,
    column: &str,
) -> Result<usize, BindError> {
    relation
        .column_index(column)
        .ok_or_else(|| BindError::MissingColumn {
            table: table.to_owned(),
            flag,
            column: column.to_owned(),
            available: relation
                .columns
                .iter()
                .map(|c| c.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        })
}

/// A [`MappingConfig`] with its columns resolved to `C`: row indexes, or a message's field names.
#[derive(Clone, Debug)]
struct Plan<C> {
    route: C,
    key: C,
    id: C,
    payload: C,
    timestamp: Option<C>,
    headers: Vec<(C, Arc<str>)>,
    topic: Vec<Segment<C>>,
    /// `ce_source`, with `--cloudevents`.
    ce_source: Option<Bytes>,
}

impl<C: Clone> Plan<C> {
    /// Resolves each column `config` names, with the flag naming it, through `resolve`.
    /// `origin` (`schema/table` or `message/<prefix>`) derives the CloudEvents source.
    fn bind<'a, E>(
        config: &'a MappingConfig,
        origin: &str,
        mut resolve: impl FnMut(&'static str, &'a str) -> Result<C, E>,
    ) -> Result<Self, E> {
        let route = resolve("--route-by", &config.route_by)?;
        let key = resolve("--key-column", &config.key_column)?;
        let id = resolve("--id-column", &config.id_column)?;
        let payload = resolve("--payload-column", &config.payload_column)?;
        let timestamp = (config.timestamp_column.as_ref())
            .map(|column| resolve("--timestamp-column", column))
            .transpose()?;
        let mut headers = Vec::with_capacity(config.header_columns.len());
        for h in &config.header_columns {
            let column = resolve("--header-column", &h.column)?;
            headers.push((column, Arc::from(h.header.as_str())));
        }
        let mut topic = Vec::new();
        for segment in config.topic_template.segments() {
            topic.push(match segment {
                Segment::Literal(text) => Segment::Literal(text.clone()),
                Segment::RoutedByValue => Segment::RoutedByValue,
                Segment::Column(column) => Segment::Column(resolve("--topic-template", column)?),
            });
        }
        Ok(Plan {
            route,
            key,
            id,
            payload,
            timestamp,
            headers,
            topic,
            ce_source: config.cloudevents.as_ref().map(|ce| ce.source_for(origin)),
        })
    }

    /// Maps one event; `commit_time_ms` is the record timestamp unless a timestamp column is set.
    fn map<E: Event<Column = C>>(
        &self,
        event: &E,
        commit_time_ms: i64,
    ) -> Result<OutboxRecord, EventError> {
        let id = event.value(&self.id)?.ok_or_else(|| EventError::NullId {
            column: event.name(&self.id),
        })?;
        let topic = self.topic(event)?;
        if let Err(reason) = check_topic_name(&topic) {
            return Err(EventError::InvalidTopic { topic, reason });
        }
        let key = event.value(&self.key)?;
        let payload = event.payload(&self.payload)?;
        let timestamp_ms = match &self.timestamp {
            Some(column) => timestamp_ms(event, column)?.unwrap_or(commit_time_ms),
            None => commit_time_ms,
        };
        let mut headers = (self.headers.iter())
            .map(|(column, name)| Ok((Arc::clone(name), event.value(column)?)))
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(source) = &self.ce_source {
            headers.extend(cloudevents::headers(&cloudevents::Attributes {
                source,
                id: &id,
                event_type: routing_value(event, &self.route)?,
                subject: key.as_ref(),
                time_ms: commit_time_ms,
                json: event.payload_is_json(&self.payload),
            }));
        }
        Ok(OutboxRecord {
            topic,
            key,
            payload,
            id,
            headers,
            id_header_at: Some(0),
            timestamp_ms,
            partition: None,
            schemas: None,
        })
    }

    /// As much as can be read of an event that failed to map.
    fn raw_parts<E: Event<Column = C>>(&self, event: &E) -> RawParts {
        let payload = event.payload(&self.payload);
        RawParts {
            id: event.value(&self.id).ok().flatten().unwrap_or_default(),
            key: event.value(&self.key).ok().flatten(),
            payload: payload
                .or_else(|_| event.value(&self.payload))
                .ok()
                .flatten(),
            intended_topic: self.topic(event).ok(),
        }
    }

    /// The topic template filled in from the event (not yet checked against Kafka's rules).
    fn topic<E: Event<Column = C>>(&self, event: &E) -> Result<String, EventError> {
        let mut topic = String::new();
        for segment in &self.topic {
            let column = match segment {
                Segment::Literal(text) => {
                    topic.push_str(text);
                    continue;
                }
                Segment::RoutedByValue => &self.route,
                Segment::Column(column) => column,
            };
            let value = routing_value(event, column)?;
            let value = std::str::from_utf8(&value)
                .map_err(|_| invalid(event.name(column), "not UTF-8"))?;
            topic.push_str(value);
        }
        Ok(topic)
    }
}

/// [`EventError::InvalidValue`] of `column`.
fn invalid(column: String, reason: &str) -> EventError {
    EventError::InvalidValue {
        column,
        reason: reason.to_owned(),
    }
}

/// A [`MappingConfig`] bound to one table's columns, as its Relation message announced them.
#[derive(Clone, Debug)]
pub struct TableMapping {
    table: Arc<str>,
    relation: Relation,
    plan: Plan<usize>,
    connect: Option<connect::ConnectPlan>,
}

impl TableMapping {
    /// Binds the flags to a table's columns, as announced by a Relation message.
    pub fn bind(config: &MappingConfig, relation: &Relation) -> Result<Self, BindError> {
        Self::bind_with(config, relation, &[])
    }

    /// [`TableMapping::bind`] with the columns' catalog facts, which Debezium's JSON formats
    /// need ([`connect::ConnectConfig::reads_catalog`]).
    pub fn bind_with(
        config: &MappingConfig,
        relation: &Relation,
        facts: &[connect::ColumnFacts],
    ) -> Result<Self, BindError> {
        let table = format!("{}.{}", relation.namespace, relation.name);
        let origin = format!("{}/{}", relation.namespace, relation.name);
        let plan = Plan::bind(config, &origin, |flag, column| {
            column_index(relation, &table, flag, column)
        })?;
        if let Some(column) = plan.timestamp.and_then(|idx| relation.columns.get(idx)) {
            let readable = [Type::TIMESTAMPTZ, Type::TIMESTAMP, Type::INT8, Type::INT4];
            if !Type::from_oid(column.type_oid).is_some_and(|t| readable.contains(&t)) {
                return Err(BindError::TimestampType {
                    table,
                    column: column.name.clone(),
                    type_oid: column.type_oid,
                });
            }
        }
        let connect = (config.connect.as_ref())
            .map(|c| connect::ConnectPlan::bind(c, relation, facts, config))
            .transpose()?;
        Ok(TableMapping {
            table: Arc::from(table.as_str()),
            relation: relation.clone(),
            plan,
            connect,
        })
    }

    /// `schema.table` of the bound table.
    pub fn table(&self) -> &Arc<str> {
        &self.table
    }

    /// Maps one inserted row; `commit_time_ms` is the timestamp unless a timestamp column is set.
    pub fn map(&self, row: &TupleData, commit_time_ms: i64) -> Mapped {
        let row = Row {
            relation: &self.relation,
            row,
        };
        let mapped = self.plan.map(&row, commit_time_ms).and_then(|record| {
            let converted = match &self.connect {
                Some(connect) => connect.convert(row.row, record)?,
                None => Some(record),
            };
            let Some(mut record) = converted else {
                return Ok(None);
            };
            // A record waiting for schema ids keeps its columns, for a dead letter.
            if let Some(pending) = record.schemas.as_mut() {
                pending.raw = self.plan.raw_parts(&row);
            }
            Ok(Some(record))
        });
        mapped.map_err(|error| (error, self.plan.raw_parts(&row)))
    }
}

#[cfg(test)]
mod tests;
