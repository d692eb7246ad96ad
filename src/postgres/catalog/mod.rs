//! The catalog queries, each returning plain values: the server and its settings (here), the
//! outbox tables ([`tables`]), the publication ([`publication`]) and the slots ([`slots`]).
//! Shared by start-up, the mid-stream publication check, the slot monitor and the commands;
//! every query reads, none writes. One query fits every supported version: newer columns are
//! read through `to_jsonb` or `current_setting(..., true)`.

pub mod publication;
pub mod slots;
pub mod tables;

use tokio_postgres::Client;
use tokio_postgres::types::Json;

use super::{PostgresError, query_err};

/// A server's role, as `target_session_attrs` judges it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Role {
    /// `pg_is_in_recovery()`: a standby.
    pub in_recovery: bool,
    /// `transaction_read_only` is on.
    pub read_only: bool,
}

/// The server's role; the raw error, so that a server going away right after the login is
/// told apart.
pub async fn role(client: &Client) -> Result<Role, tokio_postgres::Error> {
    let row = client
        .query_one(
            "SELECT pg_is_in_recovery(), current_setting('transaction_read_only') = 'on'",
            &[],
        )
        .await?;
    Ok(Role {
        in_recovery: row.try_get(0)?,
        read_only: row.try_get(1)?,
    })
}

/// What start-up reads about the server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Server {
    /// `server_version_num`, e.g. 170002.
    pub version_num: i32,
    /// `server_version`, e.g. "17.2".
    pub version: String,
    /// A standby: nothing can be created there.
    pub in_recovery: bool,
    /// `wal_level`.
    pub wal_level: String,
    /// The role is a superuser, has REPLICATION or is a member of `rds_replication`.
    pub can_replicate: bool,
    /// `idle_replication_slot_timeout` in seconds (PostgreSQL 18+; 0 is off).
    pub idle_timeout_secs: u64,
    /// `synchronized_standby_slots` (PostgreSQL 17+; `None` before).
    pub synchronized_standby_slots: Option<String>,
    /// `hashtextextended(probe, 0)`: the server's text hash, which a shard's row filter uses.
    pub probe_hash: i64,
}

/// `idle_replication_slot_timeout` in seconds (NULL before PostgreSQL 18).
pub const IDLE_TIMEOUT_QUERY: &str = "\
    SELECT (SELECT setting::bigint * CASE unit WHEN 'min' THEN 60 WHEN 'h' THEN 3600 \
                                             WHEN 'd' THEN 86400 ELSE 1 END \
            FROM pg_settings WHERE name = 'idle_replication_slot_timeout')";

/// The server's version, settings and the role's right to replicate; `probe` is hashed as a
/// shard's row filter hashes text.
pub async fn server(client: &Client, probe: &str) -> Result<Server, PostgresError> {
    let sql = format!(
        "SELECT current_setting('server_version_num')::int, current_setting('server_version'), \
                pg_is_in_recovery(), current_setting('wal_level'), \
                r.rolsuper OR r.rolreplication OR EXISTS (SELECT 1 FROM pg_roles g \
                    WHERE g.rolname = 'rds_replication' \
                      AND pg_has_role(current_user, g.oid, 'member')), \
                ({IDLE_TIMEOUT_QUERY}), \
                current_setting('synchronized_standby_slots', true), \
                hashtextextended($1, 0) \
         FROM pg_roles r WHERE r.rolname = current_user"
    );
    let failed = query_err("read the server's version and settings");
    let row = client.query_one(&sql, &[&probe]).await.map_err(&failed)?;
    let idle_secs: Option<i64> = row.try_get(5).map_err(&failed)?;
    Ok(Server {
        version_num: row.try_get(0).map_err(&failed)?,
        version: row.try_get(1).map_err(&failed)?,
        in_recovery: row.try_get(2).map_err(&failed)?,
        wal_level: row.try_get(3).map_err(&failed)?,
        can_replicate: row.try_get(4).map_err(&failed)?,
        idle_timeout_secs: u64::try_from(idle_secs.unwrap_or(0)).unwrap_or(0),
        synchronized_standby_slots: row.try_get(6).map_err(&failed)?,
        probe_hash: row.try_get(7).map_err(&failed)?,
    })
}

/// What `status` shows about the server: its version, the WAL position now (the replay
/// position on a standby) and the settings the relay depends on, as `SHOW` prints them.
pub struct ServerReport {
    /// `server_version`.
    pub version: String,
    /// The WAL position now.
    pub wal_lsn: Option<String>,
    /// Each setting (`None` where the server has no such setting).
    pub settings: std::collections::BTreeMap<String, Option<String>>,
}

/// [`ServerReport`].
pub async fn server_report(client: &Client) -> Result<ServerReport, PostgresError> {
    let failed = query_err("read the server's WAL position and settings");
    let row = client
        .query_one(
            "SELECT current_setting('server_version'), \
                    (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() \
                          ELSE pg_current_wal_lsn() END)::text, \
                    (SELECT jsonb_object_agg(s, current_setting(s, true)) FROM unnest(ARRAY[\
                       'wal_level', 'max_slot_wal_keep_size', 'max_replication_slots', \
                       'wal_sender_timeout', 'synchronized_standby_slots', \
                       'sync_replication_slots', 'idle_replication_slot_timeout']) AS s)",
            &[],
        )
        .await
        .map_err(&failed)?;
    let Json(settings) = row.try_get(2).map_err(&failed)?;
    Ok(ServerReport {
        version: row.try_get(0).map_err(&failed)?,
        wal_lsn: row.try_get(1).map_err(&failed)?,
        settings,
    })
}

/// `--since` (any text Postgres reads as a `timestamptz`) in Unix milliseconds.
pub async fn unix_millis(client: &Client, time: &str) -> Result<i64, PostgresError> {
    let failed = query_err("read --since as a time");
    let row = client
        .query_one(
            "SELECT (extract(epoch FROM $1::text::timestamptz) * 1000)::bigint",
            &[&time],
        )
        .await
        .map_err(&failed)?;
    row.try_get(0).map_err(&failed)
}
