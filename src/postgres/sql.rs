//! PURE: the statements the relay runs (the catalog's reads are in [`super::catalog`]). The
//! set-up ones are what `outbox-relay setup --print` prints, so what an operator reviews is
//! what the relay runs.

use crate::lsn::Lsn;
use crate::outbox::{TableName, quote_ident};

/// A session's settings for reading rows as pgoutput sends them (`peek`, `backfill`).
pub const SESSION_FORMATS: &str = "SET datestyle = 'ISO, YMD'; SET timezone = 'UTC'; \
     SET intervalstyle = 'postgres'; SET extra_float_digits = 3";

/// The heartbeat: a logical decoding message whose prefix, `outbox-relay-heartbeat`, is no
/// outbox prefix, so it is never relayed.
pub const HEARTBEAT: &str = "SELECT pg_logical_emit_message(false, 'outbox-relay-heartbeat', '')";

/// Has the primary log a standby snapshot now (refused without EXECUTE on it).
pub const LOG_STANDBY_SNAPSHOT: &str = "SELECT pg_log_standby_snapshot()";

/// The delete session's limits: a DELETE never waits long for a lock (rows another session
/// holds are skipped anyway) nor runs long; either is retried later.
pub const DELETE_SESSION: &str = "SET lock_timeout = '2s'; SET statement_timeout = '30s'";

/// Publishes only inserts (the events) under a partitioned outbox's root name, so new partitions
/// need nothing (and a shard's filter on the root applies to them); without tables (messages
/// only) it covers none: pgoutput sends messages anyway. `filters` is empty, or a shard's row
/// filter of each table.
pub fn create_publication(publication: &str, tables: &[TableName], filters: &[String]) -> String {
    let for_tables = match tables.is_empty() {
        true => String::new(),
        false => format!(" FOR TABLE {}", filtered_tables(tables, filters)),
    };
    format!(
        "CREATE PUBLICATION {}{for_tables} WITH (publish = 'insert', publish_via_partition_root = true)",
        quote_ident(publication),
    )
}

/// `"schema"."table" WHERE (filter), ...`: the tables, each with its filter if there is one.
pub fn filtered_tables(tables: &[TableName], filters: &[String]) -> String {
    let table = |(i, table): (usize, &TableName)| match filters.get(i) {
        Some(filter) => format!("{} WHERE ({filter})", table.quoted()),
        None => table.quoted(),
    };
    let tables: Vec<String> = tables.iter().enumerate().map(table).collect();
    tables.join(", ")
}

/// Sets the publication's tables to a shard's: the outbox tables with its `filters`, inserts
/// only, through the partition root.
pub fn set_shard_tables(publication: &str, tables: &[TableName], filters: &[String]) -> String {
    let name = quote_ident(publication);
    let tables = filtered_tables(tables, filters);
    format!(
        "ALTER PUBLICATION {name} SET TABLE {tables}; ALTER PUBLICATION {name} SET \
         (publish = 'insert', publish_via_partition_root = true)"
    )
}

/// Creates the pgoutput slot (`failover`: PostgreSQL 17+ standbys synchronize it).
pub fn create_slot(slot: &str, failover: bool) -> String {
    let failover = if failover { ", false, false, true" } else { "" };
    format!(
        "SELECT slot_name::text, lsn::text FROM pg_create_logical_replication_slot({}, 'pgoutput'{failover})",
        quote_literal(slot)
    )
}

/// Marks the slot for failover (a replication command, run on a replication session).
pub fn mark_failover(slot: &str) -> String {
    format!("ALTER_REPLICATION_SLOT {slot} (FAILOVER true)")
}

/// Moves the slot's confirmed position to `to` (`reshard --finish`).
pub fn advance_slot(slot: &str, to: Lsn) -> String {
    format!(
        "SELECT pg_replication_slot_advance({}, '{to}')",
        quote_literal(slot)
    )
}

