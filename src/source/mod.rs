//! I/O: the Postgres side. Start-up checks, publication and slot
//! ([`setup`]), `--cleanup delete` ([`cleanup`]), and what the pipeline sees
//! through the [`Source`] and [`Stream`] traits: [`PgSource`] (replication
//! sessions, and a control connection for lookups) and [`ReplicationStream`].
//!
//! The stream is a thin wrapper over pgwire-replication: it passes events
//! through and exposes exactly one way to move the slot, [`Stream::ack`],
//! which only the pipeline calls, and only with the ack frontier.

pub mod cleanup;
pub mod heartbeat;
pub mod lineage;
pub mod setup;
pub mod slot_monitor;
pub mod sql;
mod tls;

use std::future::Future;
use std::time::Duration;

use pgwire_replication::{PgWireError, ReplicationClient, ReplicationConfig, ReplicationEvent};

pub use tls::TlsError;

use crate::config::Config;
use crate::lsn::Lsn;
use crate::outbox::TableName;

/// Session settings for the walsender, so values arrive in one fixed text
/// form whatever the server's defaults (timestamps in ISO, UTC).
const SESSION_OPTIONS: &str =
    "-c datestyle=ISO,YMD -c timezone=UTC -c intervalstyle=postgres -c extra_float_digits=3";

/// `SESSION_OPTIONS` for a control session that reads rows as the stream
/// sends them (`peek`, `backfill`).
pub const SESSION_FORMATS: &str = "SET datestyle = 'ISO, YMD'; SET timezone = 'UTC'; \
     SET intervalstyle = 'postgres'; SET extra_float_digits = 3";

/// Events buffered between pgwire-replication's socket reader and the
/// pipeline. pgwire-replication bounds this channel by count only, and one
/// event holds one whole WAL message (one row, up to 1 GB), so the smallest
/// channel is the tightest bound: read-ahead is at most this event, the one
/// the reader holds while waiting for room, and its 128 KiB socket buffer.
const STREAM_BUFFER_EVENTS: usize = 1;

