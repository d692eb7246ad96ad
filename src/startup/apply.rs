//! Applying: the steps [`super::checks::check`] listed, in order, once nothing was refused;
//! returns what was done and where streaming starts.

use tokio_postgres::Client;

use super::checks::{self, Refused, Step};
use super::facts::Facts;
use super::lineage::Lineage;
use super::{Started, StartupError, Wanted};
use crate::lsn::Lsn;
use crate::observability::Chain;
use crate::postgres::catalog::publication::{self, Publication};
use crate::postgres::{Connector, PgError, PostgresError, query_err, sql};
use crate::sink::KafkaClients;

/// Where the steps run: the control session, the server it is on, and Kafka.
pub(super) struct Session<'a> {
    /// The control connection gathering used.
    pub control: &'a Client,
    /// The connector pinned to the control connection's server.
    pub pinned: &'a Connector,
    /// The lineage topic's clients.
    pub kafka: &'a KafkaClients,
}

/// Runs `steps`, in order.
pub(super) async fn run(
    session: &Session<'_>,
    wanted: &Wanted,
    facts: &Facts,
    steps: &[Step],
) -> Result<Started, StartupError> {
    let mut started = found(facts, wanted)?;
    for step in steps {
        match step {
            Step::CreatePublication(statement) => {
                create_publication(session.control, wanted, statement).await?;
                started.publication_created = Some(statement.clone());
            }
            Step::CreateSlot { failover } => {
                started.confirmed_flush = create_slot(session.control, wanted, *failover).await?;
                started.slot_created = true;
            }
            Step::RecordLineage => {
                let lineage = lineage(session, wanted, facts).await?;
                let recorded = lineage
                    .created(started.confirmed_flush, wanted.resharding)
                    .await;
                // Kept when this fails: the next start records it and relays from its creation.
                let created = started.slot_created;
                recorded.map_err(|e| if created { e.slot_kept() } else { e })?;
            }
            Step::RefreshLineage => {
                let lineage = lineage(session, wanted, facts).await?;
                let record = facts.lineage.as_ref().and_then(|l| l.record.as_ref());
                lineage.refresh(record, wanted.resharding).await?;
            }
            Step::MarkFailover => mark_failover(session, wanted).await?,
        }
    }
    if started.publication_created.is_some() {
        started.publication = created_publication(session.control, wanted).await?;
    }
    if started.slot_created {
        let created = started.confirmed_flush;
        started.late_shard = checks::late_shard(wanted, &facts.siblings, created);
    }
    Ok(started)
}

/// What start-up found, before any step: the slot's position and the publication.
fn found(facts: &Facts, wanted: &Wanted) -> Result<Started, StartupError> {
    let confirmed = facts
        .slot
        .as_ref()
        .and_then(|s| s.confirmed_flush.as_deref());
    let confirmed_flush = match facts.slot {
        Some(_) => checks::confirmed_flush(&wanted.slot, confirmed)?,
        None => Lsn::ZERO,
    };
    let publication = match &facts.publication {
        Some(found) => Publication {
            oid: found.options.oid,
            all_tables: found.options.all_tables,
            server_version: found.options.server_version,
            members: found.members.clone(),
        },
        None => Publication {
            oid: 0,
            all_tables: false,
            server_version: facts.server.version_num,
            members: Vec::new(),
        },
    };
    let mut started = Started::resuming(confirmed_flush, publication);
    for (table, found) in wanted.tables.iter().zip(&facts.tables) {
        if let Some(key) = &found.primary_key {
            started
                .primary_keys
                .push((table.name.clone(), key.columns.clone()));
        }
    }
    Ok(started)
}

async fn create_publication(
    control: &Client,
    wanted: &Wanted,
    statement: &str,
) -> Result<(), PostgresError> {
    let created = control.batch_execute(statement).await;
    created.map_err(query_err("create the publication"))?;
    let publication = &wanted.publication;
    tracing::info!(publication = %publication, sql = %statement, "created publication");
    Ok(())
}

/// The publication just created, as later checks compare against it.
async fn created_publication(
    control: &Client,
    wanted: &Wanted,
) -> Result<Publication, StartupError> {
    let name = &wanted.publication;
    let Some(options) = publication::options(control, name).await? else {
        return Err(Refused::Misconfigured(format!(
            "publication {name:?} was dropped right after the relay created it; start again"
        ))
        .into());
    };
    let names = wanted.table_names();
    Ok(publication::publication(control, &options, &names).await?)
}

/// Creates the slot; returns its position.
async fn create_slot(
    control: &Client,
    wanted: &Wanted,
    failover: bool,
) -> Result<Lsn, StartupError> {
    let slot = &wanted.slot;
    let failed = query_err("create the replication slot");
    let row = control
        .query_one(&sql::create_slot(slot, failover), &[])
        .await
        .map_err(&failed)?;
    let position: Option<String> = row.try_get(1).map_err(&failed)?;
    let lsn = checks::confirmed_flush(slot, position.as_deref())?;
    tracing::info!(slot = %slot, lsn = %lsn, "created logical replication slot (pgoutput)");
    if failover {
        log_standby_snapshot(control).await;
    }
    Ok(lsn)
}

/// The slot's lineage, with the system identifier gathering read (IDENTIFY_SYSTEM again
/// only when it did not).
async fn lineage(
    session: &Session<'_>,
    wanted: &Wanted,
    facts: &Facts,
) -> Result<Lineage, StartupError> {
    let topic = &wanted.lineage_topic;
    let slot = &wanted.slot;
    match &facts.lineage {
        Some(found) => Ok(Lineage::new(
            session.kafka,
            topic,
            slot,
            &found.system_identifier,
        )),
        None => Lineage::open(session.pinned, session.kafka, topic, slot).await,
    }
}

/// Sets `FAILOVER true` on the slot (a replication command, so on a replication connection).
async fn mark_failover(session: &Session<'_>, wanted: &Wanted) -> Result<(), PostgresError> {
    let slot = &wanted.slot;
    let mut replication = session.pinned.command_session(slot).await?;
    let marked = replication.simple_query(&sql::mark_failover(slot)).await;
    let mark = "mark the slot for failover";
    marked.map_err(|e| session.pinned.replication_error(mark, slot, e))?;
    tracing::info!(slot = %slot, "marked the slot for failover (FAILOVER true)");
    log_standby_snapshot(session.control).await;
    Ok(())
}

/// Has the primary log a standby snapshot now, so the standbys' copies of a slot just created
/// or marked become persistent within seconds. Best effort: without it they still do, later.
pub async fn log_standby_snapshot(control: &Client) {
    let Err(e) = control.batch_execute(sql::LOG_STANDBY_SNAPSHOT).await else {
        return;
    };
    tracing::warn!(
        error = %Chain(&PgError(e)),
        "cannot call pg_log_standby_snapshot(): the standbys' copies of the failover slot \
         become persistent only after the primary's next standby snapshot (up to 15 s when \
         busy, later when idle). GRANT EXECUTE ON FUNCTION pg_log_standby_snapshot() TO the \
         relay's role (sql/03_relay_role.sql does)"
    );
}
