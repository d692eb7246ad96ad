//! Replication slots: the relay's own (its kind, position, failover mark and user), other
//! slots by name (a shard's siblings, `reshard`'s old and new slots), the slot poll the
//! monitor and `status` read, a standby's synchronized copy, and what is pending in a slot.

use std::pin::Pin;

use bytes::Bytes;
use futures_util::TryStreamExt;
use serde::de::DeserializeOwned;
use tokio_postgres::types::Json;
use tokio_postgres::{Client, RowStream};

use super::IDLE_TIMEOUT_QUERY;
use crate::observability::health::{SlotObservation, SlotStatus, WalStatus};
use crate::postgres::sql::quote_literal;
use crate::postgres::{PostgresError, query_err};

/// The relay's slot as `pg_replication_slots` shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Slot {
    /// Why the relay cannot use it (physical, another plugin, another database), if so.
    pub unusable: Option<String>,
    /// `confirmed_flush_lsn`; `None` when the slot lost its WAL.
    pub confirmed_flush: Option<String>,
    /// Marked for failover (PostgreSQL 17+; `None` before).
    pub failover: Option<bool>,
    /// The server process streaming from it, if any.
    pub active_pid: Option<i32>,
}

/// The slot `name`; `None` when it does not exist.
pub async fn slot(client: &Client, name: &str) -> Result<Option<Slot>, PostgresError> {
    let failed = query_err("look up the replication slot");
    let row = client
        .query_opt(
            "SELECT CASE WHEN slot_type <> 'logical' THEN 'is a physical slot' \
                         WHEN plugin <> 'pgoutput' THEN format('uses the \"%s\" plugin', plugin) \
                         WHEN database <> current_database() \
                         THEN format('belongs to database \"%s\"', database) END, \
                    confirmed_flush_lsn::text, (to_jsonb(s) -> 'failover')::boolean, active_pid \
             FROM pg_replication_slots s WHERE slot_name = $1",
            &[&name],
        )
        .await
        .map_err(&failed)?;
    let Some(row) = row else {
        return Ok(None);
    };
    Ok(Some(Slot {
        unusable: row.try_get(0).map_err(&failed)?,
        confirmed_flush: row.try_get(1).map_err(&failed)?,
        failover: row.try_get(2).map_err(&failed)?,
        active_pid: row.try_get(3).map_err(&failed)?,
    }))
}

/// Each of `names`, with its confirmed position if the slot exists (`None` otherwise, or
/// when it has no position).
pub async fn positions(
    client: &Client,
    names: &[String],
) -> Result<Vec<(String, Option<String>)>, PostgresError> {
    let failed = query_err("read the slots' positions");
    let rows = client
        .query(
            "SELECT s, (SELECT confirmed_flush_lsn::text FROM pg_replication_slots \
                        WHERE slot_name = s) FROM unnest($1::text[]) s",
            &[&names],
        )
        .await
        .map_err(&failed)?;
    let mut found = Vec::new();
    for row in &rows {
        found.push((
            row.try_get(0).map_err(&failed)?,
            row.try_get(1).map_err(&failed)?,
        ));
    }
    Ok(found)
}

/// Those of `names` that exist, in name order.
pub async fn existing(client: &Client, names: &[String]) -> Result<Vec<String>, PostgresError> {
    let failed = query_err("list the other shards' slots");
    let rows = client
        .query(
            "SELECT slot_name::text FROM pg_replication_slots \
             WHERE slot_name::text = ANY($1) ORDER BY 1",
            &[&names],
        )
        .await
        .map_err(&failed)?;
    let mut existing = Vec::new();
    for row in &rows {
        existing.push(row.try_get(0).map_err(&failed)?);
    }
    Ok(existing)
}