/// Something went wrong on the Postgres side.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The control connection could not be opened.
    #[error("cannot connect to Postgres at {url}: {reason}")]
    Connect {
        /// Redacted URL.
        url: String,
        /// The error with its causes (tokio-postgres' own message omits them, e.g.
        /// the server's refusal).
        reason: String,
        /// Driver error.
        #[source]
        source: tokio_postgres::Error,
    },
    /// The TLS settings in the URL cannot be used (a file, a missing root CA).
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The control connection's TLS handshake failed (certificate refused, ...).
    #[error("TLS handshake with Postgres at {url} failed: {reason}; {hint}")]
    TlsHandshake {
        /// Redacted URL.
        url: String,
        /// The error with its causes (rustls' refusal).
        reason: String,
        /// What to check.
        hint: &'static str,
        /// Driver error.
        #[source]
        source: tokio_postgres::Error,
    },
    /// The replication connection was refused at start-up (TLS or authentication),
    /// although the control connection with the same settings had been accepted.
    #[error("cannot open the replication connection to {url}: {source}; {hint}")]
    ReplicationConnect {
        /// Redacted URL.
        url: String,
        /// What to check.
        hint: &'static str,
        /// pgwire-replication's error.
        #[source]
        source: PgWireError,
    },
    /// The server is older than the oldest supported version.
    #[error(
        "Postgres {version} is not supported: the relay needs PostgreSQL {minimum} or newer \
         (pgoutput's `messages` option, PostgreSQL 14)"
    )]
    ServerTooOld {
        /// The server's `server_version`.
        version: String,
        /// The oldest supported major version.
        minimum: i32,
    },
    /// An outbox table (or a partition of it) is UNLOGGED.
    #[error(
        "outbox table {table} cannot be relayed: {unlogged} is UNLOGGED, and UNLOGGED tables \
         write no WAL, so logical decoding never sees their rows. Run ALTER TABLE ... SET \
         LOGGED; on each"
    )]
    TableUnlogged {
        /// The configured table.
        table: String,
        /// The unlogged table and partitions.
        unlogged: String,
    },
    /// The existing publication publishes a partitioned outbox under its partitions' names.
    #[error(
        "publication {publication:?} lacks publish_via_partition_root, so rows of the \
         partitioned outbox table {tables} would arrive under each partition's name; run \
         {remedy}"
    )]
    PublicationNotViaRoot {
        /// The publication.
        publication: String,
        /// The partitioned outbox tables.
        tables: String,
        /// SQL that fixes it.
        remedy: String,
    },
    /// `wal_level` is not `logical`.
    #[error(
        "Postgres has wal_level={actual:?}, but logical replication needs wal_level=logical. \
         Run ALTER SYSTEM SET wal_level = logical; and restart Postgres (on RDS/Aurora set \
         rds.logical_replication=1 in the parameter group; on Cloud SQL set the \
         cloudsql.logical_decoding flag)"
    )]
    WalLevel {
        /// The server's setting.
        actual: String,
    },
    /// The role may not open a replication connection.
    #[error(
        "role {user:?} lacks the REPLICATION attribute (and is not a superuser or a member of \
         rds_replication). Run ALTER ROLE {user} WITH REPLICATION; (see sql/ for a \
         least-privilege role)"
    )]
    NoReplicationPrivilege {
        /// The role.
        user: String,
    },
    /// A configured outbox table does not exist.
    #[error(
        "outbox table {table} does not exist (check --table and the database in --postgres-url)"
    )]
    TableMissing {
        /// The table.
        table: String,
    },
    /// A column the mapping needs is not in the table.
    #[error(
        "outbox table {table} has no column {column:?} (named by {flag}); its columns are: \
         {available}"
    )]
    ColumnMissing {
        /// The table.
        table: String,
        /// The flag naming the column.
        flag: &'static str,
        /// The column.
        column: String,
        /// The table's columns.
        available: String,
    },
    /// The publication was dropped (or dropped and re-created) while the relay
    /// streamed. PostgreSQL 18 then decodes on without it, skipping the outbox
    /// rows with only a warning in the server log, so the relay stops first.
    #[error(
        "publication {publication:?} {what} while the relay was streaming; outbox rows \
         committed while it was missing are not decoded, so the relay stops without confirming \
         any position after its last check of the publication. Re-create it (or start the relay, \
         which creates it), restart, and run `outbox-relay backfill --since TIMESTAMP` with a \
         time before the drop to re-publish rows the slot skipped"
    )]
    PublicationDropped {
        /// The publication.
        publication: String,
        /// "does not exist" or "was dropped and re-created".
        what: &'static str,
    },
    /// An outbox table was removed from the publication and added again
    /// between two looks: on every version, rows inserted in between were
    /// never decoded.
    #[error(
        "publication {publication:?} stopped publishing {table} and published it again \
         (ALTER PUBLICATION ... DROP TABLE, then ADD TABLE) since the relay last looked; rows \
         inserted into it in between were not decoded and are not in Kafka. Run `outbox-relay \
         backfill --since TIMESTAMP` with a time before the change to re-publish them, then \
         restart the relay"
    )]
    PublicationTableReAdded {
        /// The publication.
        publication: String,
        /// The outbox table.
        table: String,
    },
    /// The existing publication does not publish inserts.
    #[error(
        "publication {publication:?} does not publish inserts; run ALTER PUBLICATION \
         {publication} SET (publish = 'insert'); or use another --publication"
    )]
    PublicationNoInsert {
        /// The publication.
        publication: String,
    },
    /// `--cleanup delete` on a table without a primary key.
    #[error(
        "--cleanup delete: table {table} has no primary key, so relayed rows cannot be deleted \
         one by one; add one (ALTER TABLE {table} ADD PRIMARY KEY (id)) or use --cleanup none"
    )]
    CleanupNoPrimaryKey {
        /// The table.
        table: String,
    },
    /// `--cleanup delete` without DELETE on the table.
    #[error(
        "--cleanup delete: role {user:?} may not DELETE from {table}; run GRANT DELETE ON {table} \
         TO {user}, or use --cleanup none"
    )]
    CleanupNoDeletePrivilege {
        /// The table.
        table: String,
        /// The relay's role.
        user: String,
    },
    /// `--cleanup delete` with a publication that publishes deletes.
    #[error(
        "--cleanup delete: publication {publication:?} publishes deletes, so every row the relay \
         deletes would come back through the slot; run ALTER PUBLICATION {publication} SET \
         (publish = 'insert')"
    )]
    CleanupPublishesDeletes {
        /// The publication.
        publication: String,
    },
    /// Deleting relayed rows failed; the frontier waits for the retry.
    #[error("--cleanup delete: deleting relayed rows from {table} failed: {source}")]
    CleanupDelete {
        /// The table.
        table: String,
        /// The server's error.
        #[source]
        source: tokio_postgres::Error,
    },
    /// A hot standby has no publication of that name and cannot create one.
    #[error(
        "publication {publication:?} does not exist, and this server is a hot standby, where \
         nothing can be created; create it on the primary (it reaches the standby through \
         replication): {sql};"
    )]
    PublicationMissingOnStandby {
        /// The publication.
        publication: String,
        /// The statement to run on the primary.
        sql: String,
    },
    /// The existing publication does not cover every outbox table.
    #[error("publication {publication:?} does not include {missing}; run {remedy}")]
    PublicationMissingTables {
        /// The publication.
        publication: String,
        /// Tables not covered.
        missing: String,
        /// SQL that fixes it.
        remedy: String,
    },
    /// The slot exists but is physical.
    #[error(
        "replication slot {slot:?} is a physical slot; the relay needs a logical pgoutput slot. Use another --slot, or drop it with SELECT pg_drop_replication_slot('{slot}'); if nothing uses it"
    )]
    SlotPhysical {
        /// The slot.
        slot: String,
    },
    /// The slot exists with another output plugin.
    #[error(
        "replication slot {slot:?} uses the {plugin:?} plugin; the relay needs pgoutput. Use another --slot, or drop it with SELECT pg_drop_replication_slot('{slot}'); if nothing uses it"
    )]
    SlotWrongPlugin {
        /// The slot.
        slot: String,
        /// Its plugin.
        plugin: String,
    },
    /// The slot belongs to another database.
    #[error(
        "replication slot {slot:?} belongs to database {database:?}, not {expected:?}; use another --slot or fix the database in --postgres-url"
    )]
    SlotOtherDatabase {
        /// The slot.
        slot: String,
        /// Its database.
        database: String,
        /// Ours.
        expected: String,
    },
    /// The slot has no confirmed position (invalidated, or lost its WAL).
    #[error(
        "replication slot has no confirmed position (it may have been invalidated after exceeding max_slot_wal_keep_size); drop and recreate it, and re-publish or reconcile events written meanwhile"
    )]
    SlotInvalidated,
    /// Postgres reports the slot invalidated (`invalidation_reason`, `conflicting`).
    #[error("replication slot {slot:?}: {remedy}")]
    SlotInvalidatedBy {
        /// The slot.
        slot: String,
        /// What it means and what to do.
        remedy: String,
    },
    /// A catalog query failed.
    #[error("Postgres query failed ({what}): {}", pg_error_text(source))]
    Query {
        /// What the query was for.
        what: &'static str,
        /// Driver error.
        #[source]
        source: tokio_postgres::Error,
    },
    /// The replication stream failed.
    #[error("replication stream from slot {slot:?} failed: {source}")]
    Stream {
        /// The slot.
        slot: String,
        /// pgwire-replication's error.
        #[source]
        source: PgWireError,
    },
    /// The server closed the stream.
    #[error(
        "Postgres ended the replication stream of slot {slot:?} (walsender terminated or server shutting down)"
    )]
    StreamEnded {
        /// The slot.
        slot: String,
    },
    /// The slot is missing where this relay streamed from it before: creating
    /// a fresh one would skip every event committed since the last acknowledgement.
    #[error(
        "replication slot {slot:?} is missing on {url}, where this relay has streamed from it \
         before (recorded in public.outbox_relay_slots at {created_at}). Most likely this server \
         was promoted from a standby that did not have the slot (PostgreSQL 16 or older, or a \
         slot not synchronized with --slot-failover); or the slot was dropped; or the relay now \
         points at a standby of the server it streamed from (slots are per server). Events \
         committed since the relay's last acknowledgement are not in any slot here, and a new \
         slot would start from now and skip them. Remedy: start the relay once with \
         --allow-new-slot (it creates a fresh slot and relays new events), then run \
         `outbox-relay backfill --since TIMESTAMP` with a time before the change to \
         re-publish the rows the slot never saw (at-least-once: consumers may see duplicates)"
    )]
    SlotLost {
        /// The slot.
        slot: String,
        /// The server, redacted.
        url: String,
        /// When the record was written.
        created_at: String,
    },
    /// `--slot-failover` on a server without failover slots.
    #[error(
        "--slot-failover needs PostgreSQL 17 or later, but the server is {version}; on older \
         servers a failover loses the slot (see the README's failover runbook)"
    )]
    FailoverUnsupported {
        /// `server_version`.
        version: String,
    },
    /// None of the URL's servers satisfies `target_session_attrs` (during a
    /// failover, until the standby is promoted): retried like a lost connection.
    #[error("no server of --postgres-url is {attrs} (target_session_attrs): {tried}")]
    NoSuitableHost {
        /// The wanted state.
        attrs: &'static str,
        /// Each server and why it was passed over.
        tried: String,
    },
    /// A relation's partition root could not be looked up mid-stream (the stream
    /// is restarted, replaying the open transaction).
    #[error("cannot look up the partition root of relation OID {relation_id}: {source}")]
    PartitionLookup {
        /// The relation.
        relation_id: u32,
        /// The connection or query error.
        #[source]
        source: Box<SourceError>,
    },
    /// The server did not accept START_REPLICATION in time.
    #[error("replication stream from slot {slot:?} did not start within {timeout:?}")]
    StartTimeout {
        /// The slot.
        slot: String,
        /// How long we waited.
        timeout: Duration,
    },
}

