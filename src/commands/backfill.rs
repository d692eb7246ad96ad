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
use tokio_postgres::Client;

use super::{CommandError, execute};
use crate::config::{BackfillArgs, Config, Delivery};
use crate::lsn::Lsn;
use crate::outbox::{
    DeadLetterInfo, OutboxRecord, RawParts, TableMapping, dead_letter_record, quote_ident,
};
use crate::pgoutput::{TupleData, Value};
use crate::sink::exactly_once::{TailError, TailReader};
use crate::sink::{self, Blame, KafkaSink, Refusal, Sink, SinkError, Ticket};
use crate::source::SESSION_FORMATS;
use crate::source::setup::{self, query_err};

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
        let since_ms: i64 = client
            .query_one(
                "SELECT (extract(epoch FROM $1::text::timestamptz) * 1000)::bigint",
                &[&since],
            )
            .await
            .map_err(query_err("read --since as a time"))?
            .get(0);
        let reader = TailReader::new(&config.kafka_brokers, &config.kafka_properties)?;
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
            let (reader, since) = (&self.reader, self.since_ms);
            let ids = match sink.fetch_partition_count(topic).await {
                Ok(partitions) => reader.event_ids_since(topic, partitions, since)?,
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
    let client = setup::connect(config).await?;
    // Rows read as text in pgoutput's session formats bind like streamed inserts.
    execute(&client, SESSION_FORMATS, "set the session's formats").await?;
    let in_flight = config.flags.max_in_flight_events;
    let (brokers, properties) = (&config.kafka_brokers, &config.kafka_properties);
    let (sink, deliveries) = KafkaSink::new(brokers, properties, in_flight, None, None)?;
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    let mut exactly_once = match config.flags.delivery {
        Delivery::ExactlyOnce => Some(Delivered::new(config, &client, &args.since).await?),
        Delivery::AtLeastOnce => None,
    };
    let mut run = Run {
        config,
        sink,
        deliveries,
        table: String::new(),
        sent: 0,
        acked: 0,
        dead_lettered: 0,
    };
    let (quoted, mut skipped) = (quote_ident(&args.column), 0u64);
    let shard = config.flags.shard;
    for table in &config.tables {
        let relation = setup::relation(&client, table).await?;
        let facts = setup::column_facts(&client, &table.quoted()).await?;
        let mapping = TableMapping::bind_with(config.mapping_for(table), &relation, &facts)
            .map_err(|e| CommandError::Refused(e.to_string()))?;
        if !relation.columns.iter().any(|c| c.name == args.column) {
            return Err(CommandError::Refused(format!(
                "--column {:?}: {table} has no such column",
                args.column
            )));
        }
        let columns = relation.columns.iter();
        let columns: Vec<String> = columns.map(|c| quote_ident(&c.name) + "::text").collect();
        let sql = format!(
            "SELECT {} FROM {} WHERE {quoted} >= $1::text::timestamptz ORDER BY {quoted}",
            columns.join(", "),
            table.quoted(),
        );
        // Streamed: the connection reads on only as rows are taken.
        let failed = query_err("read the outbox rows");
        let rows = client
            .query_raw(&sql, [&args.since])
            .await
            .map_err(&failed)?;
        pin_mut!(rows);
        run.table = table.to_string();
        while let Some(row) = rows.try_next().await.map_err(&failed)? {
            let value = |i| match row.get::<_, Option<String>>(i) {
                Some(text) => Value::Text(Bytes::from(text)),
                None => Value::Null,
            };
            let values = TupleData((0..row.len()).map(value).collect());
            let mapped = mapping.map(&values, now_ms);
            // A shard re-publishes the rows its publication's filter would have sent it.
            if shard.is_some_and(|shard| !shard.owns_event(&mapped)) {
                continue;
            }
            let record = match mapped {
                Ok(Some(record)) => record,
                // Dropped by a Kafka Connect Filter, as the relay drops it.
                Ok(None) => continue,
                Err((e, parts)) => {
                    run.poison(None, parts, Vec::new(), now_ms, e.to_string(), None)
                        .await?;
                    continue;
                }
            };
            if let Some(d) = exactly_once.as_mut()
                && d.contains(&run.sink, &record.topic, &record.id).await?
            {
                skipped += 1;
                continue;
            }
            run.send(&record).await?;
        }
        // A failure names the table it came from.
        run.drain(0).await?;
    }
    let skipped = exactly_once.map(|_| format!(" ({skipped} already in Kafka skipped)"));
    let skipped = skipped.unwrap_or_default();
    let dead = match (run.dead_lettered, &config.dead_letter_topic) {
        (0, _) | (_, None) => String::new(),
        (n, Some(topic)) => format!("; {n} dead-lettered to {topic:?}"),
    };
    let (column, since) = (&args.column, &args.since);
    println!(
        "backfill: {} events with {column} >= {since} re-published and acknowledged by the \
         broker{skipped}{dead}",
        run.acked - run.dead_lettered
    );
    Ok(())
}

/// The records in flight and what became of them.
struct Run<'a> {
    config: &'a Config,
    sink: KafkaSink,
    deliveries: mpsc::UnboundedReceiver<sink::Delivery>,
    /// The table being read, for dead letters and errors.
    table: String,
    sent: u64,
    acked: u64,
    dead_lettered: u64,
}

impl Run<'_> {
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
        let (headers, at, error) = (record.headers, record.timestamp_ms, refusal.source);
        let error = error.to_string();
        self.poison(Some(ticket), parts, headers, at, error, omitted)
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
