//! `outbox-relay status [--json]`: the slot, the publication and the server
//! settings the relay depends on, read over one control connection.

use std::collections::BTreeMap;
use std::io::Write;

use serde::{Deserialize, Serialize};
use tokio_postgres::Client;

use super::{CommandError, human_bytes};
use crate::config::{Config, StatusArgs};
use crate::observability::health::{
    ReadinessThresholds, SlotObservation, SlotStatus, failover_unready, idle_timeout_warning,
    slot_warnings,
};
use crate::postgres::catalog::{self, publication, slots};
use crate::postgres::{Connector, PostgresError, query_err};
use crate::source::failover;
use crate::startup::checks::in_use;
use crate::startup::{Checked, Wanted, checks, gather};

/// Everything `status` reports; the field names are `--json`'s contract.
#[derive(Debug, Serialize)]
struct Status {
    server_version: String,
    /// `--shard` as `I/K`; `null` unsharded.
    shard: Option<String>,
    /// The WAL position now (the replay position on a standby).
    current_wal_lsn: Option<String>,
    slot: SlotInfo,
    publication: PublicationInfo,
    /// The settings the relay depends on, as `SHOW` prints them (`null` where unknown).
    settings: BTreeMap<String, Option<String>>,
    /// What needs attention, with the remedy.
    warnings: Vec<String>,
}

/// The slot's row of `pg_replication_slots`; all `null` when it does not exist.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub(super) struct SlotInfo {
    name: String,
    pub(super) exists: bool,
    plugin: Option<String>,
    slot_type: Option<String>,
    database: Option<String>,
    active: Option<bool>,
    pub(super) active_pid: Option<i32>,
    pub(super) confirmed_flush_lsn: Option<String>,
    restart_lsn: Option<String>,
    /// Lag, WAL retention and newer servers' facts, read as the slot poller reads them.
    #[serde(flatten, skip_deserializing)]
    status: Option<SlotStatus>,
}

/// The publication, the operations it publishes and its tables (`schema.table`).
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(default)]
struct PublicationInfo {
    name: String,
    exists: bool,
    all_tables: bool,
    publishes: Vec<String>,
    tables: Vec<String>,
    /// Configured outbox tables it does not cover.
    missing_tables: Vec<String>,
    /// Each table's row filter, as Postgres prints it (PostgreSQL 15+; a shard's has one).
    row_filters: BTreeMap<String, String>,
}

pub(super) async fn run(config: &Config, args: &StatusArgs) -> Result<(), CommandError> {
    let connector = Connector::new(config.postgres.clone());
    let client = connector.control().await?;
    let server = catalog::server_report(&client).await?;
    let mut status = Status {
        server_version: server.version,
        shard: config.flags.shard.map(|shard| shard.to_string()),
        current_wal_lsn: server.wal_lsn,
        slot: read_slot(&client, &config.flags.slot).await?,
        publication: read_publication(&client, config).await?,
        settings: server.settings,
        warnings: Vec::new(),
    };
    if let Some(slot) = status.slot.status.as_mut() {
        failover::probe(slot, &connector, &config.flags.slot).await;
    }
    // The relay's own start-up checks, on the catalog alone (not the lineage topic).
    let wanted = Wanted::new(config);
    let found = gather::catalog(&client, &wanted).await?;
    let checked = checks::check(&found, &wanted);
    let limits = &config.flags.observability.readiness.thresholds();
    status.warnings = warnings(&status, limits, &checked);
    let output = match args.json {
        true => serde_json::to_string_pretty(&status).map_err(std::io::Error::other)? + "\n",
        false => render_text(&status),
    };
    std::io::stdout().write_all(output.as_bytes())?;
    Ok(())
}

/// The slot's row and, when it exists, its poll.
async fn read_slot(client: &Client, name: &str) -> Result<SlotInfo, PostgresError> {
    let mut slot: SlotInfo = slots::report(client, name).await?;
    if slot.exists {
        let polled = slots::poll(client, name).await;
        let polled = polled.map_err(query_err("read the replication slot"))?;
        if let SlotObservation::Seen(status) = polled {
            slot.status = Some(status);
        }
    }
    Ok(slot)
}

/// The slot's row, refused while a server process streams from it (`remedy` says what to do).
pub(super) async fn idle_slot(
    client: &Client,
    name: &str,
    remedy: &str,
) -> Result<SlotInfo, CommandError> {
    let slot = read_slot(client, name).await?;
    match slot.active_pid {
        Some(pid) => Err(CommandError::Refused(in_use(name, pid, remedy))),
        None => Ok(slot),
    }
}

async fn read_publication(
    client: &Client,
    config: &Config,
) -> Result<PublicationInfo, PostgresError> {
    let mut publication: PublicationInfo =
        publication::report(client, &config.flags.publication).await?;
    let wanted = config.tables.iter().map(ToString::to_string);
    publication.missing_tables = wanted.filter(|t| !publication.tables.contains(t)).collect();
    Ok(publication)
}

