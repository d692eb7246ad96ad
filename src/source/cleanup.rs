//! `--cleanup delete`, the Postgres side: the start-up checks, each outbox table's primary key
//! and how a row's key is read from its insert, and the [`Deleter`] that deletes relayed rows.
//! Which rows may go, and when, is the pipeline's (`pipeline/cleanup.rs`).
//!
//! A delete never waits for a row another session holds: the DELETE takes its rows `FOR UPDATE
//! SKIP LOCKED` and reports those it left in place, to be tried again later; `lock_timeout` and
//! `statement_timeout` bound what else it could wait for (a table lock, a slow server).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use tokio_postgres::Client;

use crate::config::{Config, TargetSessionAttrs};
use crate::outbox::{BindError, TableName, column_index, quote_ident};
use crate::pgoutput::{Relation, TupleData, Value};
use crate::source::SourceError;
use crate::source::setup::{self, query_err};

/// The delete connection's limits: a DELETE never waits long for a lock (rows another session
/// holds are skipped anyway) nor runs long; either is retried later.
const SESSION: &str = "SET lock_timeout = '2s'; SET statement_timeout = '30s'";

/// One outbox table: its name, primary key columns and DELETE statement.
#[derive(Debug)]
pub struct Table {
    name: String,
    columns: Vec<String>,
    sql: String,
}

impl Table {
    /// `table` deleted from by its primary key `columns`.
    pub fn new(table: &TableName, columns: Vec<String>) -> Self {
        let sql = delete_sql(table, &columns);
        Table {
            name: table.to_string(),
            columns,
            sql,
        }
    }

    /// `schema.name`.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// A row to delete: its table and its primary key as a JSON object of text values.
pub type Row = (Arc<Table>, String);

/// Deletes the rows it is given unless another session holds them.
pub trait Deleter: Send {
    /// Deletes the rows of `table` whose keys are `keys`, skipping those another session holds;
    /// returns the positions in `keys` of the rows it left in place (they still exist).
    fn delete<'a>(
        &'a mut self,
        table: &'a Table,
        keys: &'a [&'a str],
    ) -> BoxFuture<'a, Result<Vec<usize>, DeleteFailure>>;
}

/// A delete that failed, classified where the error is known (as the sink classifies a refusal).
#[derive(Debug, thiserror::Error)]
#[error("table {table}")]
pub struct DeleteFailure {
    /// The table, as `schema.name`.
    pub table: String,
    /// Retrying cannot help: a privilege, a trigger or a foreign key refuses, the table is gone.
    pub permanent: bool,
    /// What Postgres said.
    #[source]
    pub source: SourceError,
}

/// The outbox tables' keys, and the deleter: what `--cleanup delete` hands the pipeline.
pub struct Cleanup {
    tables: Vec<Arc<Table>>,
    /// Relation id → its table and the key columns' positions in its tuples.
    bound: HashMap<u32, (Arc<Table>, Vec<usize>)>,
    /// Taken while a batch is being deleted.
    pub deleter: Option<Box<dyn Deleter>>,
}

