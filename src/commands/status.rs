//! `outbox-relay status [--json]`: the slot, the publication and the server
//! settings the relay depends on, read over one control connection.

use std::collections::BTreeMap;
use std::io::Write;

use serde::Serialize;
use tokio_postgres::Client;

use super::{CommandError, human_bytes};
use crate::config::{Cli, Config, StatusArgs};
use crate::observability::health::{
    ReadinessThresholds, SlotObservation, SlotStatus, idle_timeout_warning,
    slot_invalidated_remedy, slot_warnings,
};
use crate::source::SourceError;
use crate::source::setup::{self, query_err};
use crate::source::slot_monitor;

/// Server settings worth seeing next to the slot.
pub const SETTINGS: &[&str] = &[
    "wal_level",
    "max_slot_wal_keep_size",
    "max_replication_slots",
    "wal_sender_timeout",
    "synchronized_standby_slots",
    "sync_replication_slots",
    "idle_replication_slot_timeout",
];

/// Everything `status` reports.
#[derive(Debug, Serialize)]
pub struct Status {
    /// `server_version`.
    pub server_version: String,
    /// The server's WAL position now (the replay position on a standby).
    pub current_wal_lsn: Option<String>,
    /// The slot.
    pub slot: SlotInfo,
    /// The publication.
    pub publication: PublicationInfo,
    /// [`SETTINGS`], as `SHOW` prints them (`null` when the server has no such setting).
    pub settings: BTreeMap<String, Option<String>>,
    /// What needs attention, with the remedy.
    pub warnings: Vec<String>,
}

/// The slot's row of `pg_replication_slots`.
#[derive(Debug, Default, Serialize)]
pub struct SlotInfo {
    /// `--slot`.
    pub name: String,
    /// Whether it exists (the other fields are `null` when not).
    pub exists: bool,
    /// Output plugin.
    pub plugin: Option<String>,
    /// `logical` or `physical`.
    pub slot_type: Option<String>,
    /// Its database.
    pub database: Option<String>,
    /// Whether a walsender streams from it.
    pub active: Option<bool>,
    /// That walsender's process id.
    pub active_pid: Option<i32>,
    /// Confirmed position: the relay resumes here.
    pub confirmed_flush_lsn: Option<String>,
    /// Oldest WAL the slot keeps.
    pub restart_lsn: Option<String>,
    /// Lag, WAL retention, failover and what newer servers report, read as
    /// the slot poller reads them.
    #[serde(flatten)]
    pub status: Option<SlotStatus>,
}

/// The publication and its tables.
#[derive(Debug, Default, Serialize)]
pub struct PublicationInfo {
    /// `--publication`.
    pub name: String,
    /// Whether it exists.
    pub exists: bool,
    /// `FOR ALL TABLES`.
    pub all_tables: bool,
    /// The operations it publishes.
    pub publishes: Vec<String>,
    /// The tables it covers, as `schema.table`.
    pub tables: Vec<String>,
    /// Configured outbox tables it does not cover.
    pub missing_tables: Vec<String>,
}

pub(super) fn run(cli: &Cli, args: &StatusArgs) -> Result<(), CommandError> {
    let config = Config::from_cli(cli)?;
    let status = super::block_on(read(&config))??;
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &status).map_err(std::io::Error::other)?;
        writeln!(out)?;
    } else {
        out.write_all(render_text(&status).as_bytes())?;
    }
    Ok(())
}

/// Reads the status over a new control connection.
pub async fn read(config: &Config) -> Result<Status, SourceError> {
    let client = setup::connect(config).await?;
    let row = client
        .query_one(
            "SELECT current_setting('server_version'), \
                    (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() \
                          ELSE pg_current_wal_lsn() END)::text",
            &[],
        )
        .await
        .map_err(query_err("read the server's WAL position"))?;
    let server_version: String = row.get(0);
    let current_wal_lsn: Option<String> = row.get(1);
    let slot = read_slot(&client, &config.slot).await?;
    let publication = read_publication(&client, config).await?;
    let settings_rows = client
        .query(
            "SELECT s, current_setting(s, true) FROM unnest($1::text[]) AS s",
            &[&SETTINGS],
        )
        .await
        .map_err(query_err("read the server settings"))?;
    let settings: BTreeMap<String, Option<String>> =
        settings_rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    let warnings = warnings(&slot, &publication, &settings);
    Ok(Status {
        server_version,
        current_wal_lsn,
        slot,
        publication,
        settings,
        warnings,
    })
}