/// How the relay should react to a [`SourceError`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recovery {
    /// Reconnect with backoff: the network, a restart, a terminated walsender.
    Reconnect,
    /// Another process holds the slot: wait as a standby and take over when it frees.
    Standby,
    /// Retrying cannot help; stop and say what to do.
    Fatal,
}

impl SourceError {
    /// Whether this error heals by itself.
    pub fn recovery(&self) -> Recovery {
        match self {
            SourceError::Stream { source, .. } => match source {
                PgWireError::Server(message) => match sqlstate(message) {
                    // object_in_use: "replication slot ... is active for PID n"
                    Some("55006") => Recovery::Standby,
                    // undefined_object (slot dropped), insufficient_privilege,
                    // invalid_authorization, object_not_in_prerequisite_state
                    // (slot invalidated), invalid_parameter_value.
                    Some("42704" | "42501" | "55000" | "22023") => Recovery::Fatal,
                    Some(code) if code.starts_with("28") => Recovery::Fatal,
                    _ => Recovery::Reconnect,
                },
                PgWireError::Auth(_) | PgWireError::Tls(_) => Recovery::Fatal,
                _ => Recovery::Reconnect,
            },
            SourceError::StartTimeout { .. }
            | SourceError::StreamEnded { .. }
            | SourceError::NoSuitableHost { .. }
            | SourceError::PartitionLookup { .. } => Recovery::Reconnect,
            _ => Recovery::Fatal,
        }
    }

