//! Why the Postgres side failed, and how the relay reacts: reconnect, stand by, or stop.

use std::time::Duration;

use pgwire_replication::PgWireError;

use crate::postgres::PostgresError;
use crate::postgres::wire_sqlstate as sqlstate;

/// Something went wrong on the Postgres side; the message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// A connection or a query failed.
    #[error(transparent)]
    Postgres(#[from] PostgresError),
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
            | SourceError::Postgres(PostgresError::NoSuitableHost { .. })
            | SourceError::Postgres(PostgresError::Credentials(_))
            | SourceError::Postgres(PostgresError::IamRefused { .. })
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

pub(super) fn stream_err(slot: &str) -> impl Fn(PgWireError) -> SourceError + '_ {
    move |source| SourceError::Stream {
        slot: slot.to_owned(),
        source,
    }
}
