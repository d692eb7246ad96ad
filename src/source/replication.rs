//! [`PgSource`]: the real source, streaming with pgwire-replication and looking things up on
//! a control connection reopened when it breaks.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use pgwire_replication::{PgWireError, ReplicationClient, ReplicationConfig};
use tokio_postgres::Client;

use super::error::stream_err;
use super::{
    READ_AHEAD, Recovery, ServerId, Source, SourceError, SourceEvent, Stream, resume_point,
};
use crate::lsn::Lsn;
use crate::observability::Chain;
use crate::observability::health::SlotObservation;
use crate::outbox::TableName;
use crate::outbox::connect::ColumnFacts;
use crate::postgres::catalog;
use crate::postgres::catalog::publication::{self, Publication};
use crate::postgres::{Connector, PostgresError};
use crate::startup::checks;

/// What the stream needs of the configuration.
#[derive(Clone, Debug)]
pub struct StreamSettings {
    /// `--slot`.
    pub slot: String,
    /// `--publication`.
    pub publication: String,
    /// The outbox tables, which the publication must keep covering.
    pub tables: Vec<TableName>,
    /// `--status-interval`: how often the confirmed position is reported.
    pub status_interval: Duration,
}

/// The replication session's settings: from `start`, confirming `acked` until told more.
async fn replication_config(
    connector: &Connector,
    settings: &StreamSettings,
    start: Lsn,
    acked: Lsn,
) -> Result<ReplicationConfig, SourceError> {
    let session = connector
        .replication(&settings.slot, &settings.publication)
        .await?;
    Ok(session
        .with_start_lsn(start.into())
        .with_ack_lsn(acked.min(start).into())
        .with_status_interval(settings.status_interval)
        .with_wakeup_interval(Duration::from_secs(10))
        .with_buffer_size(READ_AHEAD - 1))
}

/// A replication connection's error: TLS and authentication failures are configuration
/// problems, with what to check; the rest are the stream's.
fn replication_err<'a>(
    connector: &'a Connector,
    slot: &'a str,
) -> impl Fn(PgWireError) -> SourceError + 'a {
    move |source| match connector.refused(source) {
        Ok(refused) => SourceError::Postgres(refused),
        Err(source) => stream_err(slot)(source),
    }
}

/// The slot's confirmed position, read on a gated session.
async fn slot_confirmed(client: &mut ReplicationClient, slot: &str) -> Option<Lsn> {
    let rows = client
        .simple_query(&catalog::slots::confirmed_query(slot))
        .await
        .ok()?;
    let text = rows.first()?.first()?.as_ref()?;
    std::str::from_utf8(text).ok()?.parse().ok()
}

/// The real [`Source`], with a control connection reopened when it breaks.
pub struct PgSource {
    /// Shared with the publication checks in flight.
    settings: Arc<StreamSettings>,
    connector: Connector,
    control: Option<Client>,
    /// The server and timeline the last session ran on.
    server: Option<ServerId>,
    /// The publication as last found: a change shows rows never decoded.
    publication: Publication,
}