    /// For a dropped slot, the remedy; `None` otherwise.
    pub fn is_slot_dropped(&self) -> bool {
        matches!(self, SourceError::Stream { source: PgWireError::Server(m), .. }
            if sqlstate(m) == Some("42704") && m.contains("replication slot"))
    }
}

/// A tokio-postgres error with the server's message, detail and hint, which
/// its `Display` ("db error") leaves out.
pub fn pg_error_text(error: &tokio_postgres::Error) -> String {
    let Some(db) = error.as_db_error() else {
        let mut text = error.to_string();
        let mut source = std::error::Error::source(error);
        while let Some(cause) = source {
            text.push_str(": ");
            text.push_str(&cause.to_string());
            source = cause.source();
        }
        return text;
    };
    let mut text = format!("{} (SQLSTATE {})", db.message(), db.code().code());
    if let Some(detail) = db.detail() {
        text.push_str(&format!("; detail: {detail}"));
    }
    if let Some(hint) = db.hint() {
        text.push_str(&format!("; hint: {hint}"));
    }
    text
}

/// The SQLSTATE in pgwire-replication's rendering of a server error.
fn sqlstate(message: &str) -> Option<&str> {
    let at = message.find("SQLSTATE ")? + "SQLSTATE ".len();
    message.get(at..at + 5)
}

