//! `--cleanup delete`: relayed outbox rows are deleted before the slot moves past them.
//!
//! Each inserted row's primary key is kept with its transaction; at the commit
//! the keys wait under the transaction's end LSN. Before a frontier F is
//! reported to Postgres, every row of a transaction ending at or before F is
//! deleted by primary key, in batches, on the control connection. Hence:
//! - a row whose event the broker has not acknowledged is never deleted (its
//!   transaction is beyond the frontier);
//! - a crash between the delete and the report replays transactions whose rows
//!   are gone: the events are sent again and the delete is a no-op;
//! - a crash before the delete replays the transaction and deletes its rows then.
//!
//! Deletes are batched: they run once enough rows wait or the oldest waiting
//! rows have waited one status interval, so the slot's confirmed position lags
//! by at most about that. A failed delete holds the frontier and is retried.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_postgres::Client;
use tokio_postgres::types::ToSql;

use crate::config::Config;
use crate::lsn::Lsn;
use crate::outbox::{BindError, column_index, quote_ident};
use crate::pgoutput::{Relation, TupleData, Value};
use crate::source::SourceError;
use crate::source::setup::{self, PrimaryKey};

/// Rows per DELETE statement, and the backlog that triggers a delete at once.
const BATCH: usize = 1000;
/// Wait before retrying a failed delete.
const RETRY: Duration = Duration::from_secs(1);

/// One table's primary key and DELETE statement.
struct Table {
    columns: Vec<String>,
    /// Deletes the rows whose key columns, given as one text array per column, match.
    sql: String,
}

/// A row to delete: its table and primary key values as text.
type Row = (Arc<str>, Vec<String>);

/// The rows of acknowledged-or-pending transactions and the connection that deletes them.
pub struct Cleanup {
    config: Config,
    client: Option<Client>,
    tables: HashMap<String, Table>,
    /// Relation id → table and the key columns' positions in its tuples.
    bound: HashMap<u32, (Arc<str>, Vec<usize>)>,
    open: Vec<Row>,
    done: VecDeque<(Lsn, Vec<Row>)>,
    /// Every row of a transaction ending at or before this is deleted.
    cleared: Lsn,
    /// When the waiting rows must be deleted even if few.
    due: Option<Instant>,
}

/// `DELETE ... WHERE (k1, k2) IN (SELECT u.k1::t1, u.k2::t2 FROM unnest($1::text[], $2::text[]))`:
/// one statement for any key shape, values passed as text and cast server-side.
fn delete_sql(key: &PrimaryKey) -> String {
    let names: Vec<String> = key.columns.iter().map(|(c, _)| quote_ident(c)).collect();
    let casts: Vec<String> = (1..=key.columns.len())
        .zip(&key.columns)
        .map(|(i, (_, ty))| format!("u.c{i}::{ty}"))
        .collect();
    let params: Vec<String> = (1..=key.columns.len())
        .map(|i| format!("${i}::text[]"))
        .collect();
    let aliases: Vec<String> = (1..=key.columns.len()).map(|i| format!("c{i}")).collect();
    format!(
        "DELETE FROM {} WHERE ({}) IN (SELECT {} FROM unnest({}) AS u({}))",
        key.table.quoted(),
        names.join(", "),
        casts.join(", "),
        params.join(", "),
        aliases.join(", ")
    )
}

impl Cleanup {
    /// Deletes through `client` (the control connection, reopened from `config` if it breaks).
    pub fn new(client: Client, keys: Vec<PrimaryKey>, config: &Config, confirmed: Lsn) -> Self {
        let tables = keys
            .iter()
            .map(|key| {
                let table = Table {
                    columns: key.columns.iter().map(|(c, _)| c.clone()).collect(),
                    sql: delete_sql(key),
                };
                (key.table.to_string(), table)
            })
            .collect();
        Cleanup {
            config: config.clone(),
            client: Some(client),
            tables,
            bound: HashMap::new(),
            open: Vec::new(),
            done: VecDeque::new(),
            cleared: confirmed,
            due: None,
        }
    }

    /// A Relation message: for an outbox table (or a partition of one,
    /// `root`), where its key columns are; rows are deleted through the root.
    pub fn relation(
        &mut self,
        relation: &Relation,
        root: Option<&crate::outbox::TableName>,
    ) -> Result<(), BindError> {
        let table = match root {
            Some(root) => root.to_string(),
            None => format!("{}.{}", relation.namespace, relation.name),
        };
        let Some(t) = self.tables.get(&table) else {
            self.bound.remove(&relation.id);
            return Ok(());
        };
        let positions = t
            .columns
            .iter()
            .map(|column| column_index(relation, &table, "--cleanup delete (primary key)", column))
            .collect::<Result<Vec<_>, _>>()?;
        self.bound
            .insert(relation.id, (Arc::from(table.as_str()), positions));
        Ok(())
    }

