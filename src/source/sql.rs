//! PURE: the set-up and tear-down statements, which `outbox-relay setup --print` prints,
//! so what an operator reviews is what the relay runs.

use crate::outbox::{TableName, quote_ident};

/// Publishes only inserts (the events) under a partitioned outbox's root name, so new partitions
/// need nothing; without tables (messages only) it covers none: pgoutput sends messages anyway.
pub fn create_publication(publication: &str, tables: &[TableName]) -> String {
    let tables: Vec<String> = tables.iter().map(TableName::quoted).collect();
    let for_tables = match tables.is_empty() {
        true => String::new(),
        false => format!(" FOR TABLE {}", tables.join(", ")),
    };
    format!(
        "CREATE PUBLICATION {}{for_tables} WITH (publish = 'insert', publish_via_partition_root = true)",
        quote_ident(publication),
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
            create_publication("outbox_relay", &tables),
            "CREATE PUBLICATION \"outbox_relay\" FOR TABLE \"public\".\"outbox\", \"sales\".\"Outbox\" \
             WITH (publish = 'insert', publish_via_partition_root = true)"
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