/// The slot's confirmed position, read on a gated session; `None` when it
/// cannot be read.
async fn slot_confirmed(client: &mut ReplicationClient, slot: &str) -> Option<Lsn> {
    let sql = format!(
        "SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = {}",
        sql::quote_literal(slot)
    );
    let rows = client.simple_query(&sql).await.ok()?;
    let text = rows.first()?.first()?.as_ref()?;
    std::str::from_utf8(text).ok()?.parse().ok()
}

/// The replication session's settings, shared by the stream and IDENTIFY_SYSTEM.
pub(crate) fn replication_config(
    config: &Config,
    start: Lsn,
    acked: Lsn,
) -> Result<ReplicationConfig, SourceError> {
    let pg = &config.postgres;
    let tls = tls::replication_tls(pg)?;
    Ok(ReplicationConfig::new(
        pg.host.clone(),
        pg.user.clone(),
        pg.password.clone().unwrap_or_default(),
        pg.dbname.clone(),
        config.slot.clone(),
        config.publication.clone(),
    )
    .with_port(pg.port)
    .with_tls(tls)
    .with_start_lsn(start.into())
    .with_ack_lsn(acked.min(start).into())
    .with_status_interval(config.status_interval)
    .with_wakeup_interval(Duration::from_secs(10))
    .with_buffer_size(STREAM_BUFFER_EVENTS)
    .with_options(SESSION_OPTIONS)
    .with_application_name(
        pg.application_name
            .clone()
            .unwrap_or_else(|| "outbox-relay".to_owned()),
    ))
}

/// The server's current WAL end (IDENTIFY_SYSTEM on a replication session,
/// so it needs no privilege beyond REPLICATION).
pub async fn wal_end(config: &Config) -> Result<Lsn, SourceError> {
    let config = &setup::pin(config).await?;
    let stream_err = |source| SourceError::Stream {
        slot: config.slot.clone(),
        source,
    };
    let repl = replication_config(config, Lsn::ZERO, Lsn::ZERO)?;
    let mut client = ReplicationClient::connect_gated(repl)
        .await
        .map_err(stream_err)?;
    let system = client.identify_system().await.map_err(stream_err)?;
    Ok(system.xlogpos.into())
}

/// The server and timeline a stream runs on. A promotion changes the
/// timeline, and a failover to another host changes the host, even when the
/// system identifier (kept by a standby) stays the same.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerId {
    /// `host:port` as pinned from `--postgres-url`.
    pub addr: String,
    /// IDENTIFY_SYSTEM's system identifier.
    pub system_id: String,
    /// IDENTIFY_SYSTEM's timeline.
    pub timeline: u32,
}

/// Where a stream resumes on `current`, given the position the relay keeps
/// in memory. On the server and timeline the previous stream ran on, that
/// position. Elsewhere no later than the slot's confirmed position there:
/// the in-memory one may come from the old primary's keepalives, past the
/// point the new primary's WAL reached, and starting there would skip the new
/// primary's first transactions. An unknown confirmed position gives 0/0,
/// where the server starts from the slot's own.
pub fn resume_point(
    previous: Option<&ServerId>,
    current: &ServerId,
    in_memory: Lsn,
    slot_confirmed: Option<Lsn>,
) -> Lsn {
    match previous {
        Some(previous) if previous != current => in_memory.min(slot_confirmed.unwrap_or(Lsn::ZERO)),
        _ => in_memory,
    }
}

