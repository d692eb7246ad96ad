//! The publication: what it publishes, which catalog rows publish each outbox table (a
//! dropped and re-added table has new ones), and each table's row filter.

use serde::de::DeserializeOwned;
use tokio_postgres::Client;
use tokio_postgres::types::Json;

use crate::outbox::TableName;
use crate::postgres::{PostgresError, query_err};

/// The publication as found: PostgreSQL 18's pgoutput skips a missing one with a warning,
/// and rows inserted while a table is out of it are never decoded, so each look is compared.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Publication {
    /// A dropped and re-created publication has another OID.
    pub oid: u32,
    /// `FOR ALL TABLES`: rows of other tables are expected (and skipped).
    pub all_tables: bool,
    /// `server_version_num`.
    pub server_version: i32,
    /// Per outbox table, the OIDs of the catalog rows that publish it (of it,
    /// an ancestor, or their schema): new ones after it was dropped and added again.
    pub members: Vec<(String, Vec<u32>)>,
}

/// Its `pg_publication` row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// Its OID.
    pub oid: u32,
    /// `FOR ALL TABLES`.
    pub all_tables: bool,
    /// `publish` includes `insert`.
    pub inserts: bool,
    /// `publish` includes `delete`.
    pub deletes: bool,
    /// `publish_via_partition_root`.
    pub via_root: bool,
    /// `server_version_num`, which says what the catalog holds.
    pub server_version: i32,
}

/// The publication's options; `None` when it does not exist.
pub async fn options(client: &Client, name: &str) -> Result<Option<Options>, PostgresError> {
    let failed = query_err("look up the publication");
    let row = client
        .query_opt(
            "SELECT puballtables, pubinsert, pubviaroot, oid, \
                    current_setting('server_version_num')::int, pubdelete \
             FROM pg_publication WHERE pubname = $1",
            &[&name],
        )
        .await
        .map_err(&failed)?;
    let Some(row) = row else {
        return Ok(None);
    };
    Ok(Some(Options {
        all_tables: row.try_get(0).map_err(&failed)?,
        inserts: row.try_get(1).map_err(&failed)?,
        via_root: row.try_get(2).map_err(&failed)?,
        oid: row.try_get(3).map_err(&failed)?,
        server_version: row.try_get(4).map_err(&failed)?,
        deletes: row.try_get(5).map_err(&failed)?,
    }))
}

/// The publication `options` describes, with its members among `tables`.
pub async fn publication(
    client: &Client,
    options: &Options,
    tables: &[TableName],
) -> Result<Publication, PostgresError> {
    let members = match options.all_tables {
        true => Vec::new(),
        false => members(client, options, tables).await?,
    };
    Ok(Publication {
        oid: options.oid,
        all_tables: options.all_tables,
        server_version: options.server_version,
        members,
    })
}

/// [`Publication::members`]; none for a table the publication does not cover.
async fn members(
    client: &Client,
    options: &Options,
    tables: &[TableName],
) -> Result<Vec<(String, Vec<u32>)>, PostgresError> {
    // Schemas in a publication (FOR TABLES IN SCHEMA) came with 15;
    // pg_partition_ancestors gives nothing for a table that is not partitioned.
    let schemas = if options.server_version >= 150_000 {
        " UNION ALL SELECT n.oid FROM pg_publication_namespace n \
         JOIN pg_class c ON c.relnamespace = n.pnnspid \
         WHERE n.pnpubid = $1 AND c.oid IN (SELECT * FROM rels)"
    } else {
        ""
    };
    let sql = format!(
        "SELECT t, ARRAY(WITH rels AS (SELECT to_regclass(t) UNION \
         SELECT relid FROM pg_partition_ancestors(to_regclass(t))) \
         SELECT r.oid FROM pg_publication_rel r WHERE r.prpubid = $1 \
         AND r.prrelid IN (SELECT * FROM rels){schemas} ORDER BY 1) FROM unnest($2::text[]) AS t"
    );
    let quoted: Vec<String> = tables.iter().map(TableName::quoted).collect();
    let failed = query_err("list the catalog rows that publish the outbox tables");
    let rows = client
        .query(&sql, &[&options.oid, &quoted])
        .await
        .map_err(&failed)?;
    let mut members = Vec::new();
    for row in &rows {
        members.push((
            row.try_get(0).map_err(&failed)?,
            row.try_get(1).map_err(&failed)?,
        ));
    }
    Ok(members)
}

/// How the publication publishes one outbox table itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnRow {
    /// The table, quoted.
    pub table: String,
    /// The OID of the catalog row that publishes the table itself, if one does.
    pub oid: Option<u32>,
    /// That row's filter (PostgreSQL 15+), as `pg_get_expr` prints it.
    pub filter: Option<String>,
}

/// For each of `tables`, in order, the catalog row that publishes it itself, with its filter.
pub async fn own_rows(
    client: &Client,
    publication: u32,
    tables: &[TableName],
) -> Result<Vec<OwnRow>, PostgresError> {
    let quoted: Vec<String> = tables.iter().map(TableName::quoted).collect();
    let failed = query_err("read the publication's row filters");
    let rows = client
        .query(
            "SELECT t, r.oid, pg_get_expr(r.prqual, r.prrelid) FROM unnest($2::text[]) t \
             LEFT JOIN pg_publication_rel r ON r.prpubid = $1 AND r.prrelid = to_regclass(t)",
            &[&publication, &quoted],
        )
        .await
        .map_err(&failed)?;
    let mut own = Vec::new();
    for row in &rows {
        own.push(OwnRow {
            table: row.try_get(0).map_err(&failed)?,
            oid: row.try_get(1).map_err(&failed)?,
            filter: row.try_get(2).map_err(&failed)?,
        });
    }
    Ok(own)
}

/// `status`'s view of the publication, a JSON object: `name`, and when it exists `exists`,
/// `all_tables`, `publishes`, `tables` (`schema.table`) and `row_filters`.
pub async fn report<T: DeserializeOwned>(client: &Client, name: &str) -> Result<T, PostgresError> {
    // Row filters (PostgreSQL 15+) read through to_jsonb, which older servers' rows lack.
    let failed = query_err("read the publication");
    let row = client
        .query_one(
            "SELECT jsonb_build_object('name', $1::text) || coalesce((SELECT jsonb_build_object( \
               'exists', true, 'all_tables', puballtables, \
               'publishes', array_remove(ARRAY[CASE WHEN pubinsert THEN 'insert' END, \
                                               CASE WHEN pubupdate THEN 'update' END, \
                                               CASE WHEN pubdelete THEN 'delete' END, \
                                               CASE WHEN pubtruncate THEN 'truncate' END], NULL), \
               'tables', ARRAY(SELECT schemaname::text || '.' || tablename::text \
                               FROM pg_publication_tables t WHERE t.pubname = p.pubname \
                               ORDER BY 1), \
               'row_filters', coalesce((SELECT jsonb_object_agg(schemaname::text || '.' || \
                                                                tablename::text, to_jsonb(t) -> 'rowfilter') \
                                        FROM pg_publication_tables t WHERE t.pubname = p.pubname \
                                          AND to_jsonb(t) ->> 'rowfilter' IS NOT NULL), '{}')) \
             FROM pg_publication p WHERE pubname = $1), '{}')",
            &[&name],
        )
        .await
        .map_err(&failed)?;
    let Json(report) = row.try_get(0).map_err(&failed)?;
    Ok(report)
}
