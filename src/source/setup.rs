//! The control connection (to the server `--postgres-url`'s `target_session_attrs`
//! picks) and what runs over it: the start-up checks, each stopping a misconfigured
//! relay with the fix, the publication and slot, and the look-ups later checks repeat.

use tokio_postgres::Client;

use super::lineage::{Guard, Lineage};
use super::{SourceError, failover, shard};
use crate::config::Config;
use crate::lsn::Lsn;
use crate::observability::health;
use crate::outbox::{TableName, quote_ident};
use crate::postgres::catalog::publication::{self, Publication};
use crate::postgres::catalog::{self, slots, tables};
use crate::postgres::{Connector, query_err, sql};

/// The oldest supported major version: 14 brought pgoutput's `messages` option.
const MIN_SERVER_MAJOR: i32 = 14;

/// The first version (`server_version_num`) with failover slots.
const FAILOVER_MIN_VERSION: i32 = 170_000;

/// The first version with publication row filters, which `--shard` needs for tables.
const ROW_FILTER_MIN_VERSION: i32 = 150_000;

/// What start-up learned about the slot.
#[derive(Debug, Clone)]
pub struct SlotState {
    /// Streaming resumes here.
    pub confirmed_flush: Lsn,
    /// Whether this run created the slot.
    pub created: bool,
    /// The publication as found before streaming: later checks compare against it.
    pub publication: Publication,
}

/// Opens the control connection to the server `target_session_attrs` picks.
pub async fn connect(config: &Config) -> Result<Client, SourceError> {
    Ok(Connector::new(config.postgres.clone()).control().await?)
}

/// Runs every start-up check, creates what is missing, and returns the slot's position.
pub async fn prepare(client: &Client, config: &Config) -> Result<SlotState, SourceError> {
    let in_recovery = check_server(client, config).await?;
    let mut partitioned = Vec::new();
    for table in &config.tables {
        if check_table(client, config, table).await? {
            partitioned.push(table);
        }
    }
    let filters = shard::row_filters(client, config).await?;
    let publication = match verify_publication(client, config, &partitioned).await {
        // Before streaming, the only change is "does not exist".
        Err(SourceError::PublicationChanged { .. }) => {
            create_publication(client, config, in_recovery, &filters).await?;
            verify_publication(client, config, &partitioned).await?
        }
        found => found?,
    };
    shard::verify(client, config, &publication, &filters).await?;
    let (confirmed_flush, created) = ensure_slot(client, config).await?;
    Ok(SlotState {
        confirmed_flush,
        created,
        publication,
    })
}

/// The server's version, `wal_level` and the role's right to replicate (warning of an idle
/// slot timeout); returns whether the server is a standby, where nothing can be created.
async fn check_server(client: &Client, config: &Config) -> Result<bool, SourceError> {
    let server = catalog::server(client, "").await?;
    // PostgreSQL 18's idle_replication_slot_timeout drops the slot of a relay stopped longer.
    if let Some(warning) = health::idle_timeout_warning(server.idle_timeout_secs) {
        tracing::warn!("{warning}");
    }
    let version_num = server.version_num;
    let version = &server.version;
    let wal_level = &server.wal_level;
    let user = &config.postgres.user;
    let problem = if version_num / 10000 < MIN_SERVER_MAJOR {
        format!(
            "Postgres {version} is not supported: the relay needs PostgreSQL {MIN_SERVER_MAJOR} \
             or newer (for pgoutput's `messages` option)"
        )
    } else if wal_level != "logical" {
        format!(
            "Postgres has wal_level={wal_level:?}, but logical replication needs \
             wal_level=logical. Run ALTER SYSTEM SET wal_level = logical; and restart Postgres \
             (on RDS/Aurora set rds.logical_replication=1 in the parameter group; on Cloud SQL \
             set the cloudsql.logical_decoding flag)"
        )
    } else if !server.can_replicate {
        format!(
            "role {user:?} lacks the REPLICATION attribute (and is not a superuser or a member of \
             rds_replication). Run ALTER ROLE {user} WITH REPLICATION; (see sql/ for a \
             least-privilege role)"
        )
    } else if config.flags.slot_failover && version_num < FAILOVER_MIN_VERSION {
        format!(
            "--slot-failover needs PostgreSQL 17 or later, but the server is {version}; on older \
             servers a failover loses the slot (see docs/operations.md#failover)"
        )
    } else if let Some(shard) = config.flags.shard.filter(|_| !config.tables.is_empty())
        && version_num < ROW_FILTER_MIN_VERSION
    {
        format!(
            "--shard {shard} needs PostgreSQL 15 or later (publication row filters send each \
             shard only its rows), but the server is {version}. Run one relay without --shard, \
             or shard a table-less outbox (--table none --message-prefix ...)"
        )
    } else {
        return Ok(server.in_recovery);
    };
    Err(SourceError::Misconfigured(problem))
}

