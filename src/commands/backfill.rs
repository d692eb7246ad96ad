//! `outbox-relay backfill --since TIMESTAMP`: re-publishes outbox rows still
//! in the tables through the relay's own mapping, and exits once the broker
//! acknowledged every record: the remedy after a lost slot, and how a new
//! deployment publishes rows older than its slot. Rows have no WAL position,
//! so `--delivery exactly-once` skips the event ids already in each topic.

use std::collections::{HashMap, HashSet};

use bytes::Bytes;
use rdkafka::types::RDKafkaErrorCode::UnknownTopicOrPartition;
use tokio_postgres::Client;

use super::CommandError;
use crate::config::{BackfillArgs, Config, Delivery};
use crate::outbox::{TableMapping, quote_ident};
use crate::pgoutput::{TupleData, Value};
use crate::sink::exactly_once::{TailError, TailReader};
use crate::sink::{KafkaSink, Sink, Ticket};
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
        if let Some(ids) = self.ids.get(topic) {
            return Ok(ids.contains(id));
        }
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
        let found = ids.contains(id);
        self.ids.insert(topic.to_owned(), ids);
        Ok(found)
    }
}

pub(super) async fn run(config: &Config, args: &BackfillArgs) -> Result<(), CommandError> {
    if config.kafka_brokers.is_empty() {
        return Err(CommandError::Refused(
            "backfill needs --kafka-brokers (the relay's own)".to_owned(),
        ));
    }
    let client = setup::connect(config).await?;
    // Rows read as text in pgoutput's session formats bind like streamed inserts.
    client
        .batch_execute(crate::source::SESSION_FORMATS)
        .await
        .map_err(query_err("set the session's formats"))?;
    let in_flight = config.flags.max_in_flight_events;
    let (brokers, properties) = (&config.kafka_brokers, &config.kafka_properties);
    let (sink, mut deliveries) = KafkaSink::new(brokers, properties, in_flight, None, None)?;
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    let mut exactly_once = match config.flags.delivery {
        Delivery::ExactlyOnce => Some(Delivered::new(config, &client, &args.since).await?),
        Delivery::AtLeastOnce => None,
    };
    let quoted = quote_ident(&args.column);
    let (mut sent, mut acked, mut skipped) = (0u64, 0u64, 0u64);
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
        let rows = client
            .query(&sql, &[&args.since])
            .await
            .map_err(query_err("read the outbox rows"))?;
        for row in rows {
            let value = |i| match row.get::<_, Option<String>>(i) {
                Some(text) => Value::Text(Bytes::from(text)),
                None => Value::Null,
            };
            let values = TupleData((0..row.len()).map(value).collect());
            let mapped = mapping.map(&values, now_ms);
            // A shard re-publishes the rows its publication's filter would have sent it.
            if config
                .flags
                .shard
                .is_some_and(|shard| !shard.owns_event(&mapped))
            {
                continue;
            }
            let record = mapped.map_err(|(e, _)| CommandError::Refused(format!("{table}: {e}")))?;
            if let Some(d) = exactly_once.as_mut()
                && d.contains(&sink, &record.topic, &record.id).await?
            {
                skipped += 1;
                continue;
            }
            sink.send(Ticket(sent), &record).await?;
            sent += 1;
            while sent - acked >= in_flight as u64 {
                acked += delivered(deliveries.recv().await)?;
            }
        }
    }
    while acked < sent {
        acked += delivered(deliveries.recv().await)?;
    }
    let skipped = match exactly_once {
        Some(_) => format!(" ({skipped} already in Kafka skipped)"),
        None => String::new(),
    };
    let (column, since) = (&args.column, &args.since);
    println!(
        "backfill: {sent} events with {column} >= {since} re-published and acknowledged by the \
         broker{skipped}"
    );
    Ok(())
}

/// 1 for an acknowledged record; a failed delivery stops the backfill.
fn delivered(delivery: Option<crate::sink::Delivery>) -> Result<u64, CommandError> {
    match delivery.map(|d| d.outcome) {
        Some(Ok(_)) => Ok(1),
        Some(Err(failure)) => Err(CommandError::Refused(format!(
            "delivery of event id {} to topic {:?} failed: {}; rerun the backfill (it is \
             at-least-once)",
            failure.record.id_text(),
            failure.record.topic,
            failure.refusal.source
        ))),
        None => Err(CommandError::Refused(
            "the producer stopped reporting deliveries".to_owned(),
        )),
    }
}
