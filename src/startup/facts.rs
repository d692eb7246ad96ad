//! The facts start-up judges, as plain values: what [`super::gather`] read, and what
//! [`super::checks`] decides on, with no I/O.

use super::lineage::LineageFacts;
use crate::outbox::Shard;
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
    /// The row filters of the sibling shards (those with a slot) whose publications exist: what
    /// they hash must be what this shard hashes.
    pub sibling_filters: Vec<SiblingFilters>,
    /// The slots of the same base name of fleets of another K on this server (a relay
    /// without `--shard` is a fleet of 1).
    pub other_fleets: Vec<FleetSlot>,
    /// The lineage topic's record of the slot; `None` until the catalog passes the checks
    /// (reading it needs Kafka and a role that may replicate).
    pub lineage: Option<LineageFacts>,
}

/// A sibling shard's publication and its outbox tables' row filters, in table order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SiblingFilters {
    /// The sibling shard.
    pub shard: Shard,
    /// Its publication.
    pub publication: String,
    /// Each outbox table's row filter there, as Postgres prints it (`None`: none).
    pub filters: Vec<Option<String>>,
}

/// A slot of another fleet of the same base name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FleetSlot {
    /// Its name.
    pub slot: String,
    /// The shard it is (`None`: a relay without `--shard`).
    pub shard: Option<Shard>,
}

impl FleetSlot {
    /// Its fleet's K.
    pub fn count(&self) -> u32 {
        self.shard.map_or(1, |shard| shard.count)
    }
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
