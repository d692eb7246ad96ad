//! I/O: the Postgres side. [`setup`] checks and creates the publication and
//! slot; [`PgSource`] streams with pgwire-replication and looks things up on a
//! control connection. [`Stream::ack`] is the only way a position reaches the
//! slot, and only the pipeline calls it, with the ack frontier.

pub mod cleanup;
mod event;
pub mod failover;
pub mod heartbeat;
pub mod lineage;
pub mod setup;
pub mod shard;
pub mod slot_monitor;
pub mod sql;
mod tls;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use pgwire_replication::{PgWireError, ReplicationClient, ReplicationConfig};
use tokio_postgres::Client;

pub use event::SourceEvent;
pub use tls::TlsError;

use crate::config::Config;
use crate::lsn::Lsn;
use crate::observability::Chain;
use crate::observability::health::SlotObservation;
use crate::outbox::TableName;
use crate::outbox::connect::ColumnFacts;

/// The walsender's settings, so values arrive in one text form (ISO, UTC).
const SESSION_OPTIONS: &str =
    "-c datestyle=ISO,YMD -c timezone=UTC -c intervalstyle=postgres -c extra_float_digits=3";

/// WAL messages read ahead of the pipeline: pgwire-replication's channel holds all but one,
/// its reader the one waiting for room. A message can be a 1 GB row, so the pipeline reserves
/// room for these many of the largest recent rows out of `--max-in-flight-bytes`. Three, not
/// two: the reader then finds room for every other message at once, which halves its
/// hand-offs to the pipeline (their cost is in docs/benchmark.md).
pub const READ_AHEAD: usize = 3;

/// The stream's settings for a control session that reads rows (`peek`, `backfill`).
pub const SESSION_FORMATS: &str = "SET datestyle = 'ISO, YMD'; SET timezone = 'UTC'; \
     SET intervalstyle = 'postgres'; SET extra_float_digits = 3";

