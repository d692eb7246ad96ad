//! `outbox-relay backfill --since TIMESTAMP`: re-publishes outbox rows still
//! in the tables through the relay's own mapping, and exits once the broker
//! acknowledged every record: the remedy after a lost slot, and how a new
//! deployment publishes rows older than its slot. Rows have no WAL position,
//! so `--delivery exactly-once` skips the event ids already in each topic. Rows
//! stream from the server as the in-flight cap lets them through; one that cannot
//! be delivered is dead-lettered or stops the backfill, as `--on-poison` says.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use bytes::Bytes;
use futures_util::{TryStreamExt, pin_mut};
use rdkafka::types::RDKafkaErrorCode::UnknownTopicOrPartition;
use tokio::sync::mpsc;
use tokio_postgres::{Client, RowStream};

use super::{CommandError, execute};
use crate::config::{BackfillArgs, Config, Delivery};
use crate::lsn::Lsn;
use crate::outbox::{
    DeadLetterInfo, OutboxRecord, RawParts, TableMapping, TableName, dead_letter_record,
};
use crate::pgoutput::{Relation, TupleData, Value};
use crate::postgres::catalog::{self, tables};
use crate::postgres::sql::SESSION_FORMATS;
use crate::postgres::{Connector, query_err};
use crate::sink::exactly_once::{TailError, TailReader};
use crate::sink::{self, Blame, KafkaSink, Refusal, Sink, SinkError, Ticket};
use crate::startup::{StartupError, checks};

/// How far before `--since` a topic is read back: Kafka timestamps are commit
/// times, `--column` any time the application sets, and clocks differ.
const SINCE_MARGIN_MS: i64 = 60 * 60 * 1000;

/// `--delivery exactly-once`: the event ids already in each topic, read once per topic.
struct Delivered {
    reader: TailReader,
    since_ms: i64,
    ids: HashMap<String, HashSet<Vec<u8>>>,
}

impl Delivered {
    async fn new(config: &Config, client: &Client, since: &str) -> Result<Self, CommandError> {
        let since_ms = catalog::unix_millis(client, since).await?;
        let reader = TailReader::new(&super::kafka(config))?;
        Ok(Delivered {
            reader,
            since_ms: since_ms.saturating_sub(SINCE_MARGIN_MS),
            ids: HashMap::new(),
        })
    }

    /// Whether the event `id` is already in `topic`.
    async fn contains(
        &mut self,
        sink: &KafkaSink,
        topic: &str,
        id: &[u8],
    ) -> Result<bool, CommandError> {
        if !self.ids.contains_key(topic) {
            let since = self.since_ms;
            let ids = match sink.fetch_partition_count(topic).await {
                Ok(partitions) => self.reader.event_ids_since(topic, partitions, since)?,
                // Not created yet: nothing was delivered to it.
                Err(e) if e.rdkafka_error_code() == Some(UnknownTopicOrPartition) => HashSet::new(),
                Err(e) => {
                    let reason = format!("cannot read the topic's partition count: {e}");
                    return Err(TailError::read(topic, -1, &reason).into());
                }
            };
            let events = ids.len();
            tracing::info!(topic, events, "read the events already in the topic");
            self.ids.insert(topic.to_owned(), ids);
        }
        Ok(self.ids[topic].contains(id))
    }
}

pub(super) async fn run(config: &Config, args: &BackfillArgs) -> Result<(), CommandError> {
    let client = Connector::new(config.postgres.clone()).control().await?;
    // Rows read as text in pgoutput's session formats bind like streamed inserts.
    execute(&client, SESSION_FORMATS, "set the session's formats").await?;
    let in_flight = config.flags.max_in_flight_events;
    let (sink, deliveries) = KafkaSink::new(&super::kafka(config), in_flight, None, None)?;
    let exactly_once = match config.flags.delivery {
        Delivery::ExactlyOnce => Some(Delivered::new(config, &client, &args.since).await?),
        Delivery::AtLeastOnce => None,
    };
    let mut run = Run {
        config,
        sink,
        deliveries,
        exactly_once,
        table: String::new(),
        sent: 0,
        acked: 0,
        skipped: 0,
        dead_lettered: 0,
    };
    for table in &config.tables {
        let mapping = bind(&client, config, table, &args.column).await?;
        let rows = tables::rows_since(
            &client,
            table,
            mapping.relation(),
            &args.column,
            &args.since,
        );
        run.table = table.to_string();
        run.relay(rows.await?, &mapping.mapping).await?;
        // A failure names the table it came from.
        run.drain(0).await?;
    }
    println!("{}", run.summary(args));
    Ok(())
}