/// The slots a relay or a fleet of shards of the base name `base` would have: `base` itself
/// and `base_shard_...`, in name order (whose names are a shard's [`crate::outbox::Shard::of_name`]
/// decides).
pub async fn family(client: &Client, base: &str) -> Result<Vec<String>, PostgresError> {
    let failed = query_err("list the slots of the same base name");
    let rows = client
        .query(
            "SELECT slot_name::text FROM pg_replication_slots \
             WHERE slot_name::text = $1 OR starts_with(slot_name::text, $1 || '_shard_') \
             ORDER BY 1",
            &[&base],
        )
        .await
        .map_err(&failed)?;
    let mut found = Vec::new();
    for row in &rows {
        found.push(row.try_get(0).map_err(&failed)?);
    }
    Ok(found)
}

/// When an older relay recorded `slot` in `public.outbox_relay_slots` of the cluster `system`.
pub async fn legacy_record(
    client: &Client,
    slot: &str,
    system: &str,
) -> Result<Option<String>, PostgresError> {
    let found = client
        .query_opt(
            "SELECT created_at::text FROM public.outbox_relay_slots \
             WHERE slot_name = $1 AND system_identifier = $2",
            &[&slot, &system],
        )
        .await;
    let failed = query_err("read public.outbox_relay_slots");
    match found {
        Ok(Some(row)) => Ok(Some(row.try_get(0).map_err(&failed)?)),
        Ok(None) => Ok(None),
        // No table: no older relay ran here.
        Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE) => Ok(None),
        Err(e) => Err(failed(e)),
    }
}

/// The poll. On a standby (logical slots exist there from Postgres 16) the
/// replay position stands in for `pg_current_wal_lsn()`. Newer servers' columns
/// are read through `to_jsonb`, so one query fits every version.
const SLOT_QUERY: &str = "\
    SELECT (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() \
                 ELSE pg_current_wal_lsn() END - confirmed_flush_lsn)::bigint, \
           wal_status::text, safe_wal_size::bigint, \
           (to_jsonb(s) -> 'failover')::boolean, \
           current_setting('synchronized_standby_slots', true) <> '', \
           to_jsonb(s) ->> 'invalidation_reason', (to_jsonb(s) ->> 'conflicting')::bool, \
           to_jsonb(s) ->> 'inactive_since' \
    FROM pg_replication_slots s WHERE slot_name = $1";

/// One poll of `slot`: its lag, WAL retention and newer servers' facts.
pub async fn poll(client: &Client, slot: &str) -> Result<SlotObservation, tokio_postgres::Error> {
    let Some(row) = client.query_opt(SLOT_QUERY, &[&slot]).await? else {
        return Ok(SlotObservation::Missing);
    };
    let idle_timeout = client
        .query_one(IDLE_TIMEOUT_QUERY, &[])
        .await?
        .try_get(0)?;
    let to_u64 = |value: Option<i64>| value.map(|v| u64::try_from(v).unwrap_or(0));
    let wal_status: Option<String> = row.try_get(1)?;
    let status = SlotStatus {
        lag_bytes: to_u64(row.try_get(0)?),
        wal_status: WalStatus::parse(wal_status.as_deref()),
        safe_wal_size_bytes: row.try_get(2)?,
        failover: row.try_get(3)?,
        synchronized_standby_slots_set: row.try_get(4)?,
        invalidation_reason: row.try_get(5)?,
        conflicting: row.try_get(6)?,
        inactive_since: row.try_get(7)?,
        idle_timeout_secs: to_u64(idle_timeout),
        ..SlotStatus::default()
    };
    tracing::debug!(slot, ?status, "polled the slot");
    Ok(SlotObservation::Seen(status))
}

