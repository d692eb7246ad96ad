//! `outbox-relay peek [--json] [--limit N]`: the records the relay would produce
//! for what is pending in the slot. `pg_logical_slot_peek_binary_changes` leaves
//! the slot where it was; the relay's decoder and mapper, in a session with its
//! date and time settings, make the records as they would stream.

use std::io::Write;

use bytes::Bytes;
use futures_util::{TryStreamExt, pin_mut};

use super::print::{Position, RecordLine, text};
use super::{CommandError, execute};
use crate::config::{Config, PeekArgs};
use crate::lsn::Lsn;
use crate::outbox::{ID_HEADER, OutboxRecord, values};
use crate::pgoutput::{self, Message};
use crate::pipeline::RelayError;
use crate::source::setup::{self, query_err};

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
    let (client, slot) = (setup::connect(config).await?, &config.flags.slot);
    let remedy = "stop the relay to peek, or watch `outbox-relay status`";
    let info = super::status::idle_slot(&client, slot, remedy).await?;
    if !info.exists {
        return Err(CommandError::Refused(format!(
            "slot {slot:?} does not exist: nothing is pending (the relay or `outbox-relay setup` \
             creates it)"
        )));
    }
    let formats = crate::source::SESSION_FORMATS;
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
    let confirmed = info.confirmed_flush_lsn.as_deref().unwrap_or("?");
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
    let failed = query_err("peek at the slot");
    // pgoutput reads a list of identifiers: the publication quoted as one.
    let publication = format!("\"{}\"", config.flags.publication);
    let upto = upto.map_or("NULL".to_owned(), |n| n.min(i32::MAX as usize).to_string());
    let sql = format!(
        "SELECT lsn::text, data FROM pg_logical_slot_peek_binary_changes($1, NULL, {upto}, \
         'proto_version', '1', 'publication_names', $2, 'messages', 'true')"
    );
    let rows = client
        .query_raw(&sql, [&config.flags.slot, &publication])
        .await
        .map_err(&failed)?;
    pin_mut!(rows);

    let mut mapper = config.event_mapper();
    let (mut commit_lsn, mut commit_time_ms, mut seen, mut read) = (Lsn::ZERO, 0, 0, 0);
    while args.limit.is_none_or(|limit| *shown < limit)
        && let Some(row) = rows.try_next().await.map_err(&failed)?
    {
        read += 1;
        let lsn = row.get::<_, &str>(0).parse().unwrap_or(commit_lsn);
        let message = pgoutput::decode(&Bytes::copy_from_slice(row.get(1)))
            .map_err(|source| RelayError::Decode { lsn, source })?;
        let mapped = match message {
            Message::Begin {
                final_lsn,
                commit_time_micros,
                ..
            } => {
                commit_lsn = final_lsn;
                commit_time_ms = values::pg_micros_to_unix_micros(commit_time_micros) / 1000;
                None
            }
            Message::Relation(relation) => {
                let lsn = commit_lsn;
                let bind = |source| RelayError::Bind { lsn, source };
                let facts = match mapper.reads_catalog(&relation, None) {
                    true => setup::column_facts(client, &relation.id.to_string()).await?,
                    false => Vec::new(),
                };
                mapper.relation(relation, None, &facts).map_err(bind)?;
                None
            }
            Message::Insert { relation_id, new } => {
                mapper.insert(relation_id, &new, commit_time_ms)
            }
            Message::Message {
                transactional: true,
                prefix,
                content,
                ..
            } => mapper.message(&prefix, &content, commit_time_ms),
            _ => None,
        };
        let Some((table, mapped)) = mapped else {
            continue;
        };
        // An event a Kafka Connect Filter drops has no record to show.
        if matches!(mapped, Ok(None)) {
            continue;
        }
        seen += 1;
        if seen <= *shown {
            continue;
        }
        *shown += 1;
        let line = match mapped {
            Ok(Some(record)) if args.json => record_line(&record, commit_lsn).to_json(),
            Ok(Some(record)) => record_line(&record, commit_lsn).to_text(),
            Ok(None) => continue,
            Err((error, _)) if args.json => serde_json::json!({
                "lsn": commit_lsn.to_string(),
                "table": &*table,
                "error": error.to_string(),
            })
            .to_string(),
            Err((error, _)) => format!("{table} lsn={commit_lsn} cannot be relayed: {error}"),
        };
        writeln!(out, "{line}")?;
    }
    Ok(read)
}