/// The logical replication stream of one slot.
pub struct ReplicationStream {
    client: ReplicationClient,
    slot: String,
    /// Where it runs.
    pub server: ServerId,
    /// Where it started: before the requested position after a promotion.
    pub start: Lsn,
}

impl ReplicationStream {
    /// Starts streaming at `start` while reporting `acked` as flushed until the
    /// pipeline acknowledges more.
    ///
    /// On first start both are the slot's confirmed position. After a
    /// reconnect, `start` is the end of the last transaction already received
    /// (its events are in flight, so asking for it again would only duplicate
    /// them) and `acked` is the ack frontier, which may be behind it. When
    /// the server or timeline differs from `previous`, the start moves back
    /// as [`resume_point`] says; [`ReplicationStream::start`] tells where.
    pub async fn start(
        config: &Config,
        start: Lsn,
        acked: Lsn,
        previous: Option<&ServerId>,
    ) -> Result<Self, SourceError> {
        // A server that went away mid-run is retried, like the stream itself.
        let config = &setup::pin(config).await.map_err(|e| match e {
            SourceError::Connect { url, reason, .. } => SourceError::NoSuitableHost {
                attrs: config.postgres.target_session_attrs.as_str(),
                tried: format!("{url}: {reason}"),
            },
            e => e,
        })?;
        let repl = replication_config(config, start, acked)?;
        let pg = &config.postgres;
        // TLS and authentication failures are configuration problems.
        let stream_err = |source: PgWireError| {
            if source.is_tls() || source.is_auth() {
                SourceError::ReplicationConnect {
                    url: pg.redacted(),
                    hint: tls::replication_hint(&source),
                    source,
                }
            } else {
                SourceError::Stream {
                    slot: config.slot.clone(),
                    source,
                }
            }
        };
        // IDENTIFY_SYSTEM and the slot's position on the session that then
        // streams, so both describe the server the stream opens on.
        let timeout = Duration::from_secs(30);
        let opened = async {
            let mut client = ReplicationClient::connect_gated(repl).await?;
            let system = client.identify_system().await?;
            let server = ServerId {
                addr: format!("{}:{}", pg.host, pg.port),
                system_id: system.system_id,
                timeline: system.timeline,
            };
            let mut start = start;
            if previous.is_some_and(|p| *p != server) {
                let confirmed = slot_confirmed(&mut client, &config.slot).await;
                start = resume_point(previous, &server, start, confirmed);
                // The gated session's start position is fixed: dropping it
                // ends it, and another starts where decided.
                drop(client);
                let repl = replication_config(config, start, acked)
                    .map_err(|e| PgWireError::Internal(e.to_string()))?;
                client = ReplicationClient::connect(repl).await?;
            } else {
                client.start().await?;
            }
            client.wait_started().await?;
            Ok((client, server, start))
        };
        let (client, server, start) = match tokio::time::timeout(timeout, opened).await {
            Ok(Ok(opened)) => opened,
            Ok(Err(source)) => return Err(stream_err(source)),
            Err(_) => {
                return Err(SourceError::StartTimeout {
                    slot: config.slot.clone(),
                    timeout,
                });
            }
        };
        Ok(ReplicationStream {
            client,
            slot: config.slot.clone(),
            server,
            start,
        })
    }
}

/// The Postgres side as the pipeline sees it: replication sessions and the
/// few control queries streaming needs. [`PgSource`] is the real one; a
/// simulation implements it without a server.
pub trait Source: Send {
    /// One replication session.
    type Stream: Stream;

    /// Starts a session at `from` (the end of the last transaction received)
    /// while reporting `acked` as confirmed. The stream says where it really
    /// started: lower than `from` after a promotion.
    fn start(
        &mut self,
        from: Lsn,
        acked: Lsn,
    ) -> impl Future<Output = Result<Self::Stream, SourceError>> + Send;

    /// The root of the partition tree `relation_id` belongs to (`None` for a plain table).
    fn partition_root(
        &mut self,
        relation_id: u32,
    ) -> impl Future<Output = Result<Option<TableName>, SourceError>> + Send;

