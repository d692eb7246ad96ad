//! PURE: a shard's rules (`--shard I/K`): each outbox table published with the row filter
//! [`crate::outbox::Shard::row_filter`] over its key and id columns, which must be hashable
//! there; a server that hashes text as the relay does; and the warning for a shard whose slot
//! is created after its siblings'.

use super::Refused;
use crate::lsn::Lsn;
use crate::outbox::shard::{FilterParts, hash_text, same_filter};
use crate::outbox::{Shard, TableName, quote_ident};
use crate::postgres::catalog::Server;
use crate::postgres::sql;
use crate::startup::Wanted;
use crate::startup::facts::{Facts, PublicationFacts, ShardColumn, SiblingFilters};

/// `FirstNormalObjectId`: objects below it are built in, all a row filter may call.
const FIRST_NORMAL_OID: u32 = 16384;

/// Hashed by both sides at start-up: non-ASCII, and a length that leaves a tail of every word.
pub const HASH_PROBE: &str = "outbox-relay shard probe: Grüße, 世界";

/// With `--shard`, each table's row filter, in order; none unsharded, or refused when a key
/// or id column cannot be hashed by a filter.
pub fn row_filters(facts: &Facts, wanted: &Wanted) -> Result<Vec<String>, Refused> {
    let Some(shard) = wanted.shard else {
        return Ok(Vec::new());
    };
    let mut filters = Vec::new();
    for (table, found) in wanted.tables.iter().zip(&facts.tables) {
        let [key, id] = &found.shard_columns[..] else {
            return Err(super::table_missing(&table.name));
        };
        let key = column_text(&table.name, key)?;
        let id = column_text(&table.name, id)?;
        filters.push(shard.row_filter(&key, &id));
    }
    Ok(filters)
}

/// An SQL expression for the column's text as pgoutput sends it: the column itself when it is
/// text, else its type's output function in `textin` (a row filter may not cast to text: that
/// is an I/O conversion, which Postgres refuses there). A column Postgres would refuse in a row
/// filter (a user-defined type or collation, a mutable output function) is refused here, by
/// name, as Postgres does not name it.
fn column_text(table: &TableName, column: &ShardColumn) -> Result<String, Refused> {
    let flag = column.flag;
    let name = &column.column;
    let Some(found) = &column.found else {
        return Err(Refused::Misconfigured(format!(
            "outbox table {table} has no column {name:?} (named by {flag})"
        )));
    };
    let user_defined = if found.oid >= FIRST_NORMAL_OID {
        Some(format!("type {} (a domain or an extension's)", found.name))
    } else if found.collation_oid >= FIRST_NORMAL_OID {
        Some(format!("collation {}", found.collation))
    } else {
        None
    };
    if let Some(user_defined) = user_defined {
        return Err(Refused::Misconfigured(format!(
            "--shard: {flag} {name:?} of {table} has the user-defined {user_defined}, which \
             Postgres does not allow in a publication row filter, so no filter can hash it. \
             Shard on a column of a built-in type and collation (set {flag}, or a per-table \
             override)"
        )));
    }
    let quoted = quote_ident(name);
    if found.is_text {
        return Ok(quoted);
    }
    let output = &found.output;
    if found.output_immutable {
        return Ok(format!("textin({output}({quoted}))"));
    }
    Err(Refused::Misconfigured(format!(
        "--shard: {flag} {name:?} of {table} has type {}, whose output function {output} is not \
         immutable (its text depends on settings such as TimeZone), so a publication row filter \
         cannot hash its text. Shard on a column of type text, varchar, uuid, an integer or \
         jsonb (set {flag}, or a per-table override)",
        found.name
    )))
}

/// A shard refuses a server whose `hashtextextended` is not the relay's (a big-endian one):
/// messages and backfilled rows, which the relay hashes, would go to other shards than rows.
pub(super) fn hash(server: &Server, wanted: &Wanted) -> Option<Refused> {
    let shard = wanted.shard?;
    let relay = hash_text(HASH_PROBE.as_bytes());
    if server.probe_hash == relay {
        return None;
    }
    Some(Refused::Misconfigured(format!(
        "--shard {shard}: the server hashes text differently from the relay \
         (hashtextextended({HASH_PROBE:?}, 0) is {} there, {relay} here; a big-endian server?), \
         so logical decoding messages and backfilled rows would go to other shards than their \
         rows. Run the relay without --shard",
        server.probe_hash
    )))
}

/// A shard's publication found must publish each outbox table by its own catalog row, with
/// the shard's filter (`filters`, in table order).
pub(super) fn publication(
    found: &PublicationFacts,
    wanted: &Wanted,
    filters: &[String],
) -> Option<Refused> {
    let shard = wanted.shard?;
    // A table-less outbox's messages are filtered by the relay (which runs on PostgreSQL 14,
    // without `prqual`); other tables' rows are skipped anyway.
    if wanted.tables.is_empty() {
        return None;
    }
    let name = &wanted.publication;
    let fix = || {
        let statement = sql::set_shard_tables(name, &wanted.table_names(), filters);
        format!(
            "Run {statement}; (or drop the publication and let the relay create it). Another \
             relay's publication cannot be shared: each shard has its own"
        )
    };
    if found.options.all_tables {
        return Some(Refused::Misconfigured(format!(
            "publication {name:?} is FOR ALL TABLES, which cannot carry a row filter, so shard \
             {shard} would receive every shard's rows. {}",
            fix()
        )));
    }
    let tables = wanted.tables.iter().zip(filters).zip(&found.own_rows);
    for ((table, expected), own) in tables {
        let members = found.members.iter().find(|(t, _)| *t == own.table);
        let others = members.is_some_and(|(_, oids)| oids.iter().any(|o| Some(*o) != own.oid));
        let problem = match &own.filter {
            _ if others => "is also published through a schema or a parent table, without the \
                            shard's row filter"
                .to_owned(),
            None => "has no row filter".to_owned(),
            Some(filter) if rehashed(filter, expected) => {
                return Some(Refused::Misconfigured(rehash(
                    wanted,
                    shard,
                    &table.name,
                    filter,
                )));
            }
            Some(filter) if !same_filter(filter, expected) => {
                format!("has the row filter ({filter}), not shard {shard}'s")
            }
            Some(_) => continue,
        };
        return Some(Refused::Misconfigured(format!(
            "publication {name:?}: outbox table {} {problem}, so it would not send shard {shard} \
             exactly its rows. {}",
            table.name,
            fix()
        )));
    }
    None
}