/// The statement for any key shape: the keys arrive as one JSON array of objects, whose text
/// values the table's own row type converts. It deletes the rows no other session holds and
/// returns the (1-based) positions of those that still exist, held by another session.
fn delete_sql(table: &TableName, columns: &[String]) -> String {
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

impl Cleanup {
    /// Refuses unless the server is a primary, every outbox table has a primary key the role may
    /// DELETE by and the publication (if it exists yet) does not publish deletes.
    pub async fn new(client: Client, config: &Config) -> Result<Self, SourceError> {
        let refused = |problem| {
            let message = format!("--cleanup delete: {problem}, or use --cleanup none");
            Err(SourceError::Misconfigured(message))
        };
        let row = client
            .query_one("SELECT pg_is_in_recovery()", &[])
            .await
            .map_err(query_err("probe the server's role"))?;
        if row.get::<_, bool>(0) {
            return refused(format!(
                "the server at {} is a standby (in recovery), where rows cannot be deleted; \
                 point --postgres-url at the primary (or add target_session_attrs=read-write)",
                config.postgres.redacted()
            ));
        }
        let publication = &config.flags.publication;
        let row = client
            .query_opt(
                "SELECT pubdelete FROM pg_publication WHERE pubname = $1",
                &[publication],
            )
            .await
            .map_err(query_err("look up the publication"))?;
        if row.is_some_and(|r| r.get::<_, bool>(0)) {
            return refused(format!(
                "publication {publication:?} publishes deletes, so every row the relay deletes \
                 would come back through the slot; run ALTER PUBLICATION {} SET (publish = \
                 'insert')",
                quote_ident(publication)
            ));
        }
        let mut tables = Vec::new();
        for table in &config.tables {
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
                .map_err(query_err("read the outbox table's primary key"))?;
            if rows.is_empty() {
                return refused(format!(
                    "table {table} has no primary key, so relayed rows cannot be deleted one by \
                     one; add one (ALTER TABLE {table} ADD PRIMARY KEY (id))"
                ));
            }
            if !rows.iter().all(|r| r.get::<_, bool>(1)) {
                let user = &config.postgres.user;
                return refused(format!(
                    "role {user:?} may not DELETE from {table}; run GRANT DELETE ON {table} TO \
                     {user}"
                ));
            }
            tables.push(Table::new(table, rows.iter().map(|r| r.get(0)).collect()));
        }
        let mut config = config.clone();
        // On a reconnect after a failover, the deletes go to the new primary.
        if config.postgres.hosts.len() > 1 {
            config.postgres.target_session_attrs = TargetSessionAttrs::ReadWrite;
        }
        let deleter = PgDeleter {
            client: Some(limited(client).await?),
            config,
        };
        Ok(Cleanup::with(tables, Box::new(deleter)))
    }

    /// `tables` deleted from by `deleter`.
    pub fn with(tables: Vec<Table>, deleter: Box<dyn Deleter>) -> Self {
        Cleanup {
            tables: tables.into_iter().map(Arc::new).collect(),
            bound: HashMap::new(),
            deleter: Some(deleter),
        }
    }

    /// A Relation message: where an outbox table's (or its partition's) key columns are; rows of a
    /// partition are deleted through its `root`.
    pub fn relation(
        &mut self,
        relation: &Relation,
        root: Option<&TableName>,
    ) -> Result<(), BindError> {
        let name = match root {
            Some(root) => root.to_string(),
            None => format!("{}.{}", relation.namespace, relation.name),
        };
        let Some(table) = self.tables.iter().find(|t| t.name == name) else {
            self.bound.remove(&relation.id);
            return Ok(());
        };
        let flag = "--cleanup delete (primary key)";
        let positions = (table.columns.iter())
            .map(|column| column_index(relation, &name, flag, column))
            .collect::<Result<_, _>>()?;
        self.bound
            .insert(relation.id, (Arc::clone(table), positions));
        Ok(())
    }

    /// The row an insert into an outbox table wrote (none for other tables).
    pub fn row(&self, relation_id: u32, tuple: &TupleData) -> Option<Row> {
        let (table, positions) = self.bound.get(&relation_id)?;
        let text = |(column, &i): (&String, &usize)| match tuple.0.get(i) {
            Some(Value::Text(b)) => Some((column.clone(), String::from_utf8_lossy(b).into())),
            _ => None,
        };
        let key = table.columns.iter().zip(positions).map(text);
        let key = serde_json::Value::Object(key.collect::<Option<_>>()?);
        Some((Arc::clone(table), key.to_string()))
    }
}

/// Deletes `rows` with `deleter`, one statement per table; returns the positions in `rows` of
/// those left in place.
pub async fn delete(
    deleter: &mut dyn Deleter,
    rows: &[(u64, Row)],
) -> Result<Vec<usize>, DeleteFailure> {
    let mut by_table: HashMap<&str, (&Table, Vec<usize>)> = HashMap::new();
    for (n, (_, (table, _))) in rows.iter().enumerate() {
        by_table
            .entry(&table.name)
            .or_insert((table, Vec::new()))
            .1
            .push(n);
    }
    let mut held = Vec::new();
    for (table, positions) in by_table.into_values() {
        let keys: Vec<&str> = positions.iter().map(|&n| rows[n].1.1.as_str()).collect();
        let left = deleter.delete(table, &keys).await?;
        held.extend(left.into_iter().filter_map(|i| positions.get(i).copied()));
    }
    Ok(held)
}

/// Deletes on a control connection of its own, reopened after any error.
struct PgDeleter {
    client: Option<Client>,
    config: Config,
}

/// `client` with the delete session's limits.
async fn limited(client: Client) -> Result<Client, SourceError> {
    let timeouts = client.batch_execute(SESSION).await;
    timeouts.map_err(query_err("set the delete session's timeouts"))?;
    Ok(client)
}

impl Deleter for PgDeleter {
    fn delete<'a>(
        &'a mut self,
        table: &'a Table,
        keys: &'a [&'a str],
    ) -> BoxFuture<'a, Result<Vec<usize>, DeleteFailure>> {
        async move {
            let client = match self.client.take() {
                Some(client) if !client.is_closed() => client,
                _ => limited(setup::connect(&self.config).await?).await?,
            };
            let keys = format!("[{}]", keys.join(","));
            let rows = client.query(&table.sql, &[&keys]).await;
            let rows = rows.map_err(query_err("delete relayed rows"))?;
            self.client = Some(client);
            let held = rows.iter().map(|r| r.get::<_, i64>(0));
            Ok::<_, SourceError>(held.filter_map(|n| usize::try_from(n - 1).ok()).collect())
        }
        .map(|deleted| {
            deleted.map_err(|source| DeleteFailure {
                table: table.name.clone(),
                permanent: permanent(&source),
                source,
            })
        })
        .boxed()
    }
}

/// Whether retrying cannot help: the server refused for a reason of the statement, the table,
/// the role or the data (SQLSTATE classes other than connection, transaction rollback,
/// resources, locks and timeouts, operator intervention, read-only after a failover).
fn permanent(error: &SourceError) -> bool {
    let (SourceError::Query { source, .. } | SourceError::Connect { source, .. }) = error else {
        return false;
    };
    let Some(db) = source.0.as_db_error() else {
        return false;
    };
    let class = db.code().code().get(..2).unwrap_or_default();
    !matches!(class, "08" | "25" | "40" | "53" | "55" | "57" | "58")
}

/// How long a held or failed row waits before it is tried again: a second, doubling after
/// each failed delete in a row, up to 30 s.
pub fn retry_after(failures: u32) -> Duration {
    Duration::from_secs(1 << failures.min(5)).min(Duration::from_secs(30))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_statement_shape_for_any_key() {
        let table = TableName {
            schema: "public".into(),
            name: "outbox".into(),
        };
        let sql = delete_sql(&table, &["id".into(), "created_on".into()]);
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

    #[test]
    fn retries_back_off_to_thirty_seconds() {
        let waits: Vec<u64> = (0..8).map(|n| retry_after(n).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 30, 30, 30]);
    }
}