/// Something went wrong on the Postgres side; the message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The control connection could not be opened (`url` redacted).
    #[error("cannot connect to Postgres at {url}")]
    Connect {
        /// The server's URL, password redacted.
        url: String,
        /// The connection error.
        #[source]
        source: PgError,
    },
    /// The TLS settings in the URL cannot be used (a file, a missing root CA).
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The control connection's TLS handshake failed; `hint` says what to check.
    #[error("TLS handshake with Postgres at {url} failed ({hint})")]
    TlsHandshake {
        /// The server's URL, password redacted.
        url: String,
        /// What to check in the TLS settings, from the handshake failure.
        hint: &'static str,
        /// The connection error.
        #[source]
        source: PgError,
    },
    /// The replication connection was refused (TLS or authentication).
    #[error("cannot open the replication connection to {url} ({hint})")]
    ReplicationConnect {
        /// The server's URL, password redacted.
        url: String,
        /// What to check: `pg_hba.conf`'s replication lines or the TLS settings.
        hint: &'static str,
        /// The replication client's error.
        #[source]
        source: PgWireError,
    },
    /// A check of the server, role, tables, publication or slot failed: the fix.
    #[error("{0}")]
    Misconfigured(String),
    /// The publication changed while streaming: rows committed meanwhile were never decoded.
    #[error(
        "publication {publication:?} {change}; outbox rows committed since the relay last \
         checked it were not decoded, so it stops without confirming them. {}",
        crate::remedy::PUBLICATION_CHANGED
    )]
    PublicationChanged {
        /// The publication name.
        publication: String,
        /// What happened to it, e.g. "was dropped and re-created".
        change: String,
    },
    /// The control connection did not answer a publication check in time.
    #[error(
        "Postgres did not answer the publication check within {timeout:?} on the control connection"
    )]
    ControlTimeout {
        /// How long the check waited.
        timeout: Duration,
    },
    /// The slot is missing where this relay streamed from it before.
    #[error(
        "replication slot {slot:?} is missing on {url}, where this relay has streamed from it \
         before ({recorded}): a standby promoted without it (PostgreSQL 16 or older, or no \
         --slot-failover), a slot dropped other than by `outbox-relay drop-slot`, or a standby \
         of that server. {}",
        crate::remedy::LOST_SLOT
    )]
    SlotLost {
        /// The replication slot name.
        slot: String,
        /// The server's URL, password redacted.
        url: String,
        /// Where and when the slot's creation was recorded.
        recorded: String,
    },
    /// The lineage topic cannot be read or written: the relay does not stream.
    #[error(transparent)]
    Lineage(#[from] crate::sink::lineage::LineageError),
    /// A query failed; `what` says what it was for.
    #[error("Postgres query failed ({what})")]
    Query {
        /// What the query was for, e.g. "probe the server's role".
        what: String,
        /// The query error.
        #[source]
        source: PgError,
    },
    /// The replication stream failed.
    #[error("replication stream from slot {slot:?} failed")]
    Stream {
        /// The replication slot name.
        slot: String,
        /// The replication client's error.
        #[source]
        source: PgWireError,
    },
    /// The server closed the stream.
    #[error(
        "Postgres ended the replication stream of slot {slot:?} (walsender terminated or server \
         shutting down)"
    )]
    StreamEnded {
        /// The replication slot name.
        slot: String,
    },
    /// The server did not accept START_REPLICATION in time.
    #[error("replication stream from slot {slot:?} did not start within {timeout:?}")]
    StartTimeout {
        /// The replication slot name.
        slot: String,
        /// How long the relay waited for the stream to start.
        timeout: Duration,
    },
    /// No server of the URL satisfies `target_session_attrs` (mid-failover): retried.
    #[error("no server of --postgres-url is {attrs} (target_session_attrs): {tried}")]
    NoSuitableHost {
        /// The `target_session_attrs` value, e.g. `read-write`.
        attrs: &'static str,
        /// Each `host:port` tried and why it was passed over, `; `-separated.
        tried: String,
    },
    /// A relation's partition root or an outbox table's NOT NULL and DEFAULT could not be
    /// looked up mid-stream: the stream restarts.
    #[error("cannot {what} of relation OID {relation_id}")]
    Lookup {
        /// What was looked up, e.g. "look up the partition root".
        what: &'static str,
        /// OID of the relation.
        relation_id: u32,
        /// The lookup's error.
        #[source]
        source: Box<SourceError>,
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
                    // object_not_in_prerequisite_state (slot invalidated),
                    // invalid_parameter_value, invalid_authorization.
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
            | SourceError::Lookup { .. } => Recovery::Reconnect,
            _ => Recovery::Fatal,
        }
    }

    /// Whether the stream failed because the slot was dropped.
    pub fn is_slot_dropped(&self) -> bool {
        matches!(self, SourceError::Stream { source: PgWireError::Server(m), .. }
            if sqlstate(m) == Some("42704") && m.contains("replication slot"))
    }
}

fn stream_err(slot: &str) -> impl Fn(PgWireError) -> SourceError + '_ {
    move |source| SourceError::Stream {
        slot: slot.to_owned(),
        source,
    }
}

/// A tokio-postgres error as the relay tells it: a server error's message with its SQLSTATE,
/// detail and hint on one line (tokio-postgres' own `Display` says only "db error"); any other
/// keeps its causes as its error chain.
#[derive(Debug)]
pub struct PgError(pub tokio_postgres::Error);

impl std::fmt::Display for PgError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Some(db) = self.0.as_db_error() else {
            return write!(f, "{}", self.0);
        };
        write!(f, "{} (SQLSTATE {})", db.message(), db.code().code())?;
        for (label, text) in [("detail", db.detail()), ("hint", db.hint())] {
            if let Some(text) = text {
                write!(f, "; {label}: {text}")?;
            }
        }
        Ok(())
    }
}

impl std::error::Error for PgError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        // A server error's whole story is in the message above.
        match self.0.as_db_error() {
            Some(_) => None,
            None => std::error::Error::source(&self.0),
        }
    }
}

