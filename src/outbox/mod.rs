//! PURE: how an inserted outbox row becomes a Kafka record.
//!
//! The user's flags ([`MappingConfig`]) are bound to a table's columns once per
//! pgoutput Relation message ([`TableMapping::bind`]), so per-row work is index
//! lookups, no name matching. A column the mapping needs that is missing or of
//! an unusable type is an error at bind time, naming the table, the flag and
//! the columns that do exist; a bad value in one row is an [`EventError`] that
//! names the column, never the value (the caller adds the LSN, id and table).
//! Logical decoding messages are mapped the same way ([`message`]), and
//! [`EventMapper`] picks the mapping of each table or message prefix.
//!
//! The defaults mirror Debezium's Outbox Event Router on the common schema
//! `outbox(id, aggregate_type, aggregate_id, event_type, payload, created_at)`:
//! topic from `event_type`, key from `aggregate_id`, value from `payload`, the
//! `id` header from `id`.

pub mod cloudevents;
mod mapper;
pub mod message;
mod template;
pub mod values;

use std::sync::Arc;

use bytes::Bytes;

pub use mapper::{EventMapper, Mapped};
pub use template::{HeaderColumn, ROUTED_BY_VALUE, Segment, TableName, TopicTemplate, quote_ident};

use crate::pgoutput::{Relation, TupleData, Value};

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
}

impl MappingConfig {
    /// Every column the mapping reads, with the flag that names it.
    pub fn required_columns(&self) -> Vec<(&'static str, &str)> {
        let mut cols = vec![
            ("--route-by", self.route_by.as_str()),
            ("--key-column", self.key_column.as_str()),
            ("--id-column", self.id_column.as_str()),
            ("--payload-column", self.payload_column.as_str()),
        ];
        if let Some(ts) = &self.timestamp_column {
            cols.push(("--timestamp-column", ts.as_str()));
        }
        for h in &self.header_columns {
            cols.push(("--header-column", h.column.as_str()));
        }
        for seg in self.topic_template.segments() {
            if let Segment::Column(c) = seg {
                cols.push(("--topic-template", c.as_str()));
            }
        }
        cols
    }
}

/// How the payload column's text becomes the record value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PayloadKind {
    /// json, jsonb, text, anything textual: the bytes as Postgres sends them.
    Text,
    /// bytea: the decoded raw bytes.
    Bytea,
}

/// How the timestamp column's text becomes the record timestamp.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TimestampKind {
    /// timestamptz / timestamp (taken as UTC).
    Timestamp,
    /// int4 / int8 milliseconds since the Unix epoch.
    EpochMillis,
}

#[derive(Clone, Debug)]
enum BoundSegment {
    Literal(String),
    Column(usize),
}

/// A [`MappingConfig`] bound to one table's column layout.
#[derive(Clone, Debug)]
pub struct TableMapping {
    table: Arc<str>,
    topic: Vec<BoundSegment>,
    key: usize,
    id: usize,
    payload: usize,
    payload_kind: PayloadKind,
    timestamp: Option<(usize, TimestampKind)>,
    headers: Vec<(usize, Arc<str>)>,
    /// `ce_source` and whether the payload column is json/jsonb.
    cloudevents: Option<(Arc<str>, bool)>,
    route: usize,
}

/// The table's columns do not fit the mapping (at start-up or after a schema change).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BindError {
    /// A column named by a flag is not in the table.
    #[error(
        "table {table} has no column {column:?} (named by {flag}); its columns are: {available}. \
         Fix {flag} or the table"
    )]
    MissingColumn {
        /// The table.
        table: String,
        /// The flag naming the column.
        flag: &'static str,
        /// The missing column.
        column: String,
        /// The table's columns, comma separated.
        available: String,
    },
    /// The timestamp column has a type the relay cannot read as a time.
    #[error(
        "table {table}: --timestamp-column {column:?} has type oid {type_oid}; use a timestamptz, \
         timestamp or bigint (epoch milliseconds) column"
    )]
    TimestampType {
        /// The table.
        table: String,
        /// The column.
        column: String,
        /// Its type OID.
        type_oid: u32,
    },
}