/// Checks the table's columns and persistence; returns whether it is partitioned.
async fn check_table(
    client: &Client,
    config: &Config,
    table: &TableName,
) -> Result<bool, SourceError> {
    let Some(found) = tables::table(client, table).await? else {
        return Err(SourceError::Misconfigured(format!(
            "outbox table {table} does not exist (check --table and the database in \
             --postgres-url)"
        )));
    };
    let relation = found.relation;
    let mapping = config.mapping_for(table);
    if mapping.connect.is_some() {
        // Debezium's format refuses column types and combinations before anything is sent.
        let facts = tables::column_facts(client, &table.quoted()).await?;
        let bound = crate::outbox::TableMapping::bind_with(mapping, &relation, &facts);
        bound.map_err(|e| SourceError::Misconfigured(e.to_string()))?;
    }
    let columns = relation.columns;
    for (flag, column) in mapping.required_columns() {
        if !columns.iter().any(|c| c.name == column) {
            return Err(SourceError::Misconfigured(format!(
                "outbox table {table} has no column {column:?} (named by {flag}); its columns \
                 are: {}",
                join(columns.iter(), |c| c.name.clone())
            )));
        }
    }
    if let Some(unlogged) = found.unlogged {
        return Err(SourceError::Misconfigured(format!(
            "outbox table {table} cannot be relayed: {unlogged} is UNLOGGED, and UNLOGGED tables \
             write no WAL, so logical decoding never sees their rows. Run ALTER TABLE ... SET \
             LOGGED; on each"
        )));
    }
    Ok(found.partitioned)
}

/// Creates the missing publication, with a shard's `filters` (on a standby, says what to run
/// on the primary).
async fn create_publication(
    client: &Client,
    config: &Config,
    in_recovery: bool,
    filters: &[String],
) -> Result<(), SourceError> {
    let publication = &config.flags.publication;
    let sql = sql::create_publication(publication, &config.tables, filters);
    if in_recovery {
        return Err(SourceError::Misconfigured(format!(
            "publication {publication:?} does not exist, and this server is a hot standby, where \
             nothing can be created; create it on the primary (it reaches the standby through \
             replication): {sql};"
        )));
    }
    client
        .batch_execute(&sql)
        .await
        .map_err(query_err("create the publication"))?;
    tracing::info!(publication = %publication, sql = %sql, "created publication");
    Ok(())
}

/// Checks the publication (at start-up, `partitioned` names the partitioned
/// outbox tables, which need `publish_via_partition_root`) and returns it.
pub async fn verify_publication(
    client: &Client,
    config: &Config,
    partitioned: &[&TableName],
) -> Result<Publication, SourceError> {
    let name = &config.flags.publication;
    let options = publication::options(client, name).await?;
    let options = options.ok_or_else(|| SourceError::PublicationChanged {
        publication: name.clone(),
        change: "does not exist".to_owned(),
    })?;
    let unusable = |problem| SourceError::Misconfigured(format!("publication {name:?} {problem}"));
    if !options.inserts {
        return Err(unusable(format!(
            "does not publish inserts; run ALTER PUBLICATION {} SET (publish = 'insert'); or use \
             another --publication",
            quote_ident(name)
        )));
    }
    // Without it, a partitioned outbox's rows arrive under each partition's name.
    if !options.via_root && !partitioned.is_empty() {
        return Err(unusable(format!(
            "lacks publish_via_partition_root, so rows of the partitioned outbox table {} would \
             arrive under each partition's name; run ALTER PUBLICATION {} SET \
             (publish_via_partition_root = true);",
            join(partitioned.iter(), ToString::to_string),
            quote_ident(name)
        )));
    }
    let found = publication::publication(client, &options, &config.tables).await?;
    let members = &found.members;
    let uncovered = |t: &&TableName| members.contains(&(t.quoted(), Vec::new()));
    let missing: Vec<&TableName> = config.tables.iter().filter(uncovered).collect();
    if !missing.is_empty() {
        return Err(unusable(format!(
            "does not include {}; run ALTER PUBLICATION {} ADD TABLE {};",
            join(missing.iter(), ToString::to_string),
            quote_ident(name),
            join(missing.iter(), |t| t.quoted())
        )));
    }
    Ok(found)
}