impl From<tokio_postgres::Error> for PgError {
    fn from(error: tokio_postgres::Error) -> Self {
        PgError(error)
    }
}

/// The SQLSTATE in pgwire-replication's rendering of a server error.
fn sqlstate(message: &str) -> Option<&str> {
    let at = message.find("SQLSTATE ")? + "SQLSTATE ".len();
    message.get(at..at + 5)
}

/// The replication session's settings: from `start`, confirming `acked` until told more.
fn replication_config(
    config: &Config,
    start: Lsn,
    acked: Lsn,
) -> Result<ReplicationConfig, SourceError> {
    let pg = &config.postgres;
    let tls = tls::replication_tls(pg)?;
    let name = pg.application_name.as_deref().unwrap_or("outbox-relay");
    Ok(ReplicationConfig::new(
        pg.host.clone(),
        pg.user.clone(),
        pg.password.clone().unwrap_or_default(),
        pg.dbname.clone(),
        config.flags.slot.clone(),
        config.flags.publication.clone(),
    )
    .with_port(pg.port)
    .with_tls(tls)
    .with_start_lsn(start.into())
    .with_ack_lsn(acked.min(start).into())
    .with_status_interval(config.flags.status_interval)
    .with_wakeup_interval(Duration::from_secs(10))
    .with_buffer_size(READ_AHEAD - 1)
    .with_options(SESSION_OPTIONS)
    .with_application_name(name))
}

/// A replication session for commands (IDENTIFY_SYSTEM, ALTER_REPLICATION_SLOT).
async fn command_session(config: &Config) -> Result<ReplicationClient, SourceError> {
    let config = &setup::pin(config).await?;
    let repl = replication_config(config, Lsn::ZERO, Lsn::ZERO)?;
    ReplicationClient::connect_gated(repl)
        .await
        .map_err(replication_err(config))
}

/// A replication connection's error: TLS and authentication failures are configuration
/// problems, with what to check.
fn replication_err(config: &Config) -> impl Fn(PgWireError) -> SourceError + '_ {
    move |source| match source.is_tls() || source.is_auth() {
        true => SourceError::ReplicationConnect {
            url: config.postgres.redacted(),
            hint: tls::replication_hint(&source),
            source,
        },
        false => stream_err(&config.flags.slot)(source),
    }
}

/// The server and timeline a stream runs on: a promotion changes the timeline,
/// a failover to another host the address; a standby keeps the system id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerId {
    /// `host:port` as pinned from `--postgres-url`.
    pub addr: String,
    /// IDENTIFY_SYSTEM's system identifier.
    pub system_id: String,
    /// IDENTIFY_SYSTEM's timeline.
    pub timeline: u32,
}

/// Where a stream on `current` resumes: the in-memory position on the previous server and
/// timeline; elsewhere no later than the slot's confirmed position there, as the in-memory one
/// may be past the new primary's WAL. Unknown gives 0/0: the slot's own.
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

/// The slot's confirmed position, read on a gated session.
async fn slot_confirmed(client: &mut ReplicationClient, slot: &str) -> Option<Lsn> {
    let sql = format!(
        "SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = {}",
        sql::quote_literal(slot)
    );
    let rows = client.simple_query(&sql).await.ok()?;
    let text = rows.first()?.first()?.as_ref()?;
    std::str::from_utf8(text).ok()?.parse().ok()
}

/// The Postgres side as the pipeline sees it; tests implement it without a server.
pub trait Source: Send {
    /// One replication session.
    type Stream: Stream;

    /// Starts a session at `from` (the end of the last transaction received),
    /// reporting `acked` as confirmed; after a promotion it starts lower.
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

    /// The `NOT NULL` and `DEFAULT` of table `relation_id`'s columns, which Debezium's JSON
    /// formats write (asked for only then; a source without a catalog has none).
    fn column_facts(
        &mut self,
        relation_id: u32,
    ) -> impl Future<Output = Result<Vec<ColumnFacts>, SourceError>> + Send {
        let _ = relation_id;
        async { Ok(Vec::new()) }
    }