async fn read_slot(client: &Client, name: &str) -> Result<SlotInfo, SourceError> {
    let what = "read the replication slot";
    let row = client
        .query_opt(
            "SELECT plugin::text, slot_type::text, database::text, active, active_pid, \
                    confirmed_flush_lsn::text, restart_lsn::text \
             FROM pg_replication_slots WHERE slot_name = $1",
            &[&name],
        )
        .await
        .map_err(query_err(what))?;
    let Some(r) = row else {
        return Ok(SlotInfo {
            name: name.to_owned(),
            ..SlotInfo::default()
        });
    };
    let status = match slot_monitor::poll(client, name)
        .await
        .map_err(query_err(what))?
    {
        SlotObservation::Seen(status) => Some(status),
        SlotObservation::Missing | SlotObservation::Unknown => None,
    };
    Ok(SlotInfo {
        name: name.to_owned(),
        exists: true,
        plugin: r.get(0),
        slot_type: r.get(1),
        database: r.get(2),
        active: r.get(3),
        active_pid: r.get(4),
        confirmed_flush_lsn: r.get(5),
        restart_lsn: r.get(6),
        status,
    })
}

async fn read_publication(
    client: &Client,
    config: &Config,
) -> Result<PublicationInfo, SourceError> {
    let name = &config.publication;
    let row = client
        .query_opt(
            "SELECT puballtables, pubinsert, pubupdate, pubdelete, pubtruncate \
             FROM pg_publication WHERE pubname = $1",
            &[name],
        )
        .await
        .map_err(query_err("read the publication"))?;
    let Some(row) = row else {
        return Ok(PublicationInfo {
            name: name.clone(),
            missing_tables: config.tables.iter().map(ToString::to_string).collect(),
            ..PublicationInfo::default()
        });
    };
    let publishes = ["insert", "update", "delete", "truncate"]
        .iter()
        .enumerate()
        .filter(|(i, _)| row.get::<_, bool>(i + 1))
        .map(|(_, op)| (*op).to_owned())
        .collect();
    let tables: Vec<String> = client
        .query(
            "SELECT schemaname::text || '.' || tablename::text FROM pg_publication_tables \
             WHERE pubname = $1 ORDER BY 1",
            &[name],
        )
        .await
        .map_err(query_err("list the publication's tables"))?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let missing_tables = config
        .tables
        .iter()
        .map(ToString::to_string)
        .filter(|t| !tables.contains(t))
        .collect();
    Ok(PublicationInfo {
        name: name.clone(),
        exists: true,
        all_tables: row.get(0),
        publishes,
        tables,
        missing_tables,
    })
}

fn warnings(
    slot: &SlotInfo,
    publication: &PublicationInfo,
    settings: &BTreeMap<String, Option<String>>,
) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(Some(level)) = settings.get("wal_level")
        && level != "logical"
    {
        out.push(format!(
            "wal_level is {level}, logical replication needs logical: ALTER SYSTEM SET \
             wal_level = logical; and restart Postgres"
        ));
    }
    if !slot.exists {
        out.push(format!(
            "slot {:?} does not exist: the relay creates it on its first start (or run outbox-relay \
             setup); where public.outbox_relay_slots shows it streamed before, it refuses: see \
             the README's failover runbook",
            slot.name
        ));
    } else if let Some(status) = &slot.status {
        let facts = &status.facts;
        out.extend(facts.invalidated().map(|r| slot_invalidated_remedy(&r)));
        out.extend(slot_warnings(status, &ReadinessThresholds::default()));
        out.extend(idle_timeout_warning(facts.idle_timeout_secs.unwrap_or(0)));
    }
    if !publication.exists {
        out.push(format!(
            "publication {:?} does not exist: the relay creates it on start (or run outbox-relay setup)",
            publication.name
        ));
    } else if !publication.missing_tables.is_empty() {
        out.push(format!(
            "publication {:?} does not include {}: ALTER PUBLICATION {} ADD TABLE {};",
            publication.name,
            publication.missing_tables.join(", "),
            publication.name,
            publication.missing_tables.join(", ")
        ));
    }
    out
}