/// Deletes rows of `table` by its primary key `columns`, for any key shape: the keys arrive as
/// one JSON array of objects (`$1`), whose text values the table's own row type converts. It
/// deletes the rows no other session holds and returns the (1-based) positions of those that
/// still exist, held by another session.
pub fn delete_rows(table: &TableName, columns: &[String]) -> String {
    let table = table.quoted();
    let columns: Vec<String> = columns.iter().map(|c| quote_ident(c)).collect();
    let key = columns.join(", ");
    let typed = format!("r.{}", columns.join(", r."));
    format!(
        "WITH keys AS (SELECT k.outbox_relay_n, {typed} \
           FROM jsonb_array_elements($1::text::jsonb) WITH ORDINALITY AS k(v, outbox_relay_n), \
             jsonb_populate_record(NULL::{table}, k.v) AS r), \
         gone AS (DELETE FROM {table} WHERE ({key}) IN (SELECT {key} FROM {table} \
           WHERE ({key}) IN (SELECT {key} FROM keys) FOR UPDATE SKIP LOCKED) RETURNING {key}) \
         SELECT outbox_relay_n FROM keys \
         WHERE ({key}) IN (SELECT {key} FROM {table}) AND ({key}) NOT IN (SELECT {key} FROM gone)"
    )
}

/// Drops the slot (fails while a walsender uses it).
pub fn drop_slot(slot: &str) -> String {
    format!("SELECT pg_drop_replication_slot({})", quote_literal(slot))
}

/// Drops the publication if it exists.
pub fn drop_publication(publication: &str) -> String {
    format!("DROP PUBLICATION IF EXISTS {}", quote_ident(publication))
}

/// A SQL string literal, doubling embedded quotes.
pub fn quote_literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_quote_their_names() {
        let tables = [
            TableName::parse("public.outbox").unwrap(),
            TableName::parse("sales.Outbox").unwrap(),
        ];
        assert_eq!(
            create_publication("outbox_relay", &tables, &[]),
            "CREATE PUBLICATION \"outbox_relay\" FOR TABLE \"public\".\"outbox\", \"sales\".\"Outbox\" \
             WITH (publish = 'insert', publish_via_partition_root = true)"
        );
        let filters = ["a = 1".to_owned(), "b = 2".to_owned()];
        assert_eq!(
            filtered_tables(&tables, &filters),
            "\"public\".\"outbox\" WHERE (a = 1), \"sales\".\"Outbox\" WHERE (b = 2)"
        );
        assert_eq!(
            create_slot("outbox_relay", false),
            "SELECT slot_name::text, lsn::text FROM pg_create_logical_replication_slot('outbox_relay', 'pgoutput')"
        );
        assert_eq!(drop_slot("s"), "SELECT pg_drop_replication_slot('s')");
        assert_eq!(drop_publication("p"), "DROP PUBLICATION IF EXISTS \"p\"");
        assert_eq!(quote_literal("it's"), "'it''s'");
        assert_eq!(
            advance_slot("s", Lsn(0x10)),
            "SELECT pg_replication_slot_advance('s', '0/10')"
        );
    }

    #[test]
    fn one_delete_statement_shape_for_any_key() {
        let table = TableName {
            schema: "public".into(),
            name: "outbox".into(),
        };
        let sql = delete_rows(&table, &["id".into(), "created_on".into()]);
        for part in [
            "SELECT k.outbox_relay_n, r.\"id\", r.\"created_on\"",
            "jsonb_populate_record(NULL::\"public\".\"outbox\", k.v)",
            "DELETE FROM \"public\".\"outbox\" WHERE (\"id\", \"created_on\") IN",
            "FOR UPDATE SKIP LOCKED) RETURNING \"id\", \"created_on\"",
            "NOT IN (SELECT \"id\", \"created_on\" FROM gone)",
        ] {
            assert!(sql.contains(part), "{part}: {sql}");
        }
    }
}
