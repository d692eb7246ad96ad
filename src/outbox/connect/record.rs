//! PURE: a Kafka Connect source record as Debezium's Outbox Event Router leaves it, before the
//! transforms that follow it and the converters that make bytes of it: the topic, the
//! partition, key and value each as schema and data, and headers that carry their schemas.

use std::sync::Arc;

use bytes::Bytes;

use super::data::{Data, Schema};

/// A schema (absent for schemaless data) with its value: Kafka's `SchemaAndValue`.
#[derive(Clone, Debug, PartialEq)]
pub struct Datum {
    /// The schema (shared: a column's is the same for every event); `None` when the data is
    /// schemaless.
    pub schema: Option<Arc<Schema>>,
    /// The value.
    pub data: Data,
}

impl Datum {
    /// `data` of `schema`.
    pub fn new(schema: impl Into<Arc<Schema>>, data: Data) -> Datum {
        Datum {
            schema: Some(schema.into()),
            data,
        }
    }

    /// No schema and no value: a tombstone's value.
    pub fn null() -> Datum {
        Datum {
            schema: None,
            data: Data::Null,
        }
    }
}

/// A Connect header: a name and a value with its schema.
#[derive(Clone, Debug, PartialEq)]
pub struct Header {
    /// The header's name.
    pub name: Arc<str>,
    /// Its value.
    pub value: Datum,
    /// The header converter's bytes of `value`, when they were made once for a value that is
    /// the same in every record (Debezium's context headers); transforms never change a
    /// header's value, only add and drop headers.
    pub written: Option<Option<Bytes>>,
}

impl Header {
    /// A header of `value`, to be written by the header converter.
    pub fn new(name: Arc<str>, value: Datum) -> Header {
        Header {
            name,
            value,
            written: None,
        }
    }
}

/// A source record between the router and the converters.
#[derive(Clone, Debug, PartialEq)]
pub struct ConnectRecord {
    /// The topic the router chose.
    pub topic: String,
    /// The partition the router chose (`table.fields.additional.placement` `partition`).
    pub partition: Option<i32>,
    /// The key.
    pub key: Datum,
    /// The value; no schema and no value is a tombstone.
    pub value: Datum,
    /// The headers, in order.
    pub headers: Vec<Header>,
}
