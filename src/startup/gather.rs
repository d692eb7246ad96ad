//! Gathering: every fact start-up judges, read in one pass into plain values ([`Facts`]). It
//! only reads, so it can run again (after an outage, for `status`) with nothing to undo; the
//! writes are [`super::apply`]'s, after every refusal was decided.

use std::time::Duration;

use tokio_postgres::Client;

use super::facts::{Facts, FleetSlot, PublicationFacts, ShardColumn, SiblingFilters, TableFacts};
use super::lineage::Lineage;
use super::{StartupError, Wanted, WantedTable, checks};
use crate::outbox::Shard;
use crate::postgres::catalog::{self, publication, slots, tables};
use crate::postgres::{Connector, PostgresError};
use crate::sink::KafkaClients;

/// Every fact: the catalog, then, once the catalog passes the checks, the lineage (so that a
/// misconfigured server is refused without waiting on Kafka, and IDENTIFY_SYSTEM runs only
/// for a role that may replicate).
/// The lineage topic's read waits for Kafka at most `read_timeout`.
pub async fn gather(
    control: &Client,
    pinned: &Connector,
    kafka: &KafkaClients,
    wanted: &Wanted,
    read_timeout: Duration,
) -> Result<Facts, StartupError> {
    let mut facts = catalog(control, wanted).await?;
    if checks::check(&facts, wanted).refusals.is_empty() {
        let lineage = Lineage::open(pinned, kafka, &wanted.lineage_topic, &wanted.slot).await?;
        let lineage = lineage.within(read_timeout);
        let others: Vec<String> = facts.other_fleets.iter().map(|o| o.slot.clone()).collect();
        let exists = facts.slot.is_some();
        facts.lineage = Some(lineage.facts(control, exists, &others).await?);
    }
    Ok(facts)
}

/// The slot `name`, the one fact `peek` needs (`None` when it does not exist).
pub async fn slot(control: &Client, name: &str) -> Result<Option<slots::Slot>, PostgresError> {
    slots::slot(control, name).await
}

/// The catalog's facts, without the lineage.
pub async fn catalog(control: &Client, wanted: &Wanted) -> Result<Facts, PostgresError> {
    let server = catalog::server(control, checks::HASH_PROBE).await?;
    let mut tables = Vec::new();
    for table in &wanted.tables {
        tables.push(table_facts(control, table, wanted).await?);
    }
    let publication = publication_facts(control, wanted).await?;
    let slot = slot(control, &wanted.slot).await?;
    let siblings = siblings(control, wanted).await;
    let sibling_filters = sibling_filters(control, wanted, &siblings).await?;
    let family = slots::family(control, wanted.base_slot()).await?;
    Ok(Facts {
        server,
        tables,
        publication,
        slot,
        siblings,
        sibling_filters,
        other_fleets: other_fleets(wanted, family),
        lineage: None,
    })
}

/// One table's facts; only that it is missing, when it is.
pub async fn table_facts(
    control: &Client,
    table: &WantedTable,
    wanted: &Wanted,
) -> Result<TableFacts, PostgresError> {
    let mut facts = TableFacts {
        found: tables::table(control, &table.name).await?,
        column_facts: Vec::new(),
        shard_columns: Vec::new(),
        primary_key: None,
    };
    if facts.found.is_none() {
        return Ok(facts);
    }
    let mapping = &table.mapping;
    if mapping.connect.is_some() {
        facts.column_facts = tables::column_facts(control, &table.name.quoted()).await?;
    }
    if wanted.shard.is_some() {
        let hashed = [
            ("--key-column", &mapping.key_column),
            ("--id-column", &mapping.id_column),
        ];
        for (flag, column) in hashed {
            facts.shard_columns.push(ShardColumn {
                flag,
                column: column.clone(),
                found: tables::column_type(control, &table.name, column).await?,
            });
        }
    }
    if wanted.cleanup_delete {
        facts.primary_key = Some(tables::primary_key(control, &table.name).await?);
    }
    Ok(facts)
}

async fn publication_facts(
    control: &Client,
    wanted: &Wanted,
) -> Result<Option<PublicationFacts>, PostgresError> {
    let Some(options) = publication::options(control, &wanted.publication).await? else {
        return Ok(None);
    };
    let names = wanted.table_names();
    let found = publication::publication(control, &options, &names).await?;
    let own_rows = match wanted.shard.is_some() && !names.is_empty() {
        true => publication::own_rows(control, options.oid, &names).await?,
        false => Vec::new(),
    };
    Ok(Some(PublicationFacts {
        options,
        members: found.members,
        own_rows,
    }))
}

/// The other shards' slots that exist. Only a warning depends on them: a failed read is not
/// worth a refusal.
async fn siblings(control: &Client, wanted: &Wanted) -> Vec<String> {
    let names = checks::sibling_slots(wanted);
    if names.is_empty() {
        return names;
    }
    match slots::existing(control, &names).await {
        Ok(existing) => existing,
        Err(error) => {
            tracing::debug!(error = %error, "cannot list the other shards' slots");
            Vec::new()
        }
    }
}

/// Of the slots of the same base name (`family`), those of fleets of another K.
fn other_fleets(wanted: &Wanted, family: Vec<String>) -> Vec<FleetSlot> {
    let base = wanted.base_slot();
    let mut others = Vec::new();
    for slot in family {
        let Some(shard) = Shard::of_name(base, &slot) else {
            continue;
        };
        let found = FleetSlot { slot, shard };
        if found.count() != wanted.count() {
            others.push(found);
        }
    }
    others
}

/// The row filters of the sibling shards whose slots exist (`siblings`) and whose
/// publications exist.
async fn sibling_filters(
    control: &Client,
    wanted: &Wanted,
    siblings: &[String],
) -> Result<Vec<SiblingFilters>, PostgresError> {
    let Some(shard) = wanted.shard else {
        return Ok(Vec::new());
    };
    let names = wanted.table_names();
    let suffix = shard.name("");
    let base = wanted.publication.strip_suffix(&suffix);
    let (Some(base), false) = (base, names.is_empty()) else {
        return Ok(Vec::new());
    };
    let mut found = Vec::new();
    for slot in siblings {
        let Some(Some(sibling)) = Shard::of_name(wanted.base_slot(), slot) else {
            continue;
        };
        let publication = sibling.name(base);
        let Some(options) = publication::options(control, &publication).await? else {
            continue;
        };
        let rows = publication::own_rows(control, options.oid, &names).await?;
        found.push(SiblingFilters {
            shard: sibling,
            publication,
            filters: rows.into_iter().map(|row| row.filter).collect(),
        });
    }
    Ok(found)
}
