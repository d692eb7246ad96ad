//! The facts start-up judges, as plain values: what [`super::gather`] read, and what
//! [`super::checks`] decides on, with no I/O.

use super::lineage::LineageFacts;
use crate::outbox::connect::ColumnFacts;
use crate::postgres::catalog::Server;
use crate::postgres::catalog::publication::{Options, OwnRow};
use crate::postgres::catalog::slots::Slot;
use crate::postgres::catalog::tables::{ColumnType, PrimaryKey, Table};

/// Everything start-up knows about the server, the slot and its lineage.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Facts {
    /// The server, its settings and the role's right to replicate.
    pub server: Server,
    /// Each wanted outbox table, in order.
    pub tables: Vec<TableFacts>,
    /// The publication, if it exists.
    pub publication: Option<PublicationFacts>,
    /// The slot, if it exists.
    pub slot: Option<Slot>,
    /// The slots other shards of the same K have on this server.
    pub siblings: Vec<String>,
    /// The lineage topic's record of the slot; `None` until the catalog passes the checks
    /// (reading it needs Kafka and a role that may replicate).
    pub lineage: Option<LineageFacts>,
}

/// One wanted outbox table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableFacts {
    /// The table; `None` when it does not exist.
    pub found: Option<Table>,
    /// Its columns' `NOT NULL` and `DEFAULT`, read when Debezium's format needs them.
    pub column_facts: Vec<ColumnFacts>,
    /// With `--shard`, the key and id columns a row filter hashes, in that order.
    pub shard_columns: Vec<ShardColumn>,
    /// With `--cleanup delete`, its primary key.
    pub primary_key: Option<PrimaryKey>,
}

/// A column a shard's row filter hashes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardColumn {
    /// The flag that names it: `--key-column` or `--id-column`.
    pub flag: &'static str,
    /// The column.
    pub column: String,
    /// Its type; `None` when the table has no such column.
    pub found: Option<ColumnType>,
}

/// The publication as found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublicationFacts {
    /// Its `pg_publication` row.
    pub options: Options,
    /// Per outbox table, the catalog rows that publish it (none for `FOR ALL TABLES`).
    pub members: Vec<(String, Vec<u32>)>,
    /// With `--shard`, the row that publishes each outbox table itself, with its filter.
    pub own_rows: Vec<OwnRow>,
}