    /// What a publication check brings back to [`Source::publication_checked`].
    type Check: Send + 'static;

    /// A check that the publication is still the one found at start-up, as a future that
    /// borrows nothing: the stream and the deliveries go on while it waits on the server.
    fn check_publication(&mut self) -> BoxFuture<'static, Self::Check>;

    /// Whether positions decoded before `check` began may be confirmed: `Ok(false)` when
    /// the publication could not be checked, `Err` when it changed (rows were skipped).
    fn publication_checked(&mut self, check: Self::Check) -> Result<bool, SourceError>;

    /// The WAL's end (`Lsn(u64::MAX)` when unknown), for exactly-once's foreign-writer check.
    fn wal_end(&mut self) -> impl Future<Output = Lsn> + Send;

    /// A fatal error with what the server can tell about it (an invalidated slot's reason).
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
    /// The next event; a transient break has [`Recovery::Reconnect`].
    fn recv(&mut self) -> impl Future<Output = Result<SourceEvent, SourceError>> + Send;
    /// Confirms `lsn` to Postgres: the only way a position reaches it.
    fn ack(&self, lsn: Lsn);
    /// Ends the session once `wait_for` has been reported (or `timeout` ran out).
    fn close(self, wait_for: Lsn, timeout: Duration) -> impl Future<Output = ()> + Send;
}

/// The real [`Source`], with a control connection reopened when it breaks.
pub struct PgSource {
    /// Shared with the publication checks in flight.
    config: Arc<Config>,
    control: Option<Client>,
    /// The server and timeline the last session ran on.
    server: Option<ServerId>,
    /// The publication as last found: a change shows rows never decoded.
    publication: setup::Publication,
}

impl PgSource {
    /// A source for `config`, with `publication` as found at start-up.
    pub fn new(config: Config, publication: setup::Publication) -> Self {
        PgSource {
            config: Arc::new(config),
            control: None,
            server: None,
            publication,
        }
    }
}

/// A failed mid-stream look-up of relation `relation_id`, which restarts the stream.
fn lookup_err(what: &'static str, relation_id: u32) -> impl Fn(SourceError) -> SourceError {
    move |source| SourceError::Lookup {
        what,
        relation_id,
        source: Box::new(source),
    }
}

/// A publication check's findings, with the control connection it took along.
pub struct PublicationCheck {
    client: Option<Client>,
    found: Result<Found, SourceError>,
}

/// What a publication check found.
enum Found {
    Publication(setup::Publication),
    /// The server is shutting down: it commits nothing more, and waits for its walsender's
    /// last position to be confirmed; only a drop in the last status interval goes unnoticed.
    ShuttingDown,
    /// The check could not run (the error); nothing is confirmed until one can.
    Unchecked(SourceError),
}

/// How long a publication check may wait on the server before it counts as not run (and its
/// connection is dropped, so the next check opens a new one): a control connection that went
/// silent (a host gone without a reset) must not pin the checks for the kernel's TCP timeout.
const CHECK_TIMEOUT: Duration = Duration::from_secs(10);

async fn check(mut client: Option<Client>, config: Arc<Config>) -> PublicationCheck {
    let checking = async {
        let client = match control(&mut client, &config).await {
            Ok(client) => client,
            Err(SourceError::Connect { source, .. })
                if source.0.code()
                    == Some(&tokio_postgres::error::SqlState::CANNOT_CONNECT_NOW) =>
            {
                return Ok(Found::ShuttingDown);
            }
            Err(error) => return Ok(Found::Unchecked(error)),
        };
        match setup::verify_publication(client, &config, &[]).await {
            Ok(publication) => Ok(Found::Publication(publication)),
            Err(error @ SourceError::Query { .. }) => Ok(Found::Unchecked(error)),
            Err(error) => Err(error),
        }
    };
    let found = match tokio::time::timeout(CHECK_TIMEOUT, checking).await {
        Ok(found) => found,
        Err(_) => {
            client = None;
            let timeout = CHECK_TIMEOUT;
            Ok(Found::Unchecked(SourceError::ControlTimeout { timeout }))
        }
    };
    PublicationCheck { client, found }
}

