//! `outbox-relay backfill --since TIMESTAMP`: re-publishes outbox rows still
//! in the tables, through the relay's own mapping, at-least-once.
//!
//! The remedy after a slot was lost (a failover to a server without it): rows
//! committed between the last acknowledgement and the new slot never reached
//! the stream. It is also how a new deployment publishes rows that were in the
//! table before its slot existed. Each row is read in the text form pgoutput
//! sends (the same session settings), bound to the table's columns like a
//! streamed insert, and the command exits only when the broker acknowledged
//! every record.

use bytes::Bytes;
use tokio_postgres::Client;

use super::CommandError;
use crate::config::{BackfillArgs, Cli, Config};
use crate::outbox::{TableMapping, TableName, quote_ident};
use crate::pgoutput::{Column, Relation, TupleData, Value};
use crate::sink::Ticket;
use crate::sink::{Delivery, KafkaSink};
use crate::source::{SourceError, setup};

pub(super) fn run(cli: &Cli, args: &BackfillArgs) -> Result<(), CommandError> {
    let config = Config::from_cli(cli)?;
    if config.kafka_brokers.is_empty() {
        return Err(CommandError::Refused(
            "backfill needs --kafka-brokers (the relay's own)".to_owned(),
        ));
    }
    if config.delivery == crate::config::Delivery::ExactlyOnce {
        tracing::warn!(
            "backfill is at-least-once even with --delivery exactly-once: rows the slot already \
             relayed are published again, and consumers deduplicate them by the id header"
        );
    }
    let sent = super::block_on(backfill(&config, args))??;
    println!(
        "backfill: {sent} events with {} >= {} re-published and acknowledged by the broker",
        args.column, args.since
    );
    Ok(())
}

fn query_err(what: &'static str) -> impl Fn(tokio_postgres::Error) -> SourceError {
    move |source| SourceError::Query { what, source }
}

async fn backfill(config: &Config, args: &BackfillArgs) -> Result<u64, CommandError> {
    let client = setup::connect(config).await?;
    client
        .batch_execute(crate::source::SESSION_FORMATS)
        .await
        .map_err(query_err("set the session's formats"))?;
    let (sink, mut deliveries) = KafkaSink::new(
        &config.kafka_brokers,
        &config.kafka_properties,
        config.max_in_flight_events,
    )?;
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    let (mut sent, mut acked) = (0u64, 0u64);
    for table in &config.tables {
        let relation = relation(&client, table).await?;
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
    Ok(sent)
}

/// 1 for an acknowledged record; a failed delivery stops the backfill.
fn delivered(delivery: Option<Delivery>) -> Result<u64, CommandError> {
    match delivery.map(|d| d.outcome) {
        Some(Ok(_)) => Ok(1),
        Some(Err(failure)) => Err(CommandError::Refused(format!(
            "delivery of event id {} to topic {:?} failed: {}; rerun the backfill (it is \
             at-least-once)",
            failure.id, failure.topic, failure.error
        ))),
        None => Err(CommandError::Refused(
            "the producer stopped reporting deliveries".to_owned(),
        )),
    }
}

/// The table's columns as a pgoutput Relation announces them.
async fn relation(client: &Client, table: &TableName) -> Result<Relation, CommandError> {
    let rows = client
        .query(
            "SELECT attname::text, atttypid, atttypmod FROM pg_attribute \
             WHERE attrelid = $1::text::regclass AND attnum > 0 AND NOT attisdropped \
             ORDER BY attnum",
            &[&table.quoted()],
        )
        .await
        .map_err(query_err("read the outbox table's columns"))?;
    Ok(Relation {
        id: 0,
        namespace: table.schema.clone(),
        name: table.name.clone(),
        replica_identity: b'd',
        columns: rows
            .iter()
            .map(|r| Column {
                flags: 0,
                name: r.get(0),
                type_oid: r.get(1),
                type_modifier: r.get(2),
            })
            .collect(),
    })
}
