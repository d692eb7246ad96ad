//! PURE: the one place where decoded pgoutput becomes outbox records, shared by the relay and
//! `outbox-relay peek` so both map with the same code and flags. Ordering, acknowledgement and
//! delivery stay with the caller. A shard's publication filters rows on the server; messages
//! cannot be filtered there, so a shard's mapper drops the ones another shard owns.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;

use super::connect::{ColumnFacts, ConnectConfig};
use super::message::Fields;
use super::{
    BindError, EventError, MappingConfig, OutboxRecord, Plan, RawParts, Shard, TableMapping,
    TableName,
};
use crate::pgoutput::{Relation, TupleData};

/// A mapped event: its record, or none when a Kafka Connect `Filter` after the router dropped
/// it (the event is then acknowledged without a record, as Connect commits a filtered
/// record's offset); or why it does not map and what could be read of it.
pub type Mapped = Result<Option<OutboxRecord>, (EventError, RawParts)>;

/// Maps a replication session's changes to outbox records.
#[derive(Debug, Default)]
pub struct EventMapper {
    tables: Vec<(TableName, MappingConfig)>,
    /// The outbox tables' mappings, by relation OID, as last announced.
    bound: HashMap<u32, TableMapping>,
    /// By prefix: `message:<prefix>` (the table errors and dead letters name) and the mapping.
    messages: HashMap<String, (Arc<str>, Plan<String>)>,
    /// `--shard`: only the messages it owns are mapped.
    shard: Option<Shard>,
}

impl EventMapper {
    /// `tables` with each one's mapping; `messages` by prefix with theirs.
    pub fn new(
        tables: Vec<(TableName, MappingConfig)>,
        messages: Vec<(String, MappingConfig)>,
    ) -> Self {
        EventMapper {
            tables,
            bound: HashMap::new(),
            messages: messages
                .into_iter()
                .map(|(prefix, config)| {
                    let origin = format!("message/{prefix}");
                    let Ok(plan) = Plan::bind(&config, &origin, |_, field| {
                        Ok::<_, Infallible>(field.to_owned())
                    });
                    let source = Arc::from(format!("message:{prefix}").as_str());
                    (prefix, (source, plan))
                })
                .collect(),
            shard: None,
        }
    }

    /// Maps only the messages `shard` owns, by the hash its publication filters rows with.
    pub fn sharded(self, shard: Option<Shard>) -> Self {
        EventMapper { shard, ..self }
    }

    /// Whether binding `relation` (of root `root`) needs its columns' catalog facts.
    pub fn reads_catalog(&self, relation: &Relation, root: Option<&TableName>) -> bool {
        let table = |t: &TableName| match root {
            Some(root) => t == root,
            None => t.schema == relation.namespace && t.name == relation.name,
        };
        (self.tables.iter())
            .any(|(t, m)| table(t) && m.connect.as_ref().is_some_and(ConnectConfig::reads_catalog))
    }

    /// Takes a Relation message: binds the mapping when the table is an outbox table, or a
    /// partition of `root` (an outbox table) sent under its own name; records then name the
    /// root. A table that no longer fits its mapping is an error. `facts` are the columns'
    /// catalog facts when [`EventMapper::reads_catalog`].
    pub fn relation(
        &mut self,
        relation: Relation,
        root: Option<TableName>,
        facts: &[ColumnFacts],
    ) -> Result<(), BindError> {
        let table = root.unwrap_or_else(|| TableName {
            schema: relation.namespace.clone(),
            name: relation.name.clone(),
        });
        let Some((_, config)) = self.tables.iter().find(|(t, _)| *t == table) else {
            // Renamed away, or never an outbox table.
            self.bound.remove(&relation.id);
            return Ok(());
        };
        let named = Relation {
            namespace: table.schema,
            name: table.name,
            ..relation
        };
        self.bound
            .insert(named.id, TableMapping::bind_with(config, &named, facts)?);
        Ok(())
    }

    /// Whether `schema.name` is a configured outbox table.
    pub fn is_outbox(&self, schema: &str, name: &str) -> bool {
        self.tables
            .iter()
            .any(|(t, _)| t.schema == schema && t.name == name)
    }

    /// `schema.table` when `relation_id` is a bound outbox table.
    pub fn outbox_table(&self, relation_id: u32) -> Option<&Arc<str>> {
        self.bound.get(&relation_id).map(TableMapping::table)
    }

    /// Maps an inserted row: `None` unless its table is an outbox table, else the table and record.
    pub fn insert(
        &self,
        relation_id: u32,
        row: &TupleData,
        commit_time_ms: i64,
    ) -> Option<(Arc<str>, Mapped)> {
        let mapping = self.bound.get(&relation_id)?;
        Some((mapping.table().clone(), mapping.map(row, commit_time_ms)))
    }

    /// Maps a logical decoding message: `None` unless an outbox prefix (and, sharded, owned by
    /// this shard: one that does not map is owned by what could be read of its key and id),
    /// else `message:<prefix>` and the record.
    pub fn message(
        &self,
        prefix: &str,
        content: &Bytes,
        commit_time_ms: i64,
    ) -> Option<(Arc<str>, Mapped)> {
        let (source, plan) = self.messages.get(prefix)?;
        let mapped = match Fields::parse(content) {
            Ok(fields) => plan
                .map(&fields, commit_time_ms)
                .map(Some)
                .map_err(|error| (error, plan.raw_parts(&fields))),
            Err(error) => {
                let parts = RawParts {
                    payload: Some(content.clone()),
                    ..RawParts::default()
                };
                Err((error, parts))
            }
        };
        if self.shard.is_some_and(|shard| !shard.owns_event(&mapped)) {
            return None;
        }
        Some((source.clone(), mapped))
    }
}