/// Each sibling shard's row filters must hash what this shard's (`filters`, in table order)
/// hash: shards of one K hashing other columns (one restarted with another `--key-column`
/// and a publication made anew, say) split the rows two ways, some relayed by no shard and
/// some by two.
pub(super) fn siblings_hash(facts: &Facts, wanted: &Wanted, filters: &[String]) -> Option<Refused> {
    let shard = wanted.shard?;
    for sibling in &facts.sibling_filters {
        let tables = wanted.tables.iter().zip(filters).zip(&sibling.filters);
        for ((table, ours), theirs) in tables {
            let Some(theirs) = theirs else {
                continue;
            };
            let ours_hashed = FilterParts::parse(ours).map(|parts| parts.hashed);
            let theirs_hashed = FilterParts::parse(theirs).map(|parts| parts.hashed);
            if ours_hashed.is_none() || theirs_hashed.is_none() || ours_hashed == theirs_hashed {
                continue;
            }
            return Some(Refused::Misconfigured(unlike_sibling(
                shard,
                sibling,
                &table.name,
                theirs,
            )));
        }
    }
    None
}

/// The refusal of a shard whose key or id column is not its sibling's.
fn unlike_sibling(
    shard: Shard,
    sibling: &SiblingFilters,
    table: &TableName,
    theirs: &str,
) -> String {
    let count = shard.count;
    format!(
        "--shard {shard} would hash other columns of outbox table {table} than shard {} of the \
         same fleet, whose publication {:?} has the row filter ({theirs}): the two would split \
         the rows two ways, so some would be relayed by no shard and others twice. Start this \
         shard with the fleet's --key-column and --id-column; to change them, reshard: run \
         `outbox-relay reshard --from {count} --to K'` with the new columns, K' another count \
         than {count} (see docs/operations.md#resharding)",
        sibling.shard, sibling.publication
    )
}

/// Whether the shard's row filter `found` and the one it would have now, `expected`, select
/// the same shard of the same K but hash other columns (a changed `--key-column` or
/// `--id-column`): every shard's rows move, which no one shard's filter can change.
fn rehashed(found: &str, expected: &str) -> bool {
    match (FilterParts::parse(found), FilterParts::parse(expected)) {
        (Some(found), Some(expected)) => {
            found.shard == expected.shard && found.hashed != expected.hashed
        }
        _ => false,
    }
}

/// The refusal of a shard whose key or id column changed since its publication was made
/// (`found`, on `table`): a resharding, not one shard's `ALTER PUBLICATION`, which while the
/// other shards run the old filter splits the rows two ways (some relayed by no shard, some
/// twice).
fn rehash(wanted: &Wanted, shard: Shard, table: &TableName, found: &str) -> String {
    let count = shard.count;
    let other = if count == 2 { 3 } else { 2 };
    format!(
        "publication {:?}: outbox table {table} is sharded by another key or id column than \
         --key-column/--id-column say now (its row filter is ({found})). Changing what the \
         shards hash moves rows between every shard of the fleet, so it is a resharding, not \
         an ALTER PUBLICATION of one shard's filter (while the other shards run the old one, \
         some rows would be relayed by no shard and others twice): run `outbox-relay reshard \
         --from {count} --to K'` with the new columns, K' another count than {count} (say \
         {other}; resharding again returns to {count}), as docs/operations.md#resharding says; \
         or start this shard with the columns it was created with",
        wanted.publication
    )
}

/// With `--shard`, the slots the other shards of the same K would have.
pub fn sibling_slots(wanted: &Wanted) -> Vec<String> {
    let Some(shard) = wanted.shard else {
        return Vec::new();
    };
    let Some(base) = wanted.slot.strip_suffix(&shard.name("")) else {
        return Vec::new();
    };
    let count = shard.count;
    let others = (0..count).filter(|&index| index != shard.index);
    others
        .map(|index| Shard { index, count }.name(base))
        .collect()
}

/// The warning for a shard whose slot was created at `created`, after other shards' slots on
/// the server (`siblings`). They started first, so the rows this shard owns that committed in
/// between are in no slot: a moment's worth when the shards start together, more when one
/// starts late (its pod pending, say), and only `backfill` relays them. A warning, not a
/// refusal: at every first start all but one shard find a sibling.
pub fn late_shard(wanted: &Wanted, siblings: &[String], created: Lsn) -> Option<String> {
    let shard = wanted.shard?;
    if siblings.is_empty() {
        return None;
    }
    let count = shard.count;
    Some(format!(
        "shard {shard}'s slot was created at {created}, after other shards' slots on this server \
         ({}): the outbox rows shard {shard} owns that committed between their creation and \
         {created} are in no slot and are not relayed (a moment's worth if the shards started \
         together). Re-publish them with `outbox-relay backfill --shard {shard} --since <when \
         the first shard started>`; creating every shard's slot before the outbox is written \
         (`outbox-relay setup --shard I/{count}` for each I) avoids the gap",
        siblings.join(", ")
    ))
}
