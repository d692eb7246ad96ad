//! `--cleanup delete`, the Postgres side: each outbox table's primary key (start-up checked
//! it) and how a row's key is read from its insert, and the [`Deleter`] that deletes relayed
//! rows.
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

use crate::outbox::{BindError, TableName, column_index};
use crate::pgoutput::{Relation, TupleData, Value};
use crate::postgres::{Connector, PostgresError, query_err, sql};
use crate::source::SourceError;

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
        let sql = sql::delete_rows(table, &columns);
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

impl Cleanup {
    /// The outbox tables with their primary key columns (start-up checked that the role may
    /// delete by them), deleted from on a connection of their own to the primary.
    pub fn new(primary_keys: &[(TableName, Vec<String>)], connector: &Connector) -> Self {
        let tables = primary_keys
            .iter()
            .map(|(table, key)| Table::new(table, key.clone()));
        let deleter = PgDeleter {
            client: None,
            connector: connector.primary(),
        };
        Cleanup::with(tables.collect(), Box::new(deleter))
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

/// Deletes on a control connection of its own, opened when first needed and reopened after
/// any error.
struct PgDeleter {
    client: Option<Client>,
    connector: Connector,
}

/// `client` with the delete session's limits.
async fn limited(client: Client) -> Result<Client, PostgresError> {
    let timeouts = client.batch_execute(sql::DELETE_SESSION).await;
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
                _ => limited(self.connector.control().await?).await?,
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
    let SourceError::Postgres(
        PostgresError::Query { source, .. } | PostgresError::Connect { source, .. },
    ) = error
    else {
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
    fn retries_back_off_to_thirty_seconds() {
        let waits: Vec<u64> = (0..8).map(|n| retry_after(n).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 30, 30, 30]);
    }
}
