//! `outbox-relay peek [--json] [--limit N]`: the records the relay would produce
//! for what is pending in the slot. `pg_logical_slot_peek_binary_changes` leaves
//! the slot where it was; the relay's decoder and mapper, in a session with its
//! date and time settings, make the records as they would stream.

use std::io::Write;

use std::sync::Arc;

use bytes::Bytes;

use super::print::{Position, RecordLine, text};
use super::{CommandError, execute};
use crate::config::{Config, PeekArgs};
use crate::lsn::Lsn;
use crate::outbox::{EventError, EventMapper, ID_HEADER, OutboxRecord, RawParts, values};
use crate::pgoutput::{self, Message};
use crate::pipeline::RelayError;
use crate::postgres::Connector;
use crate::postgres::catalog::{slots, tables};
use crate::postgres::sql::SESSION_FORMATS;
use crate::startup::{checks, gather};

/// The record as the demo's consumer would show it.
fn record_line(record: &OutboxRecord, lsn: Lsn) -> RecordLine<'_> {
    let id = (ID_HEADER.to_owned(), text(Some(&record.id)));
    let mut headers: Vec<_> = (record.headers.iter())
        .map(|(name, value)| (name.to_string(), text(value.as_deref())))
        .collect();
    if let Some(at) = record.id_header_at {
        headers.insert(at.min(headers.len()), id);
    }
    let lsn = lsn.to_string();
    RecordLine {
        topic: &record.topic,
        position: Position::Wal { lsn },
        key: text(record.key.as_deref()),
        headers,
        value: text(record.payload.as_deref()),
        timestamp_ms: Some(record.timestamp_ms),
    }
}

pub(super) async fn run(config: &Config, args: &PeekArgs) -> Result<(), CommandError> {
    let client = Connector::new(config.postgres.clone()).control().await?;
    let slot = &config.flags.slot;
    let remedy = "stop the relay to peek, or watch `outbox-relay status`";
    let found = gather::slot(&client, slot).await?;
    let dbname = &config.postgres.dbname;
    let confirmed = checks::peekable(slot, dbname, found.as_ref(), remedy);
    let confirmed = confirmed.map_err(CommandError::Refused)?;
    let formats = SESSION_FORMATS;
    execute(&client, formats, "set the session's date and time format").await?;
    let mut out = std::io::stdout().lock();
    // Decoding stops after the transaction in which `upto_nchanges` rows (Begin, Relation and
    // Commit count too) were reached: a pass that reaches it without enough records is
    // followed by one four times larger, re-decoded from the slot's position.
    let (mut shown, mut upto) = (0, args.limit.map(|n| n.saturating_mul(4).max(16)));
    loop {
        let rows = pass(&client, config, args, upto, &mut shown, &mut out).await?;
        match upto {
            Some(cap) if args.limit.is_some_and(|n| shown < n) && rows >= cap => {
                upto = Some(cap.saturating_mul(4));
            }
            _ => break,
        }
    }
    let limit_reached = (args.limit == Some(shown)).then_some(" (--limit reached)");
    let limit_reached = limit_reached.unwrap_or_default();
    let summary = format!(
        "{shown} record(s) pending after the slot's confirmed position {confirmed}\
         {limit_reached}; the slot was not moved"
    );
    if args.json {
        eprintln!("{summary}");
    } else {
        writeln!(out, "{summary}")?;
    }
    Ok(())
}

/// One peek, decoding at most about `upto` rows: prints the records after the first `shown`
/// (printed by an earlier pass) up to `--limit`; returns how many rows the server sent.
async fn pass(
    client: &tokio_postgres::Client,
    config: &Config,
    args: &PeekArgs,
    upto: Option<usize>,
    shown: &mut usize,
    out: &mut impl Write,
) -> Result<usize, CommandError> {
    let flags = &config.flags;
    let mut pending = slots::peek(client, &flags.slot, &flags.publication, upto).await?;
    let mut decoding = Decoding::new(config.event_mapper());
    let mut seen = 0;
    let mut read = 0;
    while args.limit.is_none_or(|limit| *shown < limit)
        && let Some((lsn, data)) = pending.next().await?
    {
        read += 1;
        let Some(peeked) = decoding.next(client, &lsn, &data).await? else {
            continue;
        };
        seen += 1;
        if seen <= *shown {
            continue;
        }
        *shown += 1;
        writeln!(out, "{}", peeked.render(args.json))?;
    }
    Ok(read)
}

/// The relay's decoder and mapper over the changes of one pass.
struct Decoding {
    mapper: EventMapper,
    /// The open transaction's commit LSN and time.
    commit_lsn: Lsn,
    commit_time_ms: i64,
}

/// An outbox event as the relay would produce it, or why it could not.
struct Peeked {
    commit_lsn: Lsn,
    table: Arc<str>,
    mapped: Result<OutboxRecord, (EventError, RawParts)>,
}

impl Decoding {
    fn new(mapper: EventMapper) -> Self {
        Decoding {
            mapper,
            commit_lsn: Lsn::ZERO,
            commit_time_ms: 0,
        }
    }

    /// The event in the change at `lsn` (text), if it holds one.
    async fn next(
        &mut self,
        client: &tokio_postgres::Client,
        lsn: &str,
        data: &Bytes,
    ) -> Result<Option<Peeked>, CommandError> {
        let lsn = lsn.parse().unwrap_or(self.commit_lsn);
        let message =
            pgoutput::decode(data).map_err(|source| RelayError::Decode { lsn, source })?;
        let commit_time_ms = self.commit_time_ms;
        let mapped = match message {
            Message::Begin {
                final_lsn,
                commit_time_micros,
                ..
            } => {
                self.commit_lsn = final_lsn;
                self.commit_time_ms = values::pg_micros_to_unix_micros(commit_time_micros) / 1000;
                None
            }
            Message::Relation(relation) => {
                let facts = match self.mapper.reads_catalog(&relation, None) {
                    true => tables::column_facts(client, &relation.id.to_string()).await?,
                    false => Vec::new(),
                };
                let lsn = self.commit_lsn;
                let bound = self.mapper.relation(relation, None, &facts);
                bound.map_err(|source| RelayError::Bind { lsn, source })?;
                None
            }
            Message::Insert { relation_id, new } => {
                self.mapper.insert(relation_id, &new, commit_time_ms)
            }
            Message::Message {
                transactional: true,
                prefix,
                content,
                ..
            } => self.mapper.message(&prefix, &content, commit_time_ms),
            _ => None,
        };
        let Some((table, mapped)) = mapped else {
            return Ok(None);
        };
        // An event a Kafka Connect Filter drops has no record to show.
        let mapped = match mapped {
            Ok(None) => return Ok(None),
            Ok(Some(record)) => Ok(record),
            Err(unmapped) => Err(unmapped),
        };
        Ok(Some(Peeked {
            commit_lsn: self.commit_lsn,
            table,
            mapped,
        }))
    }
}

impl Peeked {
    /// The line `peek` prints for it, as text or JSON.
    fn render(&self, json: bool) -> String {
        let lsn = self.commit_lsn;
        let table = &self.table;
        match &self.mapped {
            Ok(record) if json => record_line(record, lsn).to_json(),
            Ok(record) => record_line(record, lsn).to_text(),
            Err((error, _)) if json => serde_json::json!({
                "lsn": lsn.to_string(),
                "table": &**table,
                "error": error.to_string(),
            })
            .to_string(),
            Err((error, _)) => format!("{table} lsn={lsn} cannot be relayed: {error}"),
        }
    }
}