    /// Whether the publication is as found at start-up, so positions decoded
    /// before the check may be confirmed: `Ok(false)` when the check could
    /// not run, `Err` when it changed (dropped, re-created, a table dropped
    /// from it and added again): rows were skipped.
    fn check_publication(&mut self) -> impl Future<Output = Result<bool, SourceError>> + Send;

    /// The current end of the WAL (`Lsn(u64::MAX)` when unknown): records
    /// past it cannot be this relay's (exactly-once's foreign-writer check).
    fn wal_end(&mut self) -> impl Future<Output = Lsn> + Send;

    /// A fatal error with what the server can tell about it (an invalidated
    /// slot's reason); by default the error as it is.
    fn explain(&mut self, error: SourceError) -> impl Future<Output = SourceError> + Send {
        async { error }
    }
}

/// One replication session.
pub trait Stream: Send {
    /// Where the session started.
    fn started_at(&self) -> Lsn;
    /// The server and timeline it runs on.
    fn server(&self) -> &ServerId;
    /// The next event. A transient break is an error whose
    /// [`SourceError::recovery`] is [`Recovery::Reconnect`] (e.g. [`SourceError::StreamEnded`]).
    fn recv(&mut self) -> impl Future<Output = Result<ReplicationEvent, SourceError>> + Send;
    /// Confirms `lsn` to Postgres: the only way a position reaches it.
    fn ack(&self, lsn: Lsn);
    /// Ends the session once `wait_for` has been reported (or `timeout` ran out).
    fn close(self, wait_for: Lsn, timeout: Duration) -> impl Future<Output = ()> + Send;
}

/// The real [`Source`]: pgwire-replication sessions and a control connection
/// (reopened when it breaks) for the lookups.
pub struct PgSource {
    config: Config,
    control: Option<tokio_postgres::Client>,
    /// The server and timeline the last session ran on.
    server: Option<ServerId>,
    /// The publication as last found (first at start-up): a change shows
    /// rows that were never decoded.
    publication: setup::Publication,
}

impl PgSource {
    /// A source for `config`'s server, slot and `publication` as found at start-up.
    pub fn new(config: Config, publication: setup::Publication) -> Self {
        PgSource {
            config,
            control: None,
            server: None,
            publication,
        }
    }
}

/// The control connection in `slot`, opened (again) when needed.
async fn control<'a>(
    slot: &'a mut Option<tokio_postgres::Client>,
    config: &Config,
) -> Result<&'a tokio_postgres::Client, SourceError> {
    let client = match slot.take() {
        Some(client) if !client.is_closed() => client,
        _ => setup::connect(config).await?,
    };
    Ok(slot.insert(client))
}

impl Source for PgSource {
    type Stream = ReplicationStream;

    async fn start(&mut self, from: Lsn, acked: Lsn) -> Result<ReplicationStream, SourceError> {
        let stream =
            ReplicationStream::start(&self.config, from, acked, self.server.as_ref()).await?;
        self.server = Some(stream.server.clone());
        Ok(stream)
    }

    async fn partition_root(&mut self, relation_id: u32) -> Result<Option<TableName>, SourceError> {
        let lookup_err = |source| SourceError::PartitionLookup {
            relation_id,
            source: Box::new(source),
        };
        let client = control(&mut self.control, &self.config)
            .await
            .map_err(lookup_err)?;
        let row = client
            .query_opt(
                "SELECT n.nspname::text, c.relname::text FROM pg_class c \
                 JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE c.oid = pg_partition_root($1::oid)",
                &[&relation_id],
            )
            .await
            .map_err(|source| {
                lookup_err(SourceError::Query {
                    what: "look up a relation's partition root",
                    source,
                })
            })?;
        Ok(row.map(|r| TableName {
            schema: r.get(0),
            name: r.get(1),
        }))
    }