/// The control connection in `slot`, opened (again) when needed.
async fn control<'a>(
    slot: &'a mut Option<Client>,
    config: &Config,
) -> Result<&'a Client, SourceError> {
    let client = match slot.take() {
        Some(client) if !client.is_closed() => client,
        _ => setup::connect(config).await?,
    };
    Ok(slot.insert(client))
}

impl Source for PgSource {
    type Stream = ReplicationStream;
    type Check = PublicationCheck;

    /// On another server or timeline, the start moves back as [`resume_point`] says.
    async fn start(&mut self, from: Lsn, acked: Lsn) -> Result<ReplicationStream, SourceError> {
        // A server that went away mid-run is retried, like the stream itself.
        let config = &setup::pin(&self.config).await.map_err(|e| match e {
            SourceError::Connect { url, source } => SourceError::NoSuitableHost {
                attrs: self.config.postgres.target_session_attrs.as_str(),
                tried: format!("{url}: {}", Chain(&source)),
            },
            e => e,
        })?;
        let timeout = Duration::from_secs(30);
        let opening = open(config, from, acked, self.server.as_ref());
        let stream = tokio::time::timeout(timeout, opening).await.map_err(|_| {
            let slot = config.flags.slot.clone();
            SourceError::StartTimeout { slot, timeout }
        })??;
        self.server = Some(stream.server.clone());
        Ok(stream)
    }

    async fn partition_root(&mut self, relation_id: u32) -> Result<Option<TableName>, SourceError> {
        let lookup = async {
            control(&mut self.control, &self.config)
                .await?
                .query_opt(
                    "SELECT n.nspname::text, c.relname::text FROM pg_class c \
                     JOIN pg_namespace n ON n.oid = c.relnamespace \
                     WHERE c.oid = pg_partition_root($1::oid)",
                    &[&relation_id],
                )
                .await
                .map_err(setup::query_err("look up a relation's partition root"))
        };
        let row = lookup
            .await
            .map_err(lookup_err("look up the partition root", relation_id))?;
        Ok(row.map(|r| TableName {
            schema: r.get(0),
            name: r.get(1),
        }))
    }

    async fn column_facts(&mut self, relation_id: u32) -> Result<Vec<ColumnFacts>, SourceError> {
        let lookup = async {
            let client = control(&mut self.control, &self.config).await?;
            setup::column_facts(client, &relation_id.to_string()).await
        };
        lookup
            .await
            .map_err(lookup_err("read the columns", relation_id))
    }

