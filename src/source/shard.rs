//! A shard's publication (`--shard I/K`): every outbox table with the row filter
//! [`Shard::row_filter`], so each walsender sends its relay only the rows whose key hashes to
//! that shard. Start-up refuses a publication that would not shard so: an unfiltered table (a
//! relay would send every shard's rows) or a partitioned table published under its partitions'
//! names (their filters, none, would apply). It also checks that the server's hash is the
//! relay's, which places the events Postgres cannot filter (messages, `backfill`'s rows), and
//! warns when this shard's slot is created after other shards' (the rows in between are in no
//! slot).

use tokio_postgres::Client;

use super::SourceError;
use crate::config::Config;
use crate::lsn::Lsn;
use crate::outbox::shard::{hash_text, same_filter};
use crate::outbox::{Shard, TableName, quote_ident};
use crate::postgres::catalog::publication::{Publication, own_rows};
use crate::postgres::catalog::tables::column_type;
use crate::postgres::catalog::{self, slots};

/// Hashed by both sides at start-up: non-ASCII, and a length that leaves a tail of every word.
const PROBE: &str = "outbox-relay shard probe: Grüße, 世界";

/// `FirstNormalObjectId`: objects below it are built in, all a row filter may call.
const FIRST_NORMAL_OID: u32 = 16384;

/// The row filter of each of `config.tables`, in order, for the shard (none unsharded).
pub async fn row_filters(client: &Client, config: &Config) -> Result<Vec<String>, SourceError> {
    let Some(shard) = config.flags.shard else {
        return Ok(Vec::new());
    };
    let mut filters = Vec::new();
    for table in &config.tables {
        let mapping = config.mapping_for(table);
        let key = column_text(client, table, "--key-column", &mapping.key_column).await?;
        let id = column_text(client, table, "--id-column", &mapping.id_column).await?;
        filters.push(shard.row_filter(&key, &id));
    }
    Ok(filters)
}

/// An SQL expression for `column`'s text as pgoutput sends it: the column itself when it is
/// text, else its type's output function in `textin` (a row filter may not cast to text: that
/// is an I/O conversion, which Postgres refuses there). A column Postgres would refuse in a row
/// filter (a user-defined type or collation, a mutable output function) is refused here, by name.
async fn column_text(
    client: &Client,
    table: &TableName,
    flag: &str,
    column: &str,
) -> Result<String, SourceError> {
    let Some(found) = column_type(client, table, column).await? else {
        return Err(SourceError::Misconfigured(format!(
            "outbox table {table} has no column {column:?} (named by {flag})"
        )));
    };
    // Postgres refuses a row filter on either, without naming the column.
    let user_defined = if found.oid >= FIRST_NORMAL_OID {
        Some(format!("type {} (a domain or an extension's)", found.name))
    } else if found.collation_oid >= FIRST_NORMAL_OID {
        Some(format!("collation {}", found.collation))
    } else {
        None
    };
    if let Some(user_defined) = user_defined {
        return Err(SourceError::Misconfigured(format!(
            "--shard: {flag} {column:?} of {table} has the user-defined {user_defined}, which \
             Postgres does not allow in a publication row filter, so no filter can hash it. \
             Shard on a column of a built-in type and collation (set {flag}, or a per-table \
             override)"
        )));
    }
    let quoted = quote_ident(column);
    let (type_name, output) = (&found.name, &found.output);
    if found.is_text {
        return Ok(quoted);
    }
    if found.output_immutable {
        return Ok(format!("textin({output}({quoted}))"));
    }
    Err(SourceError::Misconfigured(format!(
        "--shard: {flag} {column:?} of {table} has type {type_name}, whose output function \
         {output} is not immutable (its text depends on settings such as TimeZone), so a \
         publication row filter cannot hash its text. Shard on a column of type text, varchar, \
         uuid, an integer or jsonb (set {flag}, or a per-table override)"
    )))
}

