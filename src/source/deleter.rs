//! `--cleanup delete`, the Postgres side: [`PgDeleter`], the [`Deleter`] that deletes relayed
//! rows by their primary key. Which rows may go, and when, is the pipeline's
//! ([`crate::pipeline::cleanup`]).
//!
//! A delete never waits for a row another session holds: the DELETE takes its rows `FOR UPDATE
//! SKIP LOCKED` and reports those it left in place, to be tried again later; `lock_timeout` and
//! `statement_timeout` bound what else it could wait for (a table lock, a slow server).

use std::collections::HashMap;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use tokio_postgres::Client;

use crate::pipeline::cleanup::{DeleteFailure, Deleter, Table};
use crate::postgres::{Connector, PostgresError, query_err, sql};
use crate::source::SourceError;

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