/// An outbox table with its columns, bound to its mapping.
struct Bound {
    relation: Relation,
    mapping: TableMapping,
}

impl Bound {
    fn relation(&self) -> &Relation {
        &self.relation
    }
}

/// `table` bound to its mapping; refused when it does not exist, does not fit the mapping, or
/// lacks `--column`.
async fn bind(
    client: &Client,
    config: &Config,
    table: &TableName,
    column: &str,
) -> Result<Bound, CommandError> {
    let Some(relation) = tables::relation(client, table).await? else {
        return Err(StartupError::from(checks::table_missing(table)).into());
    };
    let facts = tables::column_facts(client, &table.quoted()).await?;
    let mapping = TableMapping::bind_with(config.mapping_for(table), &relation, &facts)
        .map_err(|e| CommandError::Refused(e.to_string()))?;
    if !relation.columns.iter().any(|c| c.name == column) {
        return Err(CommandError::Refused(no_such_column(column, table)));
    }
    Ok(Bound { relation, mapping })
}

/// The refusal of a `--column` the table lacks.
fn no_such_column(column: &str, table: &TableName) -> String {
    format!("--column {column:?}: {table} has no such column")
}

/// The records in flight and what became of them.
struct Run<'a> {
    config: &'a Config,
    sink: KafkaSink,
    deliveries: mpsc::UnboundedReceiver<sink::Delivery>,
    /// `--delivery exactly-once`: the events already in each topic.
    exactly_once: Option<Delivered>,
    /// The table being read, for dead letters and errors.
    table: String,
    sent: u64,
    acked: u64,
    /// Already in Kafka, under `--delivery exactly-once`.
    skipped: u64,
    dead_lettered: u64,
}

