//! The outbox tables: their columns as a pgoutput Relation announces them, their partitions'
//! persistence, the columns' `NOT NULL` and `DEFAULT`, a column's type (for a shard's row
//! filter), the primary key (for `--cleanup delete`), and the rows themselves (`backfill`).

use tokio_postgres::{Client, RowStream};

use crate::outbox::connect::ColumnFacts;
use crate::outbox::{TableName, quote_ident};
use crate::pgoutput::{Column, Relation};
use crate::postgres::{PostgresError, query_err};

/// An outbox table as the catalog describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Table {
    /// Its columns as a pgoutput Relation announces them (`id` 0: no stream announced it).
    pub relation: Relation,
    /// A partitioned table (its rows arrive under its partitions' names unless the
    /// publication publishes through the root).
    pub partitioned: bool,
    /// It or a partition is UNLOGGED, so writes no WAL: their names, `, `-separated.
    pub unlogged: Option<String>,
}

/// The table, or `None` when it does not exist (or is no table).
pub async fn table(client: &Client, table: &TableName) -> Result<Option<Table>, PostgresError> {
    let Some(relation) = relation(client, table).await? else {
        return Ok(None);
    };
    let failed = query_err("read the outbox table's persistence");
    let row = client
        .query_one(
            "SELECT c.relkind = 'p', \
                    (SELECT string_agg(p.oid::regclass::text, ', ') FROM pg_class p \
                     WHERE p.relpersistence = 'u' AND (p.oid = c.oid \
                           OR p.oid IN (SELECT relid FROM pg_partition_tree(c.oid)))) \
             FROM pg_class c WHERE c.oid = to_regclass($1)",
            &[&table.quoted()],
        )
        .await
        .map_err(&failed)?;
    Ok(Some(Table {
        relation,
        partitioned: row.try_get(0).map_err(&failed)?,
        unlogged: row.try_get(1).map_err(&failed)?,
    }))
}

/// The table's columns as a pgoutput Relation announces them; `None` when it does not exist.
pub async fn relation(
    client: &Client,
    table: &TableName,
) -> Result<Option<Relation>, PostgresError> {
    let failed = query_err("read the outbox table's columns");
    let rows = client
        .query(
            "SELECT a.attname::text, a.atttypid, a.atttypmod FROM pg_attribute a \
             JOIN pg_class c ON c.oid = a.attrelid \
             WHERE c.oid = to_regclass($1) AND c.relkind IN ('r', 'p') \
               AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            &[&table.quoted()],
        )
        .await
        .map_err(&failed)?;
    if rows.is_empty() {
        return Ok(None);
    }
    let mut columns = Vec::new();
    for row in &rows {
        columns.push(Column {
            flags: 0,
            name: row.try_get(0).map_err(&failed)?,
            type_oid: row.try_get(1).map_err(&failed)?,
            type_modifier: row.try_get(2).map_err(&failed)?,
        });
    }
    Ok(Some(Relation {
        id: 0,
        namespace: table.schema.clone(),
        name: table.name.clone(),
        replica_identity: b'd',
        columns,
    }))
}

/// The `NOT NULL` and `DEFAULT` of a table's columns (generated columns have no default);
/// `table` is its OID or quoted name.
pub async fn column_facts(client: &Client, table: &str) -> Result<Vec<ColumnFacts>, PostgresError> {
    let failed = query_err("read the outbox table's NOT NULL and DEFAULT");
    let rows = client
        .query(
            "SELECT a.attname::text, a.attnotnull, \
               CASE WHEN a.attgenerated = '' THEN pg_get_expr(d.adbin, d.adrelid) END \
             FROM pg_attribute a LEFT JOIN pg_attrdef d \
               ON d.adrelid = a.attrelid AND d.adnum = a.attnum \
             WHERE a.attrelid = CASE WHEN $1 ~ '^[0-9]+$' THEN $1::oid ELSE $1::regclass END \
               AND a.attnum > 0 AND NOT a.attisdropped",
            &[&table],
        )
        .await
        .map_err(&failed)?;
    let mut facts = Vec::new();
    for row in &rows {
        facts.push(ColumnFacts {
            name: row.try_get(0).map_err(&failed)?,
            not_null: row.try_get(1).map_err(&failed)?,
            default: row.try_get(2).map_err(&failed)?,
        });
    }
    Ok(facts)
}

