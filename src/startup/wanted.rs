//! What the configuration asks start-up for: the few flags the checks judge the server by,
//! taken from the [`Config`] once, so nothing below reads the whole of it.

use crate::config::{Cleanup, Config};
use crate::outbox::{MappingConfig, Shard, TableName};
use crate::sink::lineage::Reshard;

/// What the relay needs from the server: the slot, the publication and the tables it
/// relays, and the flags that change what start-up checks or creates.
#[derive(Clone, Debug)]
pub struct Wanted {
    /// `--slot` (with a shard's suffix).
    pub slot: String,
    /// `--publication` (with a shard's suffix).
    pub publication: String,
    /// The outbox tables, in flag order, each with its mapping.
    pub tables: Vec<WantedTable>,
    /// `--shard`.
    pub shard: Option<Shard>,
    /// `--slot-failover`.
    pub slot_failover: bool,
    /// `--allow-new-slot`.
    pub allow_new_slot: bool,
    /// `--cleanup delete`.
    pub cleanup_delete: bool,
    /// `--lineage-topic`.
    pub lineage_topic: String,
    /// The role the relay logs in as.
    pub user: String,
    /// The database of `--postgres-url`.
    pub dbname: String,
    /// `--postgres-url`, password redacted.
    pub url: String,
    /// Set by `reshard` for the new relays' slots: created beside the old fleet's, and
    /// recorded so in the lineage topic.
    pub resharding: Option<Reshard>,
}

/// One outbox table and how its rows become records.
#[derive(Clone, Debug)]
pub struct WantedTable {
    /// `schema.name`.
    pub name: TableName,
    /// Its mapping: the global flags, or its per-table overrides.
    pub mapping: MappingConfig,
}

impl Wanted {
    /// What `config` asks for.
    pub fn new(config: &Config) -> Self {
        let flags = &config.flags;
        let table = |name: &TableName| WantedTable {
            name: name.clone(),
            mapping: config.mapping_for(name).clone(),
        };
        Wanted {
            slot: flags.slot.clone(),
            publication: flags.publication.clone(),
            tables: config.tables.iter().map(table).collect(),
            shard: flags.shard,
            slot_failover: flags.slot_failover,
            allow_new_slot: flags.allow_new_slot,
            cleanup_delete: flags.cleanup == Cleanup::Delete,
            lineage_topic: flags.lineage_topic.clone(),
            user: config.postgres.user.clone(),
            dbname: config.postgres.dbname.clone(),
            url: config.postgres.redacted(),
            resharding: None,
        }
    }

    /// K: the shards of this relay's fleet (1 for a relay without `--shard`).
    pub fn count(&self) -> u32 {
        self.shard.map_or(1, |shard| shard.count)
    }

    /// `--slot` without a shard's suffix: the name every fleet's slots start with.
    pub fn base_slot(&self) -> &str {
        let suffix = self.shard.map(|shard| shard.name(""));
        let base = suffix.and_then(|suffix| self.slot.strip_suffix(&suffix));
        base.unwrap_or(&self.slot)
    }

    /// The outbox tables' names, in order.
    pub fn table_names(&self) -> Vec<TableName> {
        self.tables.iter().map(|table| table.name.clone()).collect()
    }
}