    /// An inserted outbox row of the open transaction.
    pub fn row(&mut self, relation_id: u32, tuple: &TupleData) {
        let Some((table, positions)) = self.bound.get(&relation_id) else {
            return;
        };
        let key: Option<Vec<String>> = positions
            .iter()
            .map(|&i| match tuple.0.get(i) {
                Some(Value::Text(b)) => Some(String::from_utf8_lossy(b).into_owned()),
                _ => None,
            })
            .collect();
        if let Some(key) = key {
            self.open.push((Arc::clone(table), key));
        }
    }

    /// The open transaction committed, ending at `end_lsn`.
    pub fn commit(&mut self, end_lsn: Lsn, interval: Duration) {
        if self.open.is_empty() {
            return;
        }
        self.done
            .push_back((end_lsn, std::mem::take(&mut self.open)));
        self.due.get_or_insert_with(|| Instant::now() + interval);
    }

    /// The open transaction will be replayed from its start.
    pub fn abandon_open(&mut self) {
        self.open.clear();
    }

    /// When rows that `frontier` covers must be deleted, if any wait (rows
    /// still in flight wait for their acks, not for a timer).
    pub fn due(&self, frontier: Lsn) -> Option<Instant> {
        self.done
            .front()
            .filter(|(end, _)| *end <= frontier)
            .and(self.due)
    }

    /// The highest position that may be reported: the rows of every
    /// transaction it covers are deleted.
    pub fn cleared(&self) -> Lsn {
        self.cleared
    }

    /// Deletes the rows of transactions ending at or before `frontier` (now
    /// when `force`, else when a batch is full or due) and returns what may be reported.
    pub async fn clear(&mut self, frontier: Lsn, force: bool, interval: Duration) -> Lsn {
        let covered = self
            .done
            .iter()
            .take_while(|(end, _)| *end <= frontier)
            .count();
        if covered == 0 {
            self.cleared = self.cleared.max(frontier);
            return self.cleared;
        }
        let rows: usize = self.done.iter().take(covered).map(|(_, r)| r.len()).sum();
        let now = Instant::now();
        if !force && rows < BATCH && self.due.is_some_and(|due| now < due) {
            return self.cleared;
        }
        match self.delete(covered).await {
            Ok(deleted) => {
                crate::observability::metrics::cleanup_deleted(deleted);
                self.done.drain(..covered);
                self.cleared = self.cleared.max(frontier);
                self.due = (!self.done.is_empty()).then(|| now + interval);
            }
            Err(error) => {
                tracing::warn!(
                    error = %error,
                    frontier = %self.cleared,
                    rows,
                    "--cleanup delete: cannot delete relayed rows; the slot is not moved past \
                     them until a retry succeeds"
                );
                self.client = None;
                self.due = Some(now + RETRY.max(interval));
            }
        }
        self.cleared
    }

    /// Deletes the rows of the first `covered` transactions; returns how many rows went.
    async fn delete(&mut self, covered: usize) -> Result<u64, SourceError> {
        if self.client.as_ref().is_none_or(Client::is_closed) {
            self.client = Some(setup::connect(&self.config).await?);
        }
        let Some(client) = self.client.as_ref() else {
            return Ok(0);
        };
        let mut by_table: HashMap<&Arc<str>, Vec<&Vec<String>>> = HashMap::new();
        for (table, key) in self.done.iter().take(covered).flat_map(|(_, rows)| rows) {
            by_table.entry(table).or_default().push(key);
        }
        let mut deleted = 0;
        for (table, keys) in by_table {
            let Some(t) = self.tables.get(&**table) else {
                continue;
            };
            for chunk in keys.chunks(BATCH) {
                let columns: Vec<Vec<&str>> = (0..t.columns.len())
                    .map(|i| {
                        chunk
                            .iter()
                            .filter_map(|k| k.get(i).map(String::as_str))
                            .collect()
                    })
                    .collect();
                let params: Vec<&(dyn ToSql + Sync)> =
                    columns.iter().map(|c| c as &(dyn ToSql + Sync)).collect();
                deleted += client.execute(&t.sql, &params).await.map_err(|source| {
                    SourceError::CleanupDelete {
                        table: table.to_string(),
                        source,
                    }
                })?;
            }
        }
        Ok(deleted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outbox::TableName;

    #[test]
    fn one_statement_shape_for_any_key() {
        let key = PrimaryKey {
            table: TableName {
                schema: "public".into(),
                name: "outbox".into(),
            },
            columns: vec![
                ("id".into(), "uuid".into()),
                ("created_on".into(), "date".into()),
            ],
        };
        assert_eq!(
            delete_sql(&key),
            "DELETE FROM \"public\".\"outbox\" WHERE (\"id\", \"created_on\") IN \
             (SELECT u.c1::uuid, u.c2::date FROM unnest($1::text[], $2::text[]) AS u(c1, c2))"
        );
    }
}