impl Run<'_> {
    /// Sends the events of `rows` (the table's columns as text, in order), streamed: the
    /// connection reads on only as rows are taken.
    async fn relay(&mut self, rows: RowStream, mapping: &TableMapping) -> Result<(), CommandError> {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let shard = self.config.flags.shard;
        let failed = query_err("read the outbox rows");
        pin_mut!(rows);
        while let Some(row) = rows.try_next().await.map_err(&failed)? {
            let mut values = Vec::new();
            for i in 0..row.len() {
                let text: Option<String> = row.try_get(i).map_err(&failed)?;
                values.push(text.map_or(Value::Null, |text| Value::Text(Bytes::from(text))));
            }
            let mapped = mapping.map(&TupleData(values), now_ms);
            // A shard re-publishes the rows its publication's filter would have sent it.
            if shard.is_some_and(|shard| !shard.owns_event(&mapped)) {
                continue;
            }
            let record = match mapped {
                Ok(Some(record)) => record,
                // Dropped by a Kafka Connect Filter, as the relay drops it.
                Ok(None) => continue,
                Err((e, parts)) => {
                    let error = e.to_string();
                    self.poison(None, parts, Vec::new(), now_ms, error, None)
                        .await?;
                    continue;
                }
            };
            if let Some(delivered) = self.exactly_once.as_mut()
                && delivered
                    .contains(&self.sink, &record.topic, &record.id)
                    .await?
            {
                self.skipped += 1;
                continue;
            }
            self.send(&record).await?;
        }
        Ok(())
    }

    /// What the backfill did, for its last line.
    fn summary(&self, args: &BackfillArgs) -> String {
        let skipped = match self.exactly_once {
            Some(_) => format!(" ({} already in Kafka skipped)", self.skipped),
            None => String::new(),
        };
        let dead = match (self.dead_lettered, &self.config.dead_letter_topic) {
            (0, _) | (_, None) => String::new(),
            (n, Some(topic)) => format!("; {n} dead-lettered to {topic:?}"),
        };
        let column = &args.column;
        let since = &args.since;
        format!(
            "backfill: {} events with {column} >= {since} re-published and acknowledged by the \
             broker{skipped}{dead}",
            self.acked - self.dead_lettered
        )
    }

    /// Sends `record`, then waits while the in-flight cap is reached.
    async fn send(&mut self, record: &OutboxRecord) -> Result<(), CommandError> {
        let ticket = Ticket(self.sent);
        self.sent += 1;
        match self.sink.send(ticket, record).await {
            Ok(()) => {}
            Err(SinkError::Enqueue { source, .. }) if source.blame != Blame::Fatal => {
                self.refused(ticket, record.clone(), source).await?;
            }
            Err(e) => return Err(e.into()),
        }
        let cap = self.config.flags.max_in_flight_events as u64;
        self.drain(cap.saturating_sub(1)).await
    }

    /// Takes delivery reports until at most `left` records are in flight.
    async fn drain(&mut self, left: u64) -> Result<(), CommandError> {
        while self.sent - self.acked > left {
            let Some(delivery) = self.deliveries.recv().await else {
                let reason = "the producer stopped reporting deliveries".to_owned();
                return Err(CommandError::Refused(reason));
            };
            match delivery.outcome {
                Ok(()) => self.acked += 1,
                Err(f) => self.refused(delivery.ticket, f.record, f.refusal).await?,
            }
        }
        Ok(())
    }

    /// A record Kafka refused: sent again alone when its batch was judged, poison when the
    /// record is at fault (and not a dead letter itself), else the end of the backfill.
    async fn refused(
        &mut self,
        ticket: Ticket,
        record: OutboxRecord,
        mut refusal: Refusal,
    ) -> Result<(), CommandError> {
        if refusal.blame == Blame::Batch {
            match self.sink.send_alone(ticket, &record).await {
                Err(SinkError::Enqueue { source, .. }) => refusal = source,
                sent => return Ok(sent?),
            }
        }
        let too_large = match refusal.blame {
            Blame::Record { too_large }
                if self.config.dead_letter_topic.as_ref() != Some(&record.topic) =>
            {
                too_large
            }
            _ => {
                return Err(CommandError::Refused(format!(
                    "delivery of event id {} to topic {:?} failed: {}; rerun the backfill (it \
                     is at-least-once)",
                    record.id_text(),
                    record.topic,
                    refusal.source
                )));
            }
        };
        let size = record.payload.as_ref().map_or(0, Bytes::len);
        let omitted = too_large.then(|| {
            format!("payload of {size} bytes is the reason: larger than message.max.bytes")
        });
        let parts = RawParts {
            id: record.id,
            key: record.key,
            payload: record.payload,
            intended_topic: Some(record.topic),
        };
        let error = refusal.source.to_string();
        let at = record.timestamp_ms;
        self.poison(Some(ticket), parts, record.headers, at, error, omitted)
            .await
    }

    /// A row that cannot be delivered: dead-lettered (as `ticket`, when it was sent) under
    /// `--on-poison dead-letter`, else the end of the backfill.
    async fn poison(
        &mut self,
        ticket: Option<Ticket>,
        parts: RawParts,
        headers: Vec<(Arc<str>, Option<Bytes>)>,
        timestamp_ms: i64,
        error: String,
        payload_omitted: Option<String>,
    ) -> Result<(), CommandError> {
        let info = DeadLetterInfo {
            error,
            // Rows have no WAL position.
            lsn: Lsn::ZERO,
            table: self.table.clone(),
            intended_topic: parts.intended_topic.clone(),
            payload_omitted,
        };
        let Some(topic) = &self.config.dead_letter_topic else {
            let id = String::from_utf8_lossy(&parts.id).into_owned();
            return Err(CommandError::Poison { id, info });
        };
        let record = dead_letter_record(topic, parts, headers, &info, timestamp_ms);
        let ticket = ticket.unwrap_or_else(|| {
            self.sent += 1;
            Ticket(self.sent - 1)
        });
        self.dead_lettered += 1;
        Ok(self.sink.send(ticket, &record).await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_column_is_refused_naming_the_flag_and_the_table() {
        let table = TableName::parse("public.outbox").unwrap();
        assert_eq!(
            no_such_column("made_at", &table),
            "--column \"made_at\": public.outbox has no such column"
        );
    }
}