/// What needs attention: first what would stop the relay (start-up's refusals), then
/// start-up's warnings, then the slot judged by the same limits as the relay's readiness.
fn warnings(s: &Status, limits: &ReadinessThresholds, checked: &Checked) -> Vec<String> {
    let slot = &s.slot;
    let mut out: Vec<String> = checked.refusals.iter().map(ToString::to_string).collect();
    out.extend(checked.warnings.iter().cloned());
    if !slot.exists {
        out.push(format!(
            "slot {:?} does not exist: the relay creates it on its first start (or run outbox-relay \
             setup); where the lineage topic shows it streamed before, it refuses (exit 7): see \
             docs/operations.md#failover",
            slot.name
        ));
    } else if let Some(status) = &slot.status {
        out.extend(
            status
                .invalidated()
                .map(|r| crate::remedy::invalidated_slot(&r)),
        );
        out.extend(failover_unready(status));
        out.extend(slot_warnings(status, limits));
        out.extend(idle_timeout_warning(status.idle_timeout_secs.unwrap_or(0)));
    }
    if !s.publication.exists {
        out.push(format!(
            "publication {:?} does not exist: the relay creates it on start (or run outbox-relay \
             setup)",
            s.publication.name
        ));
    }
    let mut seen = std::collections::HashSet::new();
    out.retain(|warning| seen.insert(warning.clone()));
    out
}

/// The text form: a section per object, then the settings and the warnings.
fn render_text(s: &Status) -> String {
    let slot = &s.slot;
    let p = &s.publication;
    let tables = match p.all_tables {
        true => "all tables".to_owned(),
        false => p.tables.join(", "),
    };
    let mut publication = vec![("publishes", p.publishes.join(", ")), ("tables", tables)];
    let filters = p.row_filters.iter();
    publication.extend(filters.map(|(table, filter)| ("row filter", format!("{table}: {filter}"))));
    let mut out = match &s.shard {
        Some(shard) => format!("shard {shard}\n"),
        None => String::new(),
    };
    out += &section("slot", &slot.name, slot.exists.then(|| slot_rows(slot)));
    out += &section("publication", &p.name, p.exists.then_some(publication));
    let wal_lsn = or_dash(&s.current_wal_lsn);
    out += &format!("server {} (current wal lsn {wal_lsn})\n", s.server_version);
    for (name, value) in &s.settings {
        let value = value.as_deref().unwrap_or("(not available)");
        out += &format!("  {name:<24}{value}\n");
    }
    for warning in &s.warnings {
        out += &format!("warning: {warning}\n");
    }
    out
}

/// `kind name` and its rows, or that it does not exist (`rows` is `None`).
fn section(kind: &str, name: &str, rows: Option<Vec<(&str, String)>>) -> String {
    let Some(rows) = rows else {
        return format!("{kind} {name}: does not exist\n");
    };
    let rows = rows
        .iter()
        .map(|(key, value)| format!("  {key:<16}{value}\n"));
    format!("{kind} {name}\n{}", rows.collect::<String>())
}

fn slot_rows(slot: &SlotInfo) -> Vec<(&'static str, String)> {
    let bytes = |b: i64| format!("{b} bytes ({})", human_bytes(b));
    let status = slot.status.as_ref();
    let kind = [&slot.slot_type, &slot.plugin].map(or_dash).join(" ");
    let database = or_dash(&slot.database);
    let active_pid = match slot.active_pid {
        Some(pid) => format!("{pid} (a relay is streaming)"),
        None => "none (no relay connected)".to_owned(),
    };
    let lag = status.and_then(|s| s.lag_bytes);
    let wal_status = status.map_or("-", |s| s.wal_status.as_str());
    let failover = status.and_then(|s| s.failover);
    let failover = failover.map_or("n/a (PostgreSQL 17+)".to_owned(), |f| f.to_string());
    let unlimited = "unlimited (max_slot_wal_keep_size = -1)".to_owned();
    let safe_wal_size = status.and_then(|s| s.safe_wal_size_bytes);
    let mut rows = vec![
        ("type", format!("{kind} (database {database})")),
        ("active pid", active_pid),
        ("confirmed lsn", or_dash(&slot.confirmed_flush_lsn)),
        ("restart lsn", or_dash(&slot.restart_lsn)),
        ("lag", lag.map_or("-".to_owned(), |l| bytes(l as i64))),
        ("wal_status", wal_status.to_owned()),
        ("failover", failover),
        ("safe_wal_size", safe_wal_size.map_or(unlimited, bytes)),
    ];
    if let Some(status) = status {
        rows.extend(status.invalidated().map(|r| ("invalidated", r)));
        rows.extend(status.inactive_since.clone().map(|t| ("inactive since", t)));
    }
    rows
}

fn or_dash(value: &Option<String>) -> String {
    value.clone().unwrap_or_else(|| "-".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_in_use_is_refused_naming_the_process_and_the_remedy() {
        let text = in_use("s", 4242, "stop the relay first");
        for needle in ["\"s\"", "4242", "stop the relay first", "one session"] {
            assert!(text.contains(needle), "{needle}: {text}");
        }
    }
}