fn join<T>(items: impl Iterator<Item = T>, show: impl Fn(T) -> String) -> String {
    items.map(show).collect::<Vec<_>>().join(", ")
}

/// The slot's confirmed position, and whether it was created now. The relay streams only
/// from a slot whose creation the lineage topic records ([`lineage`]).
async fn ensure_slot(client: &Client, config: &Config) -> Result<(Lsn, bool), SourceError> {
    let slot = &config.flags.slot;
    let found = slots::slot(client, slot).await?;
    let failover = config.flags.slot_failover;
    let mark_failover = failover && failover::check(client, config).await?;
    let mut lineage = Lineage::open(config).await?;
    let Some(found) = found else {
        match lineage.judge(client, false).await? {
            Guard::Refuse(recorded) => {
                let (slot, url) = (slot.clone(), config.postgres.redacted());
                return Err(SourceError::SlotLost {
                    slot,
                    url,
                    recorded,
                });
            }
            Guard::Replace(recorded) => tracing::warn!(
                slot = %slot,
                recorded,
                "--allow-new-slot: creating a fresh slot where this relay streamed before; events \
                 committed between the last acknowledgement and now are relayed only by \
                 `outbox-relay backfill`"
            ),
            Guard::Create | Guard::Keep { .. } => {}
        }
        let row = client
            .query_one(&sql::create_slot(slot, failover), &[])
            .await
            .map_err(query_err("create the replication slot"))?;
        let created: Option<String> = row
            .try_get(1)
            .map_err(query_err("create the replication slot"))?;
        let lsn = parse_lsn(slot, created)?;
        tracing::info!(slot = %slot, lsn = %lsn, "created logical replication slot (pgoutput)");
        if failover {
            failover::log_standby_snapshot(client).await;
        }
        // Kept when this fails: the next start records it and relays from its creation.
        lineage.created(lsn).await.map_err(|e| match e {
            SourceError::Lineage(e) => SourceError::Lineage(e.slot_kept()),
            e => e,
        })?;
        return Ok((lsn, true));
    };
    let dbname = &config.postgres.dbname;
    if let Some(problem) = found.unusable {
        return Err(SourceError::Misconfigured(format!(
            "replication slot {slot:?} {problem}; the relay needs a logical pgoutput slot in \
             database {dbname:?} of --postgres-url. Use another --slot, or drop it with SELECT \
             pg_drop_replication_slot('{slot}'); if nothing uses it"
        )));
    }
    let confirmed_flush = parse_lsn(slot, found.confirmed_flush)?;
    match lineage.judge(client, true).await? {
        // A slot created by `setup`, by hand, or before the lineage topic existed.
        Guard::Keep { record: true } => lineage.created(confirmed_flush).await?,
        // Written again, so that time-based retention does not drop it.
        _ => lineage.refresh().await?,
    }
    if mark_failover {
        failover::mark(client, config).await?;
    }
    Ok((confirmed_flush, false))
}

/// A slot's confirmed position; none means it lost its WAL.
fn parse_lsn(slot: &str, text: Option<String>) -> Result<Lsn, SourceError> {
    let lsn = text.and_then(|text| text.parse().ok());
    lsn.ok_or_else(|| {
        SourceError::Misconfigured(format!(
            "replication slot {slot:?}: it has no confirmed position (it may have been \
             invalidated after exceeding max_slot_wal_keep_size); drop and recreate it, and \
             re-publish or reconcile events written meanwhile"
        ))
    })
}