    fn check_publication(&mut self) -> BoxFuture<'static, PublicationCheck> {
        Box::pin(check(self.control.take(), Arc::clone(&self.config)))
    }

    fn publication_checked(&mut self, check: PublicationCheck) -> Result<bool, SourceError> {
        // A look-up while the check ran may have opened another connection: keep that one.
        if self.control.is_none() {
            self.control = check.client;
        }
        let found = match check.found? {
            Found::Publication(found) => found,
            Found::ShuttingDown => return Ok(true),
            Found::Unchecked(error) => {
                // From 18 on, a dropped publication does not fail the stream: only a checked
                // position is confirmed.
                let effect = match self.publication.server_version >= 180_000 {
                    true => {
                        "confirming the slot's position no further than the last check until one runs"
                    }
                    false => {
                        "the slot's position is confirmed as before (until PostgreSQL 18 a dropped publication fails the stream itself)"
                    }
                };
                tracing::warn!(error = %Chain(&error), "cannot check the publication, trying again with back-off (up to a minute); {effect}");
                return Ok(false);
            }
        };
        // A new OID, or a new catalog row for a table: rows in between were never decoded.
        let earlier = &self.publication.members;
        let change = if found.oid != self.publication.oid {
            "was dropped and re-created".to_owned()
        } else if let Some((table, _)) = found.members.iter().find(|m| !earlier.contains(m)) {
            format!(
                "stopped publishing {table} and published it again (ALTER PUBLICATION ... DROP \
                 TABLE, then ADD TABLE; or SET TABLE with another row filter)"
            )
        } else {
            self.publication = found;
            return Ok(true);
        };
        let publication = self.config.flags.publication.clone();
        Err(SourceError::PublicationChanged {
            publication,
            change,
        })
    }

    async fn wal_end(&mut self) -> Lsn {
        let Ok(mut client) = command_session(&self.config).await else {
            return Lsn(u64::MAX);
        };
        let system = client.identify_system().await;
        system.map_or(Lsn(u64::MAX), |system| system.xlogpos.into())
    }

    /// A fatal stream error on a slot Postgres reports invalidated (the stream
    /// says only "can no longer get changes") gets the reason and the remedy.
    async fn explain(&mut self, error: SourceError) -> SourceError {
        if error.recovery() != Recovery::Fatal || !matches!(error, SourceError::Stream { .. }) {
            return error;
        }
        let Ok(client) = control(&mut self.control, &self.config).await else {
            return error;
        };
        let slot = &self.config.flags.slot;
        let Ok(SlotObservation::Seen(status)) = slot_monitor::poll(client, slot).await else {
            return error;
        };
        match status.invalidated() {
            Some(reason) => SourceError::Misconfigured(format!(
                "replication slot {slot:?}: {}",
                crate::remedy::invalidated_slot(&reason)
            )),
            None => error,
        }
    }
}

/// Opens a session; IDENTIFY_SYSTEM and the slot's position are read on it,
/// so both describe the server it streams from.
async fn open(
    config: &Config,
    mut start: Lsn,
    acked: Lsn,
    previous: Option<&ServerId>,
) -> Result<ReplicationStream, SourceError> {
    let failed = replication_err(config);
    let repl = replication_config(config, start, acked)?;
    let mut client = ReplicationClient::connect_gated(repl)
        .await
        .map_err(&failed)?;
    let system = client.identify_system().await.map_err(&failed)?;
    let server = ServerId {
        addr: format!("{}:{}", config.postgres.host, config.postgres.port),
        system_id: system.system_id,
        timeline: system.timeline,
    };
    if previous.is_some_and(|p| *p != server) {
        let confirmed = slot_confirmed(&mut client, &config.flags.slot).await;
        start = resume_point(previous, &server, start, confirmed);
        // A gated session's start position is fixed: end it, start another.
        drop(client);
        let repl = replication_config(config, start, acked)?;
        client = ReplicationClient::connect(repl).await.map_err(&failed)?;
    } else {
        client.start().await.map_err(&failed)?;
    }
    client.wait_started().await.map_err(&failed)?;
    Ok(ReplicationStream {
        client,
        slot: config.flags.slot.clone(),
        server,
        start,
    })
}

/// The logical replication stream of one slot.
pub struct ReplicationStream {
    client: ReplicationClient,
    slot: String,
    server: ServerId,
    /// Before the requested position after a promotion.
    start: Lsn,
}

impl Stream for ReplicationStream {
    fn started_at(&self) -> Lsn {
        self.start
    }

    fn server(&self) -> &ServerId {
        &self.server
    }

    async fn recv(&mut self) -> Result<SourceEvent, SourceError> {
        let ended = || SourceError::StreamEnded {
            slot: self.slot.clone(),
        };
        match self.client.recv().await {
            // `StoppedAt` ends the stream.
            Ok(Some(event)) => SourceEvent::from_driver(event).ok_or_else(ended),
            Ok(None) => Err(ended()),
            Err(source) => Err(stream_err(&self.slot)(source)),
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