/// One row that cannot become a record. Names what is wrong; the caller adds
/// the row's LSN and table.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EventError {
    /// The id column is NULL, so the record would have no dedupe key.
    #[error("the id column {column:?} is NULL; every outbox row needs an id")]
    NullId {
        /// The id column.
        column: String,
    },
    /// A column used in the topic name is NULL or empty.
    #[error("column {column:?}, used in the topic name, is NULL or empty")]
    EmptyRoutingValue {
        /// The column.
        column: String,
    },
    /// The rendered topic name is one Kafka rejects.
    #[error("topic name {topic:?} is not valid in Kafka: {reason}")]
    InvalidTopic {
        /// The rendered name.
        topic: String,
        /// Which rule it breaks.
        reason: &'static str,
    },
    /// A value is not valid for its column type.
    #[error("column {column:?} holds a value the relay cannot read: {reason}")]
    InvalidValue {
        /// The column.
        column: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// An outbox row turned into a Kafka record.
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
    /// Headers after `id`, in flag order; a NULL column gives a null header value.
    pub headers: Vec<(Arc<str>, Option<Bytes>)>,
    /// Record timestamp, Unix milliseconds.
    pub timestamp_ms: i64,
    /// A fixed partition; `None` lets the producer's partitioner choose.
    pub partition: Option<i32>,
}

/// What could be read from a row that failed to map.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RawParts {
    /// The id column's text (empty when NULL).
    pub id: Bytes,
    /// The key column's text.
    pub key: Option<Bytes>,
    /// The payload (bytea decoded when possible).
    pub payload: Option<Bytes>,
    /// The topic the row would have gone to, when it can be rendered.
    pub intended_topic: Option<String>,
}

/// Why and from where an event is dead-lettered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadLetterInfo {
    /// The error, as text.
    pub error: String,
    /// Commit LSN of the event's transaction.
    pub lsn: crate::lsn::Lsn,
    /// Outbox table (`schema.table`).
    pub table: String,
    /// The intended topic, when known.
    pub intended_topic: Option<String>,
    /// Set when the payload is left out because it is the problem.
    pub payload_omitted: Option<String>,
}

/// Header names of dead-letter records.
pub mod dead_letter_headers {
    /// The error that diverted the event.
    pub const ERROR: &str = "outbox.error";
    /// Commit LSN of the event's transaction.
    pub const LSN: &str = "outbox.lsn";
    /// The outbox table.
    pub const TABLE: &str = "outbox.table";
    /// The topic the event was meant for.
    pub const TOPIC: &str = "outbox.topic";
    /// Present when the payload was left out, saying why.
    pub const PAYLOAD_OMITTED: &str = "outbox.payload.omitted";
}

/// Builds the dead-letter record for an event: the original key and payload
/// (unless the payload is the reason), `id`, the `outbox.*` headers, then the
/// event's own extra headers.
pub fn dead_letter_record(
    topic: &str,
    parts: RawParts,
    extra_headers: Vec<(Arc<str>, Option<Bytes>)>,
    info: &DeadLetterInfo,
    timestamp_ms: i64,
) -> OutboxRecord {
    use dead_letter_headers as h;
    let mut headers: Vec<(Arc<str>, Option<Bytes>)> = vec![
        (Arc::from(h::ERROR), Some(Bytes::from(info.error.clone()))),
        (Arc::from(h::LSN), Some(Bytes::from(info.lsn.to_string()))),
        (Arc::from(h::TABLE), Some(Bytes::from(info.table.clone()))),
        (
            Arc::from(h::TOPIC),
            Some(Bytes::from(info.intended_topic.clone().unwrap_or_default())),
        ),
    ];
    if let Some(why) = &info.payload_omitted {
        headers.push((
            Arc::from(h::PAYLOAD_OMITTED),
            Some(Bytes::from(why.clone())),
        ));
    }
    headers.extend(extra_headers);
    OutboxRecord {
        topic: topic.to_owned(),
        key: parts.key,
        payload: if info.payload_omitted.is_some() {
            None
        } else {
            parts.payload
        },
        id: parts.id,
        headers,
        timestamp_ms,
        partition: None,
    }
}

