//! `outbox-relay peek [--json] [--limit N]`: the records the relay would
//! produce for what is pending in the slot, without consuming it.
//!
//! `pg_logical_slot_peek_binary_changes` decodes from the slot's confirmed
//! position with the options the relay streams with and leaves the slot
//! where it was; the bytes go through the relay's pgoutput decoder and
//! [`EventMapper`](crate::outbox::EventMapper). The session takes the
//! relay's date and time settings, so values print as they would stream.

use std::io::Write;

use futures_util::{TryStreamExt, pin_mut};

use super::CommandError;
use super::print::{Position, RecordLine, text};
use crate::config::{Cli, Config, PeekArgs};
use crate::lsn::Lsn;
use crate::outbox::{Mapped, OutboxRecord, values};
use crate::pgoutput::{self, Message};
use crate::source::setup::{self, query_err};

pub(super) fn run(cli: &Cli, args: &PeekArgs) -> Result<(), CommandError> {
    let config = Config::from_cli(cli)?;
    super::block_on(peek(&config, args))?
}

/// The record as the demo's consumer would show it.
pub(crate) fn record_line(record: &OutboxRecord, position: Position) -> RecordLine<'_> {
    let mut line = RecordLine::new(&record.topic, position);
    line.key = text(record.key.as_deref());
    line.headers = std::iter::once((crate::outbox::ID_HEADER.to_owned(), text(Some(&record.id))))
        .chain(
            record
                .headers
                .iter()
                .map(|(name, value)| (name.to_string(), text(value.as_deref()))),
        )
        .collect();
    line.value = text(record.payload.as_deref());
    line.timestamp_ms = Some(record.timestamp_ms);
    line
}

async fn peek(config: &Config, args: &PeekArgs) -> Result<(), CommandError> {
    let client = setup::connect(config).await?;
    let Some((active_pid, confirmed)) = super::slot_activity(&client, &config.slot).await? else {
        return Err(CommandError::Refused(format!(
            "slot {:?} does not exist: nothing is pending (the relay or `outbox-relay setup` \
             creates it)",
            config.slot
        )));
    };
    if let Some(pid) = active_pid {
        return Err(CommandError::Refused(format!(
            "slot {:?} is in use by server process {pid} (a running relay?): Postgres lets only \
             one session read a slot. Stop the relay to peek, or watch `outbox-relay status`",
            config.slot
        )));
    }
    client
        .batch_execute(crate::source::SESSION_FORMATS)
        .await
        .map_err(query_err("set the session's date and time format"))?;
    // The publication quoted as an identifier: pgoutput reads a list of them.
    let publication = format!("\"{}\"", config.publication);
    let rows = client
        .query_raw(
            "SELECT lsn::text, data FROM pg_logical_slot_peek_binary_changes($1, NULL, NULL, \
             'proto_version', '1', 'publication_names', $2, 'messages', 'true')",
            [&config.slot, &publication],
        )
        .await
        .map_err(query_err("peek at the slot"))?;
    pin_mut!(rows);

    let mut mapper = config.event_mapper();
    let mut out = std::io::stdout().lock();
    let (mut commit_lsn, mut commit_time_ms) = (Lsn::ZERO, 0);
    let mut shown = 0usize;
    while args.limit.is_none_or(|limit| shown < limit) {
        let Some(row) = rows
            .try_next()
            .await
            .map_err(query_err("peek at the slot"))?
        else {
            break;
        };
        let data: &[u8] = row.get(1);
        let lsn = row.get::<_, &str>(0).parse::<Lsn>().unwrap_or(commit_lsn);
        let message = pgoutput::decode(&bytes::Bytes::copy_from_slice(data))
            .map_err(|source| CommandError::Decode { lsn, source })?;
        let mapped: Option<(std::sync::Arc<str>, Mapped)> = match message {
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
                mapper
                    .relation(relation, None)
                    .map_err(|source| CommandError::Bind {
                        lsn: commit_lsn,
                        source,
                    })?;
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
        let Some((source, mapped)) = mapped else {
            continue;
        };
        shown += 1;
        let line = match &mapped {
            Ok(record) => {
                let line = record_line(record, Position::Wal(commit_lsn));
                if args.json {
                    line.to_json()
                } else {
                    line.to_text()
                }
            }
            Err((error, _)) if args.json => serde_json::json!({
                "lsn": commit_lsn.to_string(),
                "table": &*source,
                "error": error.to_string(),
            })
            .to_string(),
            Err((error, _)) => format!("{source} lsn={commit_lsn} cannot be relayed: {error}"),
        };
        writeln!(out, "{line}")?;
    }
    let summary = format!(
        "{shown} record(s) pending after the slot's confirmed position {}{}; the slot was not moved",
        confirmed.as_deref().unwrap_or("?"),
        if args.limit == Some(shown) {
            " (--limit reached)"
        } else {
            ""
        },
    );
    if args.json {
        eprintln!("{summary}");
    } else {
        writeln!(out, "{summary}")?;
    }
    Ok(())
}