/// `status`'s view of the slot's `pg_replication_slots` row, a JSON object: `name`, and when
/// it exists `exists`, `plugin`, `slot_type`, `database`, `active`, `active_pid`,
/// `confirmed_flush_lsn` and `restart_lsn`.
pub async fn report<T: DeserializeOwned>(client: &Client, name: &str) -> Result<T, PostgresError> {
    let failed = query_err("read the replication slot");
    let row = client
        .query_one(
            "SELECT jsonb_build_object('name', $1::text) || coalesce((SELECT to_jsonb(s) FROM \
               (SELECT true AS exists, plugin, slot_type, database, active, active_pid, \
                       confirmed_flush_lsn::text, restart_lsn::text \
                FROM pg_replication_slots WHERE slot_name = $1) s), '{}')",
            &[&name],
        )
        .await
        .map_err(&failed)?;
    let Json(report) = row.try_get(0).map_err(&failed)?;
    Ok(report)
}

/// On one server: whether it is a standby, and whether it holds a persistent synchronized
/// copy of `slot` (`None`: no copy).
pub async fn synced_copy(
    client: &Client,
    slot: &str,
) -> Result<(bool, Option<bool>), PostgresError> {
    let failed = query_err("look for the slot's synchronized copy");
    let row = client
        .query_one(
            "SELECT pg_is_in_recovery(), (SELECT (to_jsonb(s) ->> 'synced')::bool \
             AND NOT temporary FROM pg_replication_slots s WHERE slot_name = $1)",
            &[&slot],
        )
        .await
        .map_err(&failed)?;
    Ok((
        row.try_get(0).map_err(&failed)?,
        row.try_get(1).map_err(&failed)?,
    ))
}

/// The slot's confirmed position and the WAL end, as `demo` prints them.
pub async fn progress(client: &Client, slot: &str) -> Result<Option<(String, i64)>, PostgresError> {
    let failed = query_err("read the slot's progress");
    let row = client
        .query_opt(
            "SELECT format('slot confirmed %s of WAL end %s', confirmed_flush_lsn, \
                           pg_current_wal_lsn()), \
                    coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn), 0)::bigint \
             FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .map_err(&failed)?;
    let Some(row) = row else {
        return Ok(None);
    };
    Ok(Some((
        row.try_get(0).map_err(&failed)?,
        row.try_get(1).map_err(&failed)?,
    )))
}

/// The query that reads `slot`'s confirmed position on a replication session.
pub fn confirmed_query(slot: &str) -> String {
    format!(
        "SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = {}",
        quote_literal(slot)
    )
}

/// The changes pending in a slot, read as [`peek`] asks.
pub struct Pending {
    rows: Pin<Box<RowStream>>,
}

impl Pending {
    /// The next change: its LSN (as text) and its pgoutput message.
    pub async fn next(&mut self) -> Result<Option<(String, Bytes)>, PostgresError> {
        let failed = query_err("peek at the slot");
        let Some(row) = self.rows.try_next().await.map_err(&failed)? else {
            return Ok(None);
        };
        let lsn: String = row.try_get(0).map_err(&failed)?;
        let data: &[u8] = row.try_get(1).map_err(&failed)?;
        Ok(Some((lsn, Bytes::copy_from_slice(data))))
    }
}

/// The changes pending in `slot` for `publication`, without moving it. Decoding stops after
/// the transaction in which `upto` changes (Begin, Relation and Commit count too) were reached.
pub async fn peek(
    client: &Client,
    slot: &str,
    publication: &str,
    upto: Option<usize>,
) -> Result<Pending, PostgresError> {
    // pgoutput reads a list of identifiers: the publication quoted as one.
    let publication = format!("\"{publication}\"");
    let upto = upto.map_or("NULL".to_owned(), |n| n.min(i32::MAX as usize).to_string());
    let sql = format!(
        "SELECT lsn::text, data FROM pg_logical_slot_peek_binary_changes($1, NULL, {upto}, \
         'proto_version', '1', 'publication_names', $2, 'messages', 'true')"
    );
    let rows = client.query_raw(&sql, [slot, publication.as_str()]).await;
    let rows = rows.map_err(query_err("peek at the slot"))?;
    Ok(Pending {
        rows: Box::pin(rows),
    })
}