/// A column's type, as a shard's row filter needs to know it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ColumnType {
    /// `format_type`, e.g. `timestamp with time zone`.
    pub name: String,
    /// The type's OID (user-defined from `FirstNormalObjectId` on).
    pub oid: u32,
    /// The type's output function, e.g. `uuid_out`.
    pub output: String,
    /// The output function is immutable (its text depends on no setting).
    pub output_immutable: bool,
    /// The type is text itself (its output function is `textout`).
    pub is_text: bool,
    /// The column's collation, e.g. `"default"`.
    pub collation: String,
    /// The collation's OID (user-defined from `FirstNormalObjectId` on).
    pub collation_oid: u32,
}

/// The type of `table`'s `column`; `None` when there is no such column.
pub async fn column_type(
    client: &Client,
    table: &TableName,
    column: &str,
) -> Result<Option<ColumnType>, PostgresError> {
    let failed = query_err("read the type of the shard key's column");
    let row = client
        .query_opt(
            "SELECT format_type(a.atttypid, a.atttypmod), p.proname::text, a.atttypid, \
                    p.provolatile = 'i', t.typoutput = 'textout'::regproc, \
                    a.attcollation::regcollation::text, a.attcollation \
             FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid \
             JOIN pg_proc p ON p.oid = t.typoutput \
             WHERE a.attrelid = to_regclass($1) AND a.attname = $2 AND NOT a.attisdropped",
            &[&table.quoted(), &column],
        )
        .await
        .map_err(&failed)?;
    let Some(row) = row else {
        return Ok(None);
    };
    Ok(Some(ColumnType {
        name: row.try_get(0).map_err(&failed)?,
        output: row.try_get(1).map_err(&failed)?,
        oid: row.try_get(2).map_err(&failed)?,
        output_immutable: row.try_get(3).map_err(&failed)?,
        is_text: row.try_get(4).map_err(&failed)?,
        collation: row.try_get(5).map_err(&failed)?,
        collation_oid: row.try_get(6).map_err(&failed)?,
    }))
}

/// A table's primary key, for `--cleanup delete`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PrimaryKey {
    /// Its columns, in key order; empty when the table has none.
    pub columns: Vec<String>,
    /// The role may DELETE from the table.
    pub may_delete: bool,
}

/// The table's primary key (none: no columns).
pub async fn primary_key(client: &Client, table: &TableName) -> Result<PrimaryKey, PostgresError> {
    let failed = query_err("read the outbox table's primary key");
    let rows = client
        .query(
            "SELECT a.attname::text, has_table_privilege(i.indrelid, 'DELETE') \
             FROM pg_index i JOIN pg_attribute a \
               ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey) \
             WHERE i.indrelid = $1::text::regclass AND i.indisprimary \
             ORDER BY array_position(i.indkey::int2[], a.attnum)",
            &[&table.quoted()],
        )
        .await
        .map_err(&failed)?;
    let mut key = PrimaryKey {
        columns: Vec::new(),
        may_delete: true,
    };
    for row in &rows {
        key.columns.push(row.try_get(0).map_err(&failed)?);
        key.may_delete &= row.try_get::<_, bool>(1).map_err(&failed)?;
    }
    Ok(key)
}

/// The root of the partition tree the relation `relation_id` belongs to (`None` for a plain
/// table).
pub async fn partition_root(
    client: &Client,
    relation_id: u32,
) -> Result<Option<TableName>, PostgresError> {
    let failed = query_err("look up a relation's partition root");
    let row = client
        .query_opt(
            "SELECT n.nspname::text, c.relname::text FROM pg_class c \
             JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE c.oid = pg_partition_root($1::oid)",
            &[&relation_id],
        )
        .await
        .map_err(&failed)?;
    let Some(row) = row else {
        return Ok(None);
    };
    Ok(Some(TableName {
        schema: row.try_get(0).map_err(&failed)?,
        name: row.try_get(1).map_err(&failed)?,
    }))
}

/// The rows of `table` whose `column` is at or after `since`, in its order, each of
/// `relation`'s columns as text; streamed: the connection reads on only as rows are taken.
pub async fn rows_since(
    client: &Client,
    table: &TableName,
    relation: &Relation,
    column: &str,
    since: &str,
) -> Result<RowStream, PostgresError> {
    let columns: Vec<String> = (relation.columns.iter())
        .map(|c| quote_ident(&c.name) + "::text")
        .collect();
    let column = quote_ident(column);
    let sql = format!(
        "SELECT {} FROM {} WHERE {column} >= $1::text::timestamptz ORDER BY {column}",
        columns.join(", "),
        table.quoted(),
    );
    let rows = client.query_raw(&sql, [since]).await;
    rows.map_err(query_err("read the outbox rows"))
}
