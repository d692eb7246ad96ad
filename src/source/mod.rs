//! I/O: the Postgres side. Start-up checks, publication and slot
//! ([`setup`]), and the replication stream ([`ReplicationStream`]).
//!
//! The stream is a thin wrapper over pgwire-replication: it passes events
//! through and exposes exactly one way to move the slot, [`ReplicationStream::ack`],
//! which only the pipeline calls, and only with the ack frontier.

pub mod setup;
pub mod sql;

use std::time::Duration;

use pgwire_replication::{PgWireError, ReplicationClient, ReplicationConfig, ReplicationEvent};

use crate::config::{Config, SslMode};
use crate::lsn::Lsn;

/// Session settings for the walsender, so values arrive in one fixed text
/// form whatever the server's defaults (timestamps in ISO, UTC).
const SESSION_OPTIONS: &str =
    "-c datestyle=ISO,YMD -c timezone=UTC -c intervalstyle=postgres -c extra_float_digits=3";

/// Events buffered between the socket reader and the pipeline. Each holds at
/// most one WAL message (one row), so this bounds read-ahead memory.
const STREAM_BUFFER_EVENTS: usize = 1024;

/// Something went wrong on the Postgres side.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The control connection could not be opened.
    #[error("cannot connect to Postgres at {url}: {source}")]
    Connect {
        /// Redacted URL.
        url: String,
        /// Driver error.
        #[source]
        source: tokio_postgres::Error,
    },
    /// TLS requested but not available in this build.
    #[error(
        "cannot connect to Postgres at {url}: sslmode require/verify-ca/verify-full is not supported yet; use sslmode=disable or prefer"
    )]
    TlsUnsupported {
        /// Redacted URL.
        url: String,
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
    /// The existing publication does not publish inserts.
    #[error(
        "publication {publication:?} does not publish inserts; run ALTER PUBLICATION \
         {publication} SET (publish = 'insert'); or use another --publication"
    )]
    PublicationNoInsert {
        /// The publication.
        publication: String,
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
    /// A catalog query failed.
    #[error("Postgres query failed ({what}): {source}")]
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
    /// The server did not accept START_REPLICATION in time.
    #[error("replication stream from slot {slot:?} did not start within {timeout:?}")]
    StartTimeout {
        /// The slot.
        slot: String,
        /// How long we waited.
        timeout: Duration,
    },
}

/// The logical replication stream of one slot.
pub struct ReplicationStream {
    client: ReplicationClient,
    slot: String,
}

impl ReplicationStream {
    /// Starts streaming from `start` (the slot's confirmed position), which is
    /// also what is reported as flushed until the pipeline acknowledges more.
    pub async fn start(config: &Config, start: Lsn) -> Result<Self, SourceError> {
        let pg = &config.postgres;
        let tls = match pg.sslmode {
            SslMode::Disable | SslMode::Prefer => pgwire_replication::TlsConfig::disabled(),
            _ => return Err(SourceError::TlsUnsupported { url: pg.redacted() }),
        };
        let repl = ReplicationConfig::new(
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
        .with_status_interval(config.status_interval)
        .with_wakeup_interval(Duration::from_secs(10))
        .with_buffer_size(STREAM_BUFFER_EVENTS)
        .with_options(SESSION_OPTIONS)
        .with_application_name(
            pg.application_name
                .clone()
                .unwrap_or_else(|| "outbox-relay".to_owned()),
        );
        let stream_err = |source| SourceError::Stream {
            slot: config.slot.clone(),
            source,
        };
        let mut client = ReplicationClient::connect(repl).await.map_err(stream_err)?;
        let timeout = Duration::from_secs(30);
        match tokio::time::timeout(timeout, client.wait_started()).await {
            Ok(Ok(())) => {}
            Ok(Err(source)) => return Err(stream_err(source)),
            Err(_) => {
                return Err(SourceError::StartTimeout {
                    slot: config.slot.clone(),
                    timeout,
                });
            }
        }
        Ok(ReplicationStream {
            client,
            slot: config.slot.clone(),
        })
    }

    /// The next event; `None` when the server ended the stream.
    pub async fn recv(&mut self) -> Result<Option<ReplicationEvent>, SourceError> {
        self.client
            .recv()
            .await
            .map_err(|source| SourceError::Stream {
                slot: self.slot.clone(),
                source,
            })
    }

    /// Reports `lsn` to Postgres as flushed (sent within the status interval).
    /// Callers pass only the ack frontier.
    pub fn ack(&self, lsn: Lsn) {
        self.client.update_applied_lsn(lsn.into());
    }

    /// The position last written to the server in a status update.
    pub fn reported(&self) -> Lsn {
        self.client.metrics().last_applied_lsn().into()
    }

    /// Ends the stream after the last acknowledgement has been written.
    pub async fn close(mut self, wait_for: Lsn, timeout: Duration) {
        let deadline = tokio::time::Instant::now() + timeout;
        while self.reported() < wait_for && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if let Err(e) = self.client.shutdown().await {
            tracing::debug!(error = %e, "replication stream ended with an error during shutdown");
        }
    }
}