/// The text form.
pub fn render_text(s: &Status) -> String {
    let (slot, p) = (&s.slot, &s.publication);
    let mut out = String::new();
    section(
        &mut out,
        "slot",
        &slot.name,
        slot.exists.then(|| slot_rows(slot)),
    );
    let tables = match p.all_tables {
        true => "all tables".to_owned(),
        false => p.tables.join(", "),
    };
    let publication = vec![("publishes", p.publishes.join(", ")), ("tables", tables)];
    section(
        &mut out,
        "publication",
        &p.name,
        p.exists.then_some(publication),
    );
    out.push_str(&format!(
        "server {} (current wal lsn {})\n",
        s.server_version,
        or_dash(&s.current_wal_lsn)
    ));
    for (name, value) in &s.settings {
        let value = value.as_deref().unwrap_or("(not available)");
        out.push_str(&format!("  {name:<24}{value}\n"));
    }
    for warning in &s.warnings {
        out.push_str(&format!("warning: {warning}\n"));
    }
    out
}

/// `kind name` and its rows, or that it does not exist (`rows` is `None`).
fn section(out: &mut String, kind: &str, name: &str, rows: Option<Vec<(&str, String)>>) {
    let Some(rows) = rows else {
        return out.push_str(&format!("{kind} {name}: does not exist\n"));
    };
    out.push_str(&format!("{kind} {name}\n"));
    for (key, value) in rows {
        out.push_str(&format!("  {key:<16}{value}\n"));
    }
}

fn slot_rows(slot: &SlotInfo) -> Vec<(&'static str, String)> {
    let bytes = |b: i64| format!("{b} bytes ({})", human_bytes(b));
    let kind = format!("{} {}", or_dash(&slot.slot_type), or_dash(&slot.plugin));
    let status = slot.status.as_ref();
    let lag = status.and_then(|s| s.lag_bytes);
    let mut rows = vec![
        (
            "type",
            format!("{kind} (database {})", or_dash(&slot.database)),
        ),
        (
            "active pid",
            match slot.active_pid {
                Some(pid) => format!("{pid} (a relay is streaming)"),
                None => "none (no relay connected)".to_owned(),
            },
        ),
        ("confirmed lsn", or_dash(&slot.confirmed_flush_lsn)),
        ("restart lsn", or_dash(&slot.restart_lsn)),
        (
            "lag",
            lag.map_or_else(|| "-".to_owned(), |l| bytes(l as i64)),
        ),
        (
            "wal_status",
            status.map_or("-", |s| s.wal_status.as_str()).to_owned(),
        ),
        (
            "failover",
            status
                .and_then(|s| s.failover)
                .map_or_else(|| "n/a (PostgreSQL 17+)".to_owned(), |f| f.to_string()),
        ),
        (
            "safe_wal_size",
            status.and_then(|s| s.safe_wal_size_bytes).map_or_else(
                || "unlimited (max_slot_wal_keep_size = -1)".to_owned(),
                bytes,
            ),
        ),
    ];
    if let Some(facts) = status.map(|s| &s.facts) {
        rows.extend(facts.invalidated().map(|r| ("invalidated", r)));
        rows.extend(facts.inactive_since.clone().map(|t| ("inactive since", t)));
    }
    rows
}

fn or_dash(value: &Option<String>) -> String {
    value.clone().unwrap_or_else(|| "-".to_owned())
}
