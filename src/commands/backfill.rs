//! `outbox-relay backfill --since TIMESTAMP`: re-publishes outbox rows still
//! in the tables, through the relay's own mapping, at-least-once, or with
//! `--delivery exactly-once` skipping the events already in Kafka.
//!
//! The remedy after a slot was lost (a failover to a server without it): rows
//! committed between the last acknowledgement and the new slot never reached
//! the stream. It is also how a new deployment publishes rows that were in the
//! table before its slot existed. Each row is read in the text form pgoutput
//! sends (the same session settings), bound to the table's columns like a
//! streamed insert, and the command exits only when the broker acknowledged
//! every record.
//!
//! Backfilled rows have no WAL position, so exactly-once proves delivery by
//! event id: before the first row to a topic, the `id` headers of the topic's
//! records from `--since` (less [`SINCE_MARGIN_MS`]) to its end are read.

use std::collections::{HashMap, HashSet};

use bytes::Bytes;
use tokio_postgres::Client;

use super::CommandError;
use crate::config::{BackfillArgs, Cli, Config, Delivery};
use crate::outbox::{TableMapping, quote_ident};
use crate::pgoutput::{TupleData, Value};
use crate::sink::exactly_once::{TailError, TailReader};
use crate::sink::{KafkaSink, Sink, SinkError, Ticket};
use crate::source::setup::{self, query_err};

pub(super) fn run(cli: &Cli, args: &BackfillArgs) -> Result<(), CommandError> {
    let config = Config::from_cli(cli)?;
    if config.kafka_brokers.is_empty() {
        return Err(CommandError::Refused(
            "backfill needs --kafka-brokers (the relay's own)".to_owned(),
        ));
    }
    let (sent, skipped) = super::block_on(backfill(&config, args))??;
    println!(
        "backfill: {sent} events with {} >= {} re-published and acknowledged by the broker{}",
        args.column,
        args.since,
        match skipped {
            Some(skipped) => format!(" ({skipped} already in Kafka skipped)"),
            None => String::new(),
        }
    );
    Ok(())
}

/// How far before `--since` the records of a topic are read back: a
/// record's Kafka timestamp is its transaction's commit time, at or after
/// `created_at`, but `--column` may be any time the application sets, and
/// clocks differ.
const SINCE_MARGIN_MS: i64 = 60 * 60 * 1000;

/// `--delivery exactly-once`: the event ids already in each topic.
struct Delivered {
    reader: TailReader,
    since_ms: i64,
    ids: HashMap<String, HashSet<Vec<u8>>>,
    skipped: u64,
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
        let reader = TailReader::new(&config.kafka_brokers, &config.kafka_properties)
            .map_err(|e| SinkError::create(e, &config.kafka_properties))?;
        Ok(Delivered {
            reader,
            since_ms: since_ms.saturating_sub(SINCE_MARGIN_MS),
            ids: HashMap::new(),
            skipped: 0,
        })
    }

    /// Whether the event `id` is already in `topic` (read once per topic).
    fn contains(&mut self, sink: &KafkaSink, topic: &str, id: &[u8]) -> Result<bool, CommandError> {
        if !self.ids.contains_key(topic) {
            let ids = match sink.partition_count(topic) {
                Ok(partitions) => self
                    .reader
                    .event_ids_since(topic, partitions, self.since_ms)?,
                // Not created yet: nothing was delivered to it.
                Err(e)
                    if e.rdkafka_error_code()
                        == Some(rdkafka::types::RDKafkaErrorCode::UnknownTopicOrPartition) =>
                {
                    HashSet::new()
                }
                Err(e) => {
                    return Err(CommandError::Tail(TailError::Read {
                        topic: topic.to_owned(),
                        partition: -1,
                        reason: format!("cannot read the topic's partition count: {e}"),
                    }));
                }
            };
            tracing::info!(
                topic,
                events = ids.len(),
                "read the events already in the topic"
            );
            self.ids.insert(topic.to_owned(), ids);
        }
        let found = self.ids.get(topic).is_some_and(|ids| ids.contains(id));
        self.skipped += u64::from(found);
        Ok(found)
    }
}

/// The events sent, and with exactly-once those skipped.
async fn backfill(
    config: &Config,
    args: &BackfillArgs,
) -> Result<(u64, Option<u64>), CommandError> {
    let client = setup::connect(config).await?;
    client
        .batch_execute(crate::source::SESSION_FORMATS)
        .await
        .map_err(query_err("set the session's formats"))?;
    let (sink, mut deliveries) = KafkaSink::new(
        &config.kafka_brokers,
        &config.kafka_properties,
        config.max_in_flight_events,
        None,
    )?;
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    let (mut sent, mut acked) = (0u64, 0u64);
    let mut delivered_before = match config.delivery {
        Delivery::ExactlyOnce => Some(Delivered::new(config, &client, &args.since).await?),
        Delivery::AtLeastOnce => None,
    };
    for table in &config.tables {
        let relation = setup::relation(&client, table).await?;
        let mapping = TableMapping::bind(config.mapping_for(table), &relation)
            .map_err(|e| CommandError::Refused(e.to_string()))?;
        if !relation.columns.iter().any(|c| c.name == args.column) {
            return Err(CommandError::Refused(format!(
                "--column {:?}: {table} has no such column",
                args.column
            )));
        }
        let columns: Vec<String> = relation
            .columns
            .iter()
            .map(|c| format!("{}::text", quote_ident(&c.name)))
            .collect();
        let sql = format!(
            "SELECT {} FROM {} WHERE {col} >= $1::text::timestamptz ORDER BY {col}",
            columns.join(", "),
            table.quoted(),
            col = quote_ident(&args.column),
        );
        let rows = client
            .query(&sql, &[&args.since])
            .await
            .map_err(query_err("read the outbox rows"))?;
        for row in rows {
            let values = (0..row.len())
                .map(|i| match row.get::<_, Option<String>>(i) {
                    Some(text) => Value::Text(Bytes::from(text)),
                    None => Value::Null,
                })
                .collect();
            let record = mapping
                .map(&relation, &TupleData(values), now_ms)
                .map_err(|e| CommandError::Refused(format!("{table}: {e}")))?;
            if let Some(d) = delivered_before.as_mut()
                && d.contains(&sink, &record.topic, &record.id)?
            {
                continue;
            }
            sink.send(Ticket(sent), &record).await?;
            sent += 1;
            while sent - acked >= config.max_in_flight_events as u64 {
                acked += delivered(deliveries.recv().await)?;
            }
        }
    }
    while acked < sent {
        acked += delivered(deliveries.recv().await)?;
    }
    Ok((sent, delivered_before.map(|d| d.skipped)))
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
            failure.error
        ))),
        None => Err(CommandError::Refused(
            "the producer stopped reporting deliveries".to_owned(),
        )),
    }
}
