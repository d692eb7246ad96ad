//! `--cleanup delete`: relayed outbox rows are deleted, in batches, before the slot moves past
//! them. A row waits under its transaction's end LSN until the ack frontier covers it, so an
//! unacknowledged row is never deleted, and a crash replays only rows whose deletes are no-ops;
//! a failed delete holds the frontier back and is retried.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_postgres::Client;

use crate::config::Config;
use crate::lsn::Lsn;
use crate::observability::Chain;
use crate::outbox::{BindError, TableName, column_index, quote_ident};
use crate::pgoutput::{Relation, TupleData, Value};
use crate::source::setup::query_err;
use crate::source::{SourceError, control};

/// Rows per DELETE statement, and the backlog that triggers a delete at once.
const BATCH: usize = 1000;
/// Wait before retrying a failed delete.
const RETRY: Duration = Duration::from_secs(1);

/// One outbox table's primary key columns and DELETE statement.
struct Table {
    name: String,
    columns: Vec<String>,
    sql: String,
}

/// A row to delete: its table and its primary key as a JSON object of text values.
type Row = (Arc<Table>, String);

/// The rows of relayed transactions, and the connection that deletes them.
pub struct Cleanup {
    config: Config,
    client: Option<Client>,
    tables: Vec<Arc<Table>>,
    /// Relation id → its table and the key columns' positions in its tuples.
    bound: HashMap<u32, (Arc<Table>, Vec<usize>)>,
    /// The open transaction's rows.
    open: Vec<Row>,
    /// Committed rows with their transaction's end LSN, in commit order.
    done: VecDeque<(Lsn, Row)>,
    /// Every row of a transaction ending at or before this is deleted.
    cleared: Lsn,
    /// When the waiting rows must be deleted even if few.
    due: Option<Instant>,
}

/// One statement for any key shape: the keys arrive as one JSON array of objects, whose text
/// values the table's own row type converts.
fn delete_sql(table: &TableName, columns: &[String]) -> String {
    let table = table.quoted();
    let columns: Vec<String> = columns.iter().map(|c| quote_ident(c)).collect();
    let columns = columns.join(", ");
    format!(
        "DELETE FROM {table} WHERE ({columns}) IN \
         (SELECT {columns} FROM jsonb_populate_recordset(NULL::{table}, $1::text::jsonb))"
    )
}

impl Cleanup {
    /// Refuses unless every outbox table has a primary key the role may DELETE by and the
    /// publication does not publish deletes; `client` is reopened if it breaks.
    pub async fn new(client: Client, config: &Config, confirmed: Lsn) -> Result<Self, SourceError> {
        let refused = |problem| {
            let message = format!("--cleanup delete: {problem}, or use --cleanup none");
            Err(SourceError::Misconfigured(message))
        };
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
            let columns: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
            let sql = delete_sql(table, &columns);
            let name = table.to_string();
            tables.push(Arc::new(Table { name, columns, sql }));
        }
        Ok(Cleanup {
            config: config.clone(),
            client: Some(client),
            tables,
            bound: HashMap::new(),
            open: Vec::new(),
            done: VecDeque::new(),
            cleared: confirmed,
            due: None,
        })
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

    /// An inserted outbox row of the open transaction.
    pub fn row(&mut self, relation_id: u32, tuple: &TupleData) {
        let Some((table, positions)) = self.bound.get(&relation_id) else {
            return;
        };
        let key = table
            .columns
            .iter()
            .zip(positions)
            .map(|(column, &i)| match tuple.0.get(i) {
                Some(Value::Text(b)) => Some((column.clone(), String::from_utf8_lossy(b).into())),
                _ => None,
            });
        if let Some(key) = key.collect::<Option<serde_json::Map<_, _>>>() {
            let key = serde_json::Value::Object(key).to_string();
            self.open.push((Arc::clone(table), key));
        }
    }

    /// The open transaction committed, ending at `end_lsn`.
    pub fn commit(&mut self, end_lsn: Lsn) {
        if !self.open.is_empty() {
            let due = Instant::now() + self.config.flags.status_interval;
            self.due.get_or_insert(due);
        }
        let rows = self.open.drain(..).map(|row| (end_lsn, row));
        self.done.extend(rows);
    }

    /// The open transaction will be replayed from its start.
    pub fn abandon_open(&mut self) {
        self.open.clear();
    }

    /// When rows that `frontier` covers must be deleted, if any wait (rows in flight wait for
    /// their acks, not for a timer).
    pub fn due(&self, frontier: Lsn) -> Option<Instant> {
        let front = self.done.front();
        front.filter(|(end, _)| *end <= frontier).and(self.due)
    }

    /// The highest position that may be reported: every row it covers is deleted.
    pub fn cleared(&self) -> Lsn {
        self.cleared
    }

    /// Deletes the rows `frontier` covers (now when `force`, else when a batch is full or due),
    /// moving [`Self::cleared`].
    pub async fn clear(&mut self, frontier: Lsn, force: bool) {
        let covered = self.done.iter().take_while(|(end, _)| *end <= frontier);
        let rows = covered.count();
        let (now, interval) = (Instant::now(), self.config.flags.status_interval);
        if rows == 0 {
            self.cleared = self.cleared.max(frontier);
            return;
        }
        if !force && rows < BATCH && self.due.is_some_and(|due| now < due) {
            return;
        }
        match self.delete(rows).await {
            Ok(deleted) => {
                let total = crate::observability::metrics::CLEANUP_DELETED_ROWS_TOTAL;
                metrics::counter!(total).increment(deleted);
                self.done.drain(..rows);
                self.cleared = self.cleared.max(frontier);
                self.due = (!self.done.is_empty()).then(|| now + interval);
            }
            Err(error) => {
                tracing::warn!(
                    error = %Chain(&error),
                    frontier = %self.cleared,
                    rows,
                    "--cleanup delete: cannot delete relayed rows; the slot is not moved past \
                     them until a retry succeeds"
                );
                self.client = None;
                self.due = Some(now + RETRY.max(interval));
            }
        }
    }

    /// Deletes the first `rows` waiting rows; returns how many went.
    async fn delete(&mut self, rows: usize) -> Result<u64, SourceError> {
        let client = control(&mut self.client, &self.config).await?;
        let mut by_table: HashMap<&str, (&Table, Vec<&str>)> = HashMap::new();
        for (_, (table, key)) in self.done.iter().take(rows) {
            let entry = by_table.entry(&table.name);
            entry.or_insert_with(|| (table, Vec::new())).1.push(key);
        }
        let mut deleted = 0;
        for (table, keys) in by_table.into_values() {
            for chunk in keys.chunks(BATCH) {
                let keys = format!("[{}]", chunk.join(","));
                let result = client.execute(&table.sql, &[&keys]).await;
                deleted += result.map_err(|source| SourceError::Query {
                    what: format!("delete relayed rows from {}", table.name),
                    source: source.into(),
                })?;
            }
        }
        Ok(deleted)
    }
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
        assert_eq!(
            delete_sql(&table, &["id".into(), "created_on".into()]),
            "DELETE FROM \"public\".\"outbox\" WHERE (\"id\", \"created_on\") IN \
             (SELECT \"id\", \"created_on\" FROM \
             jsonb_populate_recordset(NULL::\"public\".\"outbox\", $1::text::jsonb))"
        );
    }
}
