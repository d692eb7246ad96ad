//! PURE: the publication's rules: one found must publish inserts, through the partition root
//! where an outbox table is partitioned, and cover every outbox table; one missing is created,
//! but not on a standby.

use super::{Refused, Step};
use crate::outbox::{TableName, quote_ident};
use crate::postgres::catalog::Server;
use crate::postgres::catalog::publication::Options;
use crate::postgres::sql;
use crate::startup::Wanted;
use crate::startup::facts::{Facts, PublicationFacts};

/// The publication found publishes inserts, through the partition root where an outbox table
/// is partitioned, and covers every outbox table.
pub(super) fn found(found: &PublicationFacts, facts: &Facts, wanted: &Wanted) -> Option<Refused> {
    let partitioned: Vec<&TableName> = (wanted.tables.iter().zip(&facts.tables))
        .filter(|(_, table)| table.found.as_ref().is_some_and(|t| t.partitioned))
        .map(|(table, _)| &table.name)
        .collect();
    let names = wanted.table_names();
    let options = &found.options;
    publication_unfit(
        &wanted.publication,
        options,
        &found.members,
        &names,
        &partitioned,
    )
}

/// Why the publication `name` cannot send the outbox tables' inserts (`partitioned` names the
/// partitioned ones, which need `publish_via_partition_root`); also checked while streaming.
pub fn publication_unfit(
    name: &str,
    options: &Options,
    members: &[(String, Vec<u32>)],
    tables: &[TableName],
    partitioned: &[&TableName],
) -> Option<Refused> {
    let quoted_name = quote_ident(name);
    let problem = if !options.inserts {
        format!(
            "does not publish inserts; run ALTER PUBLICATION {quoted_name} SET (publish = \
             'insert'); or use another --publication"
        )
    } else if !options.via_root && !partitioned.is_empty() {
        // Without it, a partitioned outbox's rows arrive under each partition's name.
        let names: Vec<String> = partitioned.iter().map(ToString::to_string).collect();
        format!(
            "lacks publish_via_partition_root, so rows of the partitioned outbox table {} would \
             arrive under each partition's name; run ALTER PUBLICATION {quoted_name} SET \
             (publish_via_partition_root = true);",
            names.join(", ")
        )
    } else if let Some(missing) = uncovered(members, tables) {
        let names: Vec<String> = missing.iter().map(ToString::to_string).collect();
        let quoted: Vec<String> = missing.iter().map(|t| t.quoted()).collect();
        format!(
            "does not include {}; run ALTER PUBLICATION {quoted_name} ADD TABLE {};",
            names.join(", "),
            quoted.join(", ")
        )
    } else {
        return None;
    };
    Some(Refused::Misconfigured(format!(
        "publication {name:?} {problem}"
    )))
}

/// The outbox tables no catalog row publishes (`members` has none for `FOR ALL TABLES`).
fn uncovered<'a>(
    members: &[(String, Vec<u32>)],
    tables: &'a [TableName],
) -> Option<Vec<&'a TableName>> {
    let publishes = |table: &TableName| !members.contains(&(table.quoted(), Vec::new()));
    let missing: Vec<&TableName> = tables.iter().filter(|t| !publishes(t)).collect();
    (!missing.is_empty()).then_some(missing)
}

/// The publication to create, with a shard's `filters`; refused on a standby, where nothing
/// can be created (the statement is what to run on the primary).
pub(super) fn create(
    server: &Server,
    wanted: &Wanted,
    filters: &[String],
) -> Result<Step, Refused> {
    let names = wanted.table_names();
    let statement = sql::create_publication(&wanted.publication, &names, filters);
    if server.in_recovery {
        return Err(Refused::Misconfigured(format!(
            "publication {:?} does not exist, and this server is a hot standby, where nothing \
             can be created; create it on the primary (it reaches the standby through \
             replication): {statement};",
            wanted.publication
        )));
    }
    Ok(Step::CreatePublication(statement))
}

/// What `setup --print` prints: `publication` for `tables` and the slot, created as if
/// neither existed (`filters`: a shard's row filters; `failover`: `--slot-failover`).
pub fn setup_steps(
    publication: &str,
    tables: &[TableName],
    filters: &[String],
    failover: bool,
) -> Vec<Step> {
    let statement = sql::create_publication(publication, tables, filters);
    vec![
        Step::CreatePublication(statement),
        Step::CreateSlot { failover },
    ]
}
