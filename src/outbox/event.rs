//! What the mapping reads of one event: the [`Event`] trait a row of a table ([`Row`]) and a
//! message's JSON fields implement, and the values every event needs (its routing value and
//! timestamp).

use bytes::Bytes;
use tokio_postgres::types::Type;

use super::{EventError, invalid, values};
use crate::pgoutput::{Relation, TupleData, Value};

/// One event's values by column: a row of a table, or the JSON fields of a message.
pub(super) trait Event {
    /// How a column is addressed: an index into the row, or a field name.
    type Column;
    /// The column's name, for errors.
    fn name(&self, column: &Self::Column) -> String;
    /// The value as record bytes; `None` when NULL or missing.
    fn value(&self, column: &Self::Column) -> Result<Option<Bytes>, EventError>;
    /// The payload column's value; a row decodes bytea.
    fn payload(&self, column: &Self::Column) -> Result<Option<Bytes>, EventError> {
        self.value(column)
    }
    /// Whether the payload is JSON, for the CloudEvents `content-type`.
    fn payload_is_json(&self, column: &Self::Column) -> bool;
}

/// A value the event cannot do without (a topic part, `ce_type`): NULL or empty is an error.
pub(super) fn routing_value<E: Event>(event: &E, column: &E::Column) -> Result<Bytes, EventError> {
    event
        .value(column)?
        .filter(|v| !v.is_empty())
        .ok_or_else(|| EventError::EmptyRoutingValue {
            column: event.name(column),
        })
}

/// The timestamp column's value: epoch milliseconds (integer or JSON number) or ISO 8601 text.
pub(super) fn timestamp_ms<E: Event>(
    event: &E,
    column: &E::Column,
) -> Result<Option<i64>, EventError> {
    let Some(raw) = event.value(column)? else {
        return Ok(None);
    };
    let text = std::str::from_utf8(&raw).unwrap_or_default();
    let ms = text.parse::<i64>().ok();
    let ms = ms.or_else(|| values::parse_timestamp_ms(text));
    let why = "not a timestamp or epoch milliseconds";
    ms.map(Some).ok_or_else(|| invalid(event.name(column), why))
}

/// An inserted row of a bound table.
pub(super) struct Row<'a> {
    pub(super) relation: &'a Relation,
    pub(super) row: &'a TupleData,
}

impl Row<'_> {
    /// The column's type, when it is a built-in one.
    fn type_of(&self, idx: usize) -> Option<Type> {
        Type::from_oid(self.relation.columns.get(idx)?.type_oid)
    }
}

impl Event for Row<'_> {
    type Column = usize;

    fn name(&self, idx: &usize) -> String {
        self.relation
            .columns
            .get(*idx)
            .map_or_else(|| format!("#{idx}"), |c| c.name.clone())
    }

    fn value(&self, idx: &usize) -> Result<Option<Bytes>, EventError> {
        let reason = match self.row.0.get(*idx) {
            Some(Value::Text(text)) => return Ok(Some(text.clone())),
            Some(Value::Null) => return Ok(None),
            Some(Value::Unchanged) => "unchanged TOAST value in an insert".to_owned(),
            Some(Value::Binary(_)) => {
                "binary-format value (the relay streams in text format)".to_owned()
            }
            None => format!("the row has only {} columns", self.row.0.len()),
        };
        Err(invalid(self.name(idx), &reason))
    }

    fn payload(&self, idx: &usize) -> Result<Option<Bytes>, EventError> {
        let value = self.value(idx)?;
        if self.type_of(*idx) != Some(Type::BYTEA) {
            return Ok(value);
        }
        value
            .map(|text| {
                values::decode_bytea_hex(&text).ok_or_else(|| {
                    invalid(self.name(idx), "bytea text is not in hex format (\\x...)")
                })
            })
            .transpose()
    }

    fn payload_is_json(&self, idx: &usize) -> bool {
        let json = [Type::JSON, Type::JSONB];
        self.type_of(*idx).is_some_and(|t| json.contains(&t))
    }
}