/// Refuses a publication that does not shard as `config.flags.shard` asks (each outbox table
/// published by its own catalog row, with the shard's filter), and a server whose hash differs.
pub async fn verify(
    client: &Client,
    config: &Config,
    publication: &Publication,
    filters: &[String],
) -> Result<(), SourceError> {
    let Some(shard) = config.flags.shard else {
        return Ok(());
    };
    check_hash(client, shard).await?;
    // A table-less outbox's messages are filtered by the relay (which runs on PostgreSQL 14,
    // without `prqual`); other tables' rows are skipped anyway.
    if config.tables.is_empty() {
        return Ok(());
    }
    let name = &config.flags.publication;
    let fix = || {
        let statement = alter_publication(name, &config.tables, filters);
        format!(
            "Run {statement}; (or drop the publication and let the relay create it). Another \
             relay's publication cannot be shared: each shard has its own"
        )
    };
    if publication.all_tables {
        return Err(SourceError::Misconfigured(format!(
            "publication {name:?} is FOR ALL TABLES, which cannot carry a row filter, so shard \
             {shard} would receive every shard's rows. {}",
            fix()
        )));
    }
    let rows = own_rows(client, publication.oid, &config.tables).await?;
    for ((table, expected), row) in config.tables.iter().zip(filters).zip(rows) {
        let members = publication.members.iter().find(|(t, _)| *t == row.table);
        let others = members.is_some_and(|(_, oids)| oids.iter().any(|o| Some(*o) != row.oid));
        let problem = match row.filter {
            _ if others => "is also published through a schema or a parent table, without the \
                            shard's row filter"
                .to_owned(),
            None => "has no row filter".to_owned(),
            Some(found) if !same_filter(&found, expected) => {
                format!("has the row filter ({found}), not shard {shard}'s")
            }
            Some(_) => continue,
        };
        return Err(SourceError::Misconfigured(format!(
            "publication {name:?}: outbox table {table} {problem}, so it would not send shard \
             {shard} exactly its rows. {}",
            fix()
        )));
    }
    Ok(())
}

/// Warns, after this shard's relay created its slot at `created`, of the slots other shards of
/// the same K already have on this server. They started first, so the rows this shard owns that
/// committed in between are in no slot: a moment's worth when the shards start together, more
/// when one starts late (its pod pending, say), and only `backfill` relays them. A warning,
/// not a refusal: at every first start all but one shard find a sibling.
pub async fn warn_if_late(client: &Client, config: &Config, created: Lsn) {
    let (Some(shard), slot) = (config.flags.shard, &config.flags.slot) else {
        return;
    };
    let Some(base) = slot.strip_suffix(&shard.name("")) else {
        return;
    };
    let count = shard.count;
    let siblings: Vec<String> = (0..count)
        .filter(|&index| index != shard.index)
        .map(|index| Shard { index, count }.name(base))
        .collect();
    let found = slots::existing(client, &siblings).await;
    // Only the warning depends on it: a failed read is not worth a refusal.
    let older: Vec<String> = match found {
        Ok(older) => older,
        Err(error) => {
            tracing::debug!(error = %error, "cannot list the other shards' slots");
            return;
        }
    };
    if older.is_empty() {
        return;
    }
    tracing::warn!(
        slot,
        %created,
        "shard {shard}'s slot was created at {created}, after other shards' slots on this server \
         ({}): the outbox rows shard {shard} owns that committed between their creation and \
         {created} are in no slot and are not relayed (a moment's worth if the shards started \
         together). Re-publish them with `outbox-relay backfill --shard {shard} --since <when \
         the first shard started>`; creating every shard's slot before the outbox is written \
         (`outbox-relay setup --shard I/{count}` for each I) avoids the gap",
        older.join(", ")
    );
}

/// Refuses a server whose `hashtextextended` is not the relay's (a big-endian one).
async fn check_hash(client: &Client, shard: Shard) -> Result<(), SourceError> {
    let server = catalog::server(client, PROBE).await?.probe_hash;
    let relay = hash_text(PROBE.as_bytes());
    if server == relay {
        return Ok(());
    }
    Err(SourceError::Misconfigured(format!(
        "--shard {shard}: the server hashes text differently from the relay \
         (hashtextextended({PROBE:?}, 0) is {server} there, {relay} here; a big-endian server?), \
         so logical decoding messages and backfilled rows would go to other shards than their \
         rows. Run the relay without --shard"
    )))
}

/// Sets the publication's tables to the outbox tables with the shard's filters.
fn alter_publication(publication: &str, tables: &[TableName], filters: &[String]) -> String {
    let (name, tables) = (
        quote_ident(publication),
        crate::postgres::sql::filtered_tables(tables, filters),
    );
    format!(
        "ALTER PUBLICATION {name} SET TABLE {tables}; ALTER PUBLICATION {name} SET \
         (publish = 'insert', publish_via_partition_root = true)"
    )
}