impl PgSource {
    /// A source streaming as `settings` say from the server(s) of `connector`, with
    /// `publication` as found at start-up.
    pub fn new(connector: Connector, settings: StreamSettings, publication: Publication) -> Self {
        PgSource {
            connector,
            settings: Arc::new(settings),
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
    Publication(Publication),
    /// The server is shutting down: it commits nothing more, and waits for its walsender's
    /// last position to be confirmed; only a drop in the last status interval goes unnoticed.
    ShuttingDown,
    /// The check could not run (the error): retried with back-off; from PostgreSQL 18 on,
    /// nothing past the last check is confirmed until one runs.
    Unchecked(SourceError),
}

/// How long a publication check may wait on the server before it counts as not run (and its
/// connection is dropped, so the next check opens a new one): a control connection that went
/// silent (a host gone without a reset) must not pin the checks for the kernel's TCP timeout.
const CHECK_TIMEOUT: Duration = Duration::from_secs(10);

async fn check(
    mut client: Option<Client>,
    connector: Connector,
    settings: Arc<StreamSettings>,
) -> PublicationCheck {
    let checking = async {
        let client = match control(&mut client, &connector).await {
            Ok(client) => client,
            Err(SourceError::Postgres(PostgresError::Connect { source, .. }))
                if source.0.code()
                    == Some(&tokio_postgres::error::SqlState::CANNOT_CONNECT_NOW) =>
            {
                return Ok(Found::ShuttingDown);
            }
            Err(error) => return Ok(Found::Unchecked(error)),
        };
        match publication(client, &settings).await {
            Ok(publication) => Ok(Found::Publication(publication)),
            Err(error @ SourceError::Postgres(PostgresError::Query { .. })) => {
                Ok(Found::Unchecked(error))
            }
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

/// The publication as found while streaming; it must still exist, publish inserts and cover
/// the outbox tables.
async fn publication(
    client: &Client,
    settings: &StreamSettings,
) -> Result<Publication, SourceError> {
    let name = &settings.publication;
    let Some(options) = publication::options(client, name).await? else {
        return Err(SourceError::PublicationChanged {
            publication: name.clone(),
            change: "does not exist".to_owned(),
        });
    };
    let found = publication::publication(client, &options, &settings.tables).await?;
    let unfit = checks::publication_unfit(name, &options, &found.members, &settings.tables, &[]);
    match unfit {
        Some(refused) => Err(SourceError::Misconfigured(refused.to_string())),
        None => Ok(found),
    }
}

/// The control connection in `slot`, opened (again) when needed.
pub(super) async fn control<'a>(
    slot: &'a mut Option<Client>,
    connector: &Connector,
) -> Result<&'a Client, SourceError> {
    let client = match slot.take() {
        Some(client) if !client.is_closed() => client,
        _ => connector.control().await?,
    };
    Ok(slot.insert(client))
}

impl Source for PgSource {
    type Stream = ReplicationStream;
    type Check = PublicationCheck;

    /// On another server or timeline, the start moves back as [`resume_point`] says.
    async fn start(&mut self, from: Lsn, acked: Lsn) -> Result<ReplicationStream, SourceError> {
        // A server that went away mid-run is retried, like the stream itself.
        let pinned = self.connector.pin().await.map_err(|e| match e {
            PostgresError::Connect { url, source } => PostgresError::NoSuitableHost {
                attrs: self.connector.info().target_session_attrs.as_str(),
                tried: format!("{url}: {}", Chain(&source)),
            },
            e => e,
        })?;
        let timeout = Duration::from_secs(30);
        let opening = open(&pinned, &self.settings, from, acked, self.server.as_ref());
        let stream = tokio::time::timeout(timeout, opening).await.map_err(|_| {
            let slot = self.settings.slot.clone();
            SourceError::StartTimeout { slot, timeout }
        })??;
        self.server = Some(stream.server.clone());
        Ok(stream)
    }

    async fn partition_root(&mut self, relation_id: u32) -> Result<Option<TableName>, SourceError> {
        let lookup = async {
            let client = control(&mut self.control, &self.connector).await?;
            Ok(catalog::tables::partition_root(client, relation_id).await?)
        };
        lookup
            .await
            .map_err(lookup_err("look up the partition root", relation_id))
    }

    async fn column_facts(&mut self, relation_id: u32) -> Result<Vec<ColumnFacts>, SourceError> {
        let lookup = async {
            let client = control(&mut self.control, &self.connector).await?;
            Ok(catalog::tables::column_facts(client, &relation_id.to_string()).await?)
        };
        lookup
            .await
            .map_err(lookup_err("read the columns", relation_id))
    }

    fn check_publication(&mut self) -> BoxFuture<'static, PublicationCheck> {
        let connector = self.connector.clone();
        Box::pin(check(
            self.control.take(),
            connector,
            Arc::clone(&self.settings),
        ))
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
        let publication = self.settings.publication.clone();
        Err(SourceError::PublicationChanged {
            publication,
            change,
        })
    }

    async fn wal_end(&mut self) -> Lsn {
        let session = self.connector.command_session(&self.settings.slot);
        let Ok(mut client) = session.await else {
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
        let Ok(client) = control(&mut self.control, &self.connector).await else {
            return error;
        };
        let slot = &self.settings.slot;
        let Ok(SlotObservation::Seen(status)) = catalog::slots::poll(client, slot).await else {
            return error;
        };
        match status.invalidated() {
            Some(reason) => invalidated(slot, &reason),
            None => error,
        }
    }
}

/// The stop of a slot Postgres invalidated (`reason`), with the remedy.
fn invalidated(slot: &str, reason: &str) -> SourceError {
    SourceError::Misconfigured(format!(
        "replication slot {slot:?}: {}",
        crate::remedy::invalidated_slot(reason)
    ))
}

/// Opens a session on the server `pinned` names; IDENTIFY_SYSTEM and the slot's position are
/// read on it, so both describe the server it streams from.
async fn open(
    pinned: &Connector,
    settings: &StreamSettings,
    mut start: Lsn,
    acked: Lsn,
    previous: Option<&ServerId>,
) -> Result<ReplicationStream, SourceError> {
    let slot = &settings.slot;
    let failed = replication_err(pinned, slot);
    let repl = replication_config(pinned, settings, start, acked).await?;
    let mut client = ReplicationClient::connect_gated(repl)
        .await
        .map_err(&failed)?;
    let system = client.identify_system().await.map_err(&failed)?;
    let pg = pinned.info();
    let server = ServerId {
        addr: format!("{}:{}", pg.host, pg.port),
        system_id: system.system_id,
        timeline: system.timeline,
    };
    if previous.is_some_and(|p| *p != server) {
        let confirmed = slot_confirmed(&mut client, slot).await;
        start = resume_point(previous, &server, start, confirmed);
        // A gated session's start position is fixed: end it, start another.
        drop(client);
        let repl = replication_config(pinned, settings, start, acked).await?;
        client = ReplicationClient::connect(repl).await.map_err(&failed)?;
    } else {
        client.start().await.map_err(&failed)?;
    }
    client.wait_started().await.map_err(&failed)?;
    Ok(ReplicationStream {
        client,
        slot: slot.clone(),
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

/// The replication client's own log target: one ERROR line for every session that ends in an
/// error, which the relay reports itself with what it does about it (a standby polling a slot
/// in use logged one at every poll).
const CLIENT_LOG_TARGET: &str = "pgwire_replication::client::tokio_client";

/// PURE: the log filter `level` (`--log-level`) with the replication client's own line off,
/// unless `level` names the client's crate itself.
pub fn log_filter(level: &str) -> String {
    match level.contains("pgwire_replication") {
        true => level.to_owned(),
        false => format!("{level},{CLIENT_LOG_TARGET}=off"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_invalidated_slot_is_named_with_the_reason_and_the_remedy() {
        let text = invalidated("s", "wal_removed").to_string();
        assert!(text.starts_with("replication slot \"s\": "), "{text}");
        assert!(text.contains("wal_removed"), "{text}");
        assert_eq!(invalidated("s", "wal_removed").recovery(), Recovery::Fatal);
    }

    #[test]
    fn the_replication_clients_error_line_is_off_unless_asked_for() {
        // (--log-level, the filter)
        let table = [
            ("info", "info,pgwire_replication::client::tokio_client=off"),
            (
                "info,outbox_relay=debug",
                "info,outbox_relay=debug,pgwire_replication::client::tokio_client=off",
            ),
            (
                "info,pgwire_replication=debug",
                "info,pgwire_replication=debug",
            ),
        ];
        for (level, expected) in table {
            assert_eq!(log_filter(level), expected, "{level}");
            assert!(tracing_subscriber::EnvFilter::try_new(log_filter(level)).is_ok());
        }
    }
}