/// Kafka's topic name rules: 1 to 249 characters from `[a-zA-Z0-9._-]`, not `.` or `..`.
pub fn check_topic_name(topic: &str) -> Result<(), &'static str> {
    if topic.is_empty() {
        return Err("empty");
    }
    if topic.len() > 249 {
        return Err("longer than 249 characters");
    }
    if topic == "." || topic == ".." {
        return Err("'.' and '..' are reserved");
    }
    if !topic
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err("only ASCII letters, digits, '.', '_' and '-' are allowed");
    }
    Ok(())
}

/// `topic`, when Kafka accepts the name.
fn valid_topic(topic: String) -> Result<String, EventError> {
    match check_topic_name(&topic) {
        Ok(()) => Ok(topic),
        Err(reason) => Err(EventError::InvalidTopic { topic, reason }),
    }
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

/// The position of `column` in `relation`, or the error naming the `flag` that
/// asked for it and the columns there are.
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

impl TableMapping {
    /// Binds the flags to a table's columns, as announced by a Relation message.
    pub fn bind(config: &MappingConfig, relation: &Relation) -> Result<Self, BindError> {
        let table = format!("{}.{}", relation.namespace, relation.name);
        let find = |flag: &'static str, column: &str| column_index(relation, &table, flag, column);
        let route = find("--route-by", &config.route_by)?;
        let mut topic = Vec::with_capacity(config.topic_template.segments().len());
        for seg in config.topic_template.segments() {
            topic.push(match seg {
                Segment::Literal(s) => BoundSegment::Literal(s.clone()),
                Segment::RoutedByValue => BoundSegment::Column(route),
                Segment::Column(c) => BoundSegment::Column(find("--topic-template", c)?),
            });
        }
        let payload = find("--payload-column", &config.payload_column)?;
        let payload_oid = relation.columns.get(payload).map(|c| c.type_oid);
        let payload_kind = match payload_oid {
            Some(values::oid::BYTEA) => PayloadKind::Bytea,
            _ => PayloadKind::Text,
        };
        let cloudevents = config.cloudevents.as_ref().map(|ce| {
            (
                ce.source_for(&format!("{}/{}", relation.namespace, relation.name)),
                matches!(payload_oid, Some(values::oid::JSON | values::oid::JSONB)),
            )
        });
        let timestamp = match &config.timestamp_column {
            None => None,
            Some(column) => {
                let idx = find("--timestamp-column", column)?;
                let type_oid = relation.columns.get(idx).map_or(0, |c| c.type_oid);
                let kind = match type_oid {
                    values::oid::TIMESTAMPTZ | values::oid::TIMESTAMP => TimestampKind::Timestamp,
                    values::oid::INT8 | values::oid::INT4 => TimestampKind::EpochMillis,
                    _ => {
                        return Err(BindError::TimestampType {
                            table,
                            column: column.clone(),
                            type_oid,
                        });
                    }
                };
                Some((idx, kind))
            }
        };
        let headers = config
            .header_columns
            .iter()
            .map(|h| {
                Ok((
                    find("--header-column", &h.column)?,
                    Arc::from(h.header.as_str()),
                ))
            })
            .collect::<Result<Vec<_>, BindError>>()?;
        Ok(TableMapping {
            topic,
            key: find("--key-column", &config.key_column)?,
            id: find("--id-column", &config.id_column)?,
            payload,
            payload_kind,
            timestamp,
            headers,
            cloudevents,
            route,
            table: Arc::from(table.as_str()),
        })
    }

    /// `schema.table` of the bound table.
    pub fn table(&self) -> &Arc<str> {
        &self.table
    }

    /// The row's id, key and payload as far as they can be read, for a
    /// dead-letter record of a row that failed to map.
    pub fn raw_parts(&self, row: &TupleData) -> RawParts {
        let text = |idx: usize| cell(row, idx).ok().flatten().cloned();
        let payload = text(self.payload).map(|raw| match self.payload_kind {
            PayloadKind::Bytea => values::decode_bytea_hex(&raw).unwrap_or(raw),
            PayloadKind::Text => raw,
        });
        RawParts {
            id: text(self.id).unwrap_or_default(),
            key: text(self.key),
            payload,
            intended_topic: self.topic(row, &|idx| format!("#{idx}")).ok(),
        }
    }

    /// The topic template filled in from `row` (not yet checked against Kafka's rules).
    fn topic(
        &self,
        row: &TupleData,
        column_name: &dyn Fn(usize) -> String,
    ) -> Result<String, EventError> {
        let mut topic = String::new();
        for seg in &self.topic {
            match seg {
                BoundSegment::Literal(s) => topic.push_str(s),
                BoundSegment::Column(idx) => {
                    let invalid = |reason: String| EventError::InvalidValue {
                        column: column_name(*idx),
                        reason,
                    };
                    let value = cell(row, *idx).map_err(invalid)?;
                    let value = value.filter(|v| !v.is_empty()).ok_or_else(|| {
                        EventError::EmptyRoutingValue {
                            column: column_name(*idx),
                        }
                    })?;
                    let value =
                        std::str::from_utf8(value).map_err(|_| invalid("not UTF-8".to_owned()))?;
                    topic.push_str(value);
                }
            }
        }
        Ok(topic)
    }

    /// Maps one inserted row. `commit_time_ms` is the record timestamp unless
    /// a timestamp column is configured.
    pub fn map(
        &self,
        relation: &Relation,
        row: &TupleData,
        commit_time_ms: i64,
    ) -> Result<OutboxRecord, EventError> {
        let column_name = |idx: usize| {
            relation
                .columns
                .get(idx)
                .map_or_else(|| format!("#{idx}"), |c| c.name.clone())
        };
        let text = |idx: usize| {
            cell(row, idx).map_err(|reason| EventError::InvalidValue {
                column: column_name(idx),
                reason,
            })
        };
        let id = text(self.id)?.cloned().ok_or_else(|| EventError::NullId {
            column: column_name(self.id),
        })?;
        let topic = valid_topic(self.topic(row, &column_name)?)?;
        let key = text(self.key)?.cloned();
        let payload = match (text(self.payload)?, self.payload_kind) {
            (None, _) => None,
            (Some(b), PayloadKind::Text) => Some(b.clone()),
            (Some(b), PayloadKind::Bytea) => Some(values::decode_bytea_hex(b).ok_or_else(
                || EventError::InvalidValue {
                    column: column_name(self.payload),
                    reason: "bytea text is not in hex format (\\x...)".to_owned(),
                },
            )?),
        };

        let timestamp_ms = match self.timestamp {
            None => commit_time_ms,
            Some((idx, kind)) => match text(idx)? {
                None => commit_time_ms,
                Some(raw) => {
                    let parsed = std::str::from_utf8(raw).ok().and_then(|s| match kind {
                        TimestampKind::Timestamp => values::parse_timestamp_ms(s),
                        TimestampKind::EpochMillis => s.parse::<i64>().ok(),
                    });
                    parsed.ok_or_else(|| EventError::InvalidValue {
                        column: column_name(idx),
                        reason: "not readable as a timestamp".to_owned(),
                    })?
                }
            },
        };

        let mut headers = Vec::with_capacity(self.headers.len());
        for (idx, name) in &self.headers {
            headers.push((Arc::clone(name), text(*idx)?.cloned()));
        }
        if let Some((source, json)) = &self.cloudevents {
            let event_type = text(self.route)?.filter(|v| !v.is_empty()).ok_or_else(|| {
                EventError::EmptyRoutingValue {
                    column: column_name(self.route),
                }
            })?;
            headers.extend(cloudevents::headers(&cloudevents::Attributes {
                source,
                id: &id,
                event_type: event_type.clone(),
                subject: key.as_ref(),
                time_ms: commit_time_ms,
                json: *json,
            }));
        }

        Ok(OutboxRecord {
            topic,
            key,
            payload,
            id,
            headers,
            timestamp_ms,
            partition: None,
        })
    }
}

/// The text of column `idx` of an inserted row; `None` when NULL.
fn cell(row: &TupleData, idx: usize) -> Result<Option<&Bytes>, String> {
    match row.0.get(idx) {
        Some(Value::Text(b)) => Ok(Some(b)),
        Some(Value::Null) => Ok(None),
        Some(Value::Unchanged) => Err("unchanged TOAST value in an insert".to_owned()),
        Some(Value::Binary(_)) => {
            Err("binary-format value (the relay streams in text format)".to_owned())
        }
        None => Err(format!("the row has only {} columns", row.0.len())),
    }
}

#[cfg(test)]
mod tests;
