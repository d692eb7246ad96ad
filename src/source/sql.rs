//! PURE: the set-up and tear-down statements, which `outbox-relay setup --print` prints,
//! so what an operator reviews is what the relay runs.

use crate::outbox::{TableName, quote_ident};

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

/// Creates the pgoutput slot (`failover`: PostgreSQL 17+ standbys synchronize it).
pub fn create_slot(slot: &str, failover: bool) -> String {
    let failover = if failover { ", false, false, true" } else { "" };
    format!(
        "SELECT slot_name::text, lsn::text FROM pg_create_logical_replication_slot({}, 'pgoutput'{failover})",
        quote_literal(slot)
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
    }
}
