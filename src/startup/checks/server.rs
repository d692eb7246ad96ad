//! PURE: the rules of the server, the role and the outbox tables (and what `--cleanup
//! delete` needs of them).

use super::Refused;
use crate::observability::health::idle_timeout_warning;
use crate::outbox::{TableMapping, TableName, quote_ident};
use crate::postgres::catalog::Server;
use crate::startup::facts::{Facts, TableFacts};
use crate::startup::{Wanted, WantedTable};

/// The oldest supported major version: 14 brought pgoutput's `messages` option.
const MIN_SERVER_MAJOR: i32 = 14;

/// The first version (`server_version_num`) with failover slots.
const FAILOVER_MIN_VERSION: i32 = 170_000;

/// The first version with publication row filters, which `--shard` needs for tables.
const ROW_FILTER_MIN_VERSION: i32 = 150_000;

/// `--cleanup delete` needs a primary, a publication that does not publish deletes, and each
/// table's primary key with the right to delete by it.
pub(super) fn cleanup(facts: &Facts, wanted: &Wanted) -> Option<Refused> {
    if !wanted.cleanup_delete {
        return None;
    }
    let refused = |problem: String| {
        let message = format!("--cleanup delete: {problem}, or use --cleanup none");
        Some(Refused::Misconfigured(message))
    };
    if facts.server.in_recovery {
        return refused(format!(
            "the server at {} is a standby (in recovery), where rows cannot be deleted; point \
             --postgres-url at the primary (or add target_session_attrs=read-write)",
            wanted.url
        ));
    }
    let publication = &wanted.publication;
    if facts
        .publication
        .as_ref()
        .is_some_and(|p| p.options.deletes)
    {
        return refused(format!(
            "publication {publication:?} publishes deletes, so every row the relay deletes would \
             come back through the slot; run ALTER PUBLICATION {} SET (publish = 'insert')",
            quote_ident(publication)
        ));
    }
    for (table, found) in wanted.tables.iter().zip(&facts.tables) {
        let table = &table.name;
        let Some(key) = &found.primary_key else {
            continue;
        };
        if key.columns.is_empty() {
            return refused(format!(
                "table {table} has no primary key, so relayed rows cannot be deleted one by one; \
                 add one (ALTER TABLE {table} ADD PRIMARY KEY (id))"
            ));
        }
        if !key.may_delete {
            let user = &wanted.user;
            return refused(format!(
                "role {user:?} may not DELETE from {table}; run GRANT DELETE ON {table} TO {user}"
            ));
        }
    }
    None
}

/// The server's version, `wal_level`, the role's right to replicate, and what a shard or a
/// failover slot needs of the version.
pub(super) fn server(server: &Server, wanted: &Wanted) -> Option<Refused> {
    let version = &server.version;
    let problem = if server.version_num / 10000 < MIN_SERVER_MAJOR {
        format!(
            "Postgres {version} is not supported: the relay needs PostgreSQL {MIN_SERVER_MAJOR} \
             or newer (for pgoutput's `messages` option)"
        )
    } else if server.wal_level != "logical" {
        format!(
            "Postgres has wal_level={:?}, but logical replication needs wal_level=logical. Run \
             ALTER SYSTEM SET wal_level = logical; and restart Postgres (on RDS/Aurora set \
             rds.logical_replication=1 in the parameter group; on Cloud SQL set the \
             cloudsql.logical_decoding flag)",
            server.wal_level
        )
    } else if !server.can_replicate {
        let user = &wanted.user;
        format!(
            "role {user:?} lacks the REPLICATION attribute (and is not a superuser or a member of \
             rds_replication). Run ALTER ROLE {user} WITH REPLICATION; (see sql/ for a \
             least-privilege role)"
        )
    } else if wanted.slot_failover && server.version_num < FAILOVER_MIN_VERSION {
        format!(
            "--slot-failover needs PostgreSQL 17 or later, but the server is {version}; on older \
             servers a failover loses the slot (see docs/operations.md#failover)"
        )
    } else if let Some(shard) = wanted.shard.filter(|_| !wanted.tables.is_empty())
        && server.version_num < ROW_FILTER_MIN_VERSION
    {
        format!(
            "--shard {shard} needs PostgreSQL 15 or later (publication row filters send each \
             shard only its rows), but the server is {version}. Run one relay without --shard, \
             or shard a table-less outbox (--table none --message-prefix ...)"
        )
    } else {
        return None;
    };
    Some(Refused::Misconfigured(problem))
}

/// PostgreSQL 18's `idle_replication_slot_timeout` drops the slot of a relay stopped longer;
/// a failover slot whose primary waits for no standby may publish what a failover loses.
pub(super) fn warnings(server: &Server, wanted: &Wanted) -> Vec<String> {
    let mut warnings = Vec::new();
    warnings.extend(idle_timeout_warning(server.idle_timeout_secs));
    let standby_slots = server.synchronized_standby_slots.as_deref();
    if wanted.slot_failover && standby_slots.is_some_and(|s| s.trim().is_empty()) {
        warnings.push(
            "--slot-failover: synchronized_standby_slots is empty on the primary, so the relay \
             may receive (and publish) transactions a standby has not received yet; after a \
             failover to that standby they exist in Kafka but not in the database. Set it to \
             the standbys' physical slots"
                .to_owned(),
        );
    }
    warnings
}

/// The table exists, fits Debezium's format when that is asked for, has every column the
/// mapping reads, and writes WAL.
pub(super) fn table(wanted: &WantedTable, facts: &TableFacts) -> Option<Refused> {
    let name = &wanted.name;
    let Some(found) = &facts.found else {
        return Some(table_missing(name));
    };
    let mapping = &wanted.mapping;
    let columns = &found.relation.columns;
    let problem = if mapping.connect.is_some()
        && let Err(e) = TableMapping::bind_with(mapping, &found.relation, &facts.column_facts)
    {
        // Debezium's format refuses column types and combinations before anything is sent.
        e.to_string()
    } else if let Some((flag, column)) = (mapping.required_columns().into_iter())
        .find(|(_, column)| !columns.iter().any(|c| c.name == *column))
    {
        let names: Vec<&str> = columns.iter().map(|c| c.name.as_str()).collect();
        format!(
            "outbox table {name} has no column {column:?} (named by {flag}); its columns are: {}",
            names.join(", ")
        )
    } else if let Some(unlogged) = &found.unlogged {
        format!(
            "outbox table {name} cannot be relayed: {unlogged} is UNLOGGED, and UNLOGGED tables \
             write no WAL, so logical decoding never sees their rows. Run ALTER TABLE ... SET \
             LOGGED; on each"
        )
    } else {
        return None;
    };
    Some(Refused::Misconfigured(problem))
}

/// The refusal of a table that does not exist.
pub fn table_missing(table: &TableName) -> Refused {
    Refused::Misconfigured(format!(
        "outbox table {table} does not exist (check --table and the database in --postgres-url)"
    ))
}