    async fn check_publication(&mut self) -> Result<bool, SourceError> {
        let client = match control(&mut self.control, &self.config).await {
            Ok(client) => client,
            // A server shutting down commits nothing more but waits for its
            // walsender's last position to be confirmed; only a drop in the
            // last status interval before the shutdown would go unnoticed.
            Err(SourceError::Connect { source, .. })
                if source.code() == Some(&tokio_postgres::error::SqlState::CANNOT_CONNECT_NOW) =>
            {
                return Ok(true);
            }
            Err(error) => {
                tracing::warn!(%error, "cannot check the publication; confirming nothing until it can be checked");
                return Ok(false);
            }
        };
        match setup::verify_publication(client, &self.config, &[]).await {
            Ok(found) => {
                if let Some(e) = found.changed_since(&self.publication, &self.config.publication) {
                    return Err(e);
                }
                self.publication = found;
                Ok(true)
            }
            Err(SourceError::Query { what, source }) => {
                tracing::warn!(what, error = %source, "cannot check the publication; confirming nothing until it can be checked");
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    async fn wal_end(&mut self) -> Lsn {
        wal_end(&self.config).await.unwrap_or(Lsn(u64::MAX))
    }

    /// A permanent stream error on a slot that Postgres reports invalidated
    /// (the stream says only "can no longer get changes", or, on a standby,
    /// names the primary's `wal_level`) becomes [`SourceError::SlotInvalidatedBy`].
    async fn explain(&mut self, error: SourceError) -> SourceError {
        if error.recovery() != Recovery::Fatal || !matches!(error, SourceError::Stream { .. }) {
            return error;
        }
        let Ok(client) = control(&mut self.control, &self.config).await else {
            return error;
        };
        match setup::slot_invalidation(client, &self.config.slot).await {
            Ok(Some(remedy)) => SourceError::SlotInvalidatedBy {
                slot: self.config.slot.clone(),
                remedy,
            },
            _ => error,
        }
    }
}

impl Stream for ReplicationStream {
    fn started_at(&self) -> Lsn {
        self.start
    }

    fn server(&self) -> &ServerId {
        &self.server
    }

    async fn recv(&mut self) -> Result<ReplicationEvent, SourceError> {
        match self.client.recv().await {
            Ok(Some(event)) => Ok(event),
            Ok(None) => Err(SourceError::StreamEnded {
                slot: self.slot.clone(),
            }),
            Err(source) => Err(SourceError::Stream {
                slot: self.slot.clone(),
                source,
            }),
        }
    }

    /// Reported within the status interval.
    fn ack(&self, lsn: Lsn) {
        self.client.update_applied_lsn(lsn.into());
    }

    async fn close(mut self, wait_for: Lsn, timeout: Duration) {
        let deadline = tokio::time::Instant::now() + timeout;
        let reported = |c: &ReplicationClient| Lsn::from(c.metrics().last_applied_lsn());
        while reported(&self.client) < wait_for && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if let Err(e) = self.client.shutdown().await {
            tracing::debug!(error = %e, "replication stream ended with an error during shutdown");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(addr: &str, timeline: u32) -> ServerId {
        ServerId {
            addr: addr.to_owned(),
            system_id: "7300000000000000001".to_owned(),
            timeline,
        }
    }

    #[test]
    fn a_reconnect_to_the_same_server_resumes_after_the_last_transaction_received() {
        let db1 = server("127.0.0.1:5432", 1);
        assert_eq!(resume_point(None, &db1, Lsn(500), Some(Lsn(100))), Lsn(500));
        assert_eq!(
            resume_point(Some(&db1), &db1, Lsn(500), Some(Lsn(100))),
            Lsn(500)
        );
    }

    #[test]
    fn a_promotion_resumes_no_later_than_the_new_servers_slot() {
        let old = server("127.0.0.1:5432", 1);
        // Another host, or the same address on a new timeline (a DNS endpoint).
        for new in [server("127.0.0.1:5433", 1), server("127.0.0.1:5432", 2)] {
            assert_eq!(
                resume_point(Some(&old), &new, Lsn(500), Some(Lsn(120))),
                Lsn(120)
            );
            assert_eq!(
                resume_point(Some(&old), &new, Lsn(100), Some(Lsn(120))),
                Lsn(100)
            );
            // Unknown: 0/0 lets the server start from the slot's own position.
            assert_eq!(resume_point(Some(&old), &new, Lsn(500), None), Lsn::ZERO);
        }
    }
}
