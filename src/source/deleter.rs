//! `--cleanup delete`, the Postgres side: the delete itself, behind the [`Deleter`] trait (the
//! pipeline's tests and the simulation delete in memory), and [`PgDeleter`], which deletes
//! relayed rows by their primary key. Which rows may go, and when, is the pipeline's
//! (`pipeline::cleanup`).
//!
//! A delete never waits for a row another session holds: the DELETE takes its rows `FOR UPDATE
//! SKIP LOCKED` and reports those it left in place, to be tried again later; `lock_timeout` and
//! `statement_timeout` bound what else it could wait for (a table lock, a slow server).

use std::collections::HashMap;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use tokio_postgres::Client;

use crate::outbox::TableName;
use crate::postgres::{Connector, PostgresError, query_err, sql};
use crate::source::SourceError;

/// One outbox table and its primary key columns.
#[derive(Debug)]
pub struct Table {
    table: TableName,
    name: String,
    columns: Vec<String>,
}

impl Table {
    /// `table` deleted from by its primary key `columns`.
    pub fn new(table: &TableName, columns: Vec<String>) -> Self {
        Table {
            table: table.clone(),
            name: table.to_string(),
            columns,
        }
    }

    /// `schema.name`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The table.
    pub fn table(&self) -> &TableName {
        &self.table
    }

    /// Its primary key columns, in key order.
    pub fn columns(&self) -> &[String] {
        &self.columns
    }
}

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

/// Deletes on a control connection of its own, opened when first needed and reopened after
/// any error.
pub struct PgDeleter {
    client: Option<Client>,
    connector: Connector,
    /// Each table's DELETE statement, by `schema.name`.
    statements: HashMap<String, String>,
}

impl PgDeleter {
    /// Deletes on the server `connector` picks for writes ([`Connector::primary`]).
    pub fn new(connector: &Connector) -> Self {
        PgDeleter {
            client: None,
            connector: connector.primary(),
            statements: HashMap::new(),
        }
    }

    /// Deletes the rows of `table` with the JSON key objects `keys`; returns the 0-based
    /// positions of those left in place.
    async fn delete_keys(
        &mut self,
        table: &Table,
        keys: &[&str],
    ) -> Result<Vec<usize>, SourceError> {
        let client = match self.client.take() {
            Some(client) if !client.is_closed() => client,
            _ => limited(self.connector.control().await?).await?,
        };
        let statement = (self.statements)
            .entry(table.name().to_owned())
            .or_insert_with(|| sql::delete_rows(table.table(), table.columns()));
        let keys = format!("[{}]", keys.join(","));
        let rows = client.query(statement.as_str(), &[&keys]).await;
        let rows = rows.map_err(query_err("delete relayed rows"))?;
        self.client = Some(client);
        let mut held = Vec::new();
        for row in &rows {
            let n: i64 = row.try_get(0).map_err(query_err("delete relayed rows"))?;
            held.extend(usize::try_from(n - 1).ok());
        }
        Ok(held)
    }
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
        self.delete_keys(table, keys)
            .map(|deleted| {
                deleted.map_err(|source| DeleteFailure {
                    table: table.name().to_owned(),
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
