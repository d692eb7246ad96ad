//! The replication stream's events in the relay's own terms, converted once from
//! pgwire-replication's, so nothing past the source names the driver.

use bytes::Bytes;
use pgwire_replication::ReplicationEvent;

use crate::lsn::Lsn;
use crate::outbox::values::pg_micros_to_unix_micros;

/// One event of a replication session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SourceEvent {
    /// A transaction begins. It commits at `commit_lsn` (pgoutput's `final_lsn`), at
    /// `commit_time_us` (Unix microseconds).
    Begin {
        /// Where its commit record starts.
        commit_lsn: Lsn,
        /// The server's commit time, Unix microseconds.
        commit_time_us: i64,
    },
    /// The open transaction committed; its commit record ends here (what a confirmation past
    /// the transaction names).
    Commit(Lsn),
    /// How far the server has written WAL, sent while idle.
    KeepAlive(Lsn),
    /// A pgoutput message (Relation, Insert, ...), still encoded.
    Change {
        /// Where it starts in the WAL.
        lsn: Lsn,
        /// The message, for [`crate::pgoutput::decode`].
        data: Bytes,
        /// When the walsender sent it, Unix microseconds on the server's clock.
        sent_us: i64,
    },
    /// A logical decoding message (`pg_logical_emit_message`).
    Message {
        /// Where it is in the WAL.
        lsn: Lsn,
        /// Emitted inside a transaction (delivered with it).
        transactional: bool,
        /// The application's prefix.
        prefix: String,
        /// The content.
        content: Bytes,
    },
}

impl SourceEvent {
    /// The driver's event; `None` for `StoppedAt`, which the relay never asks for.
    pub(super) fn from_driver(event: ReplicationEvent) -> Option<Self> {
        Some(match event {
            ReplicationEvent::Begin {
                final_lsn,
                commit_time_micros,
                ..
            } => SourceEvent::Begin {
                commit_lsn: final_lsn.into(),
                commit_time_us: pg_micros_to_unix_micros(commit_time_micros),
            },
            ReplicationEvent::Commit { end_lsn, .. } => SourceEvent::Commit(end_lsn.into()),
            ReplicationEvent::KeepAlive { wal_end, .. } => SourceEvent::KeepAlive(wal_end.into()),
            ReplicationEvent::XLogData {
                wal_start,
                data,
                server_time_micros,
                ..
            } => SourceEvent::Change {
                lsn: wal_start.into(),
                data,
                sent_us: pg_micros_to_unix_micros(server_time_micros),
            },
            ReplicationEvent::Message {
                transactional,
                lsn,
                prefix,
                content,
            } => SourceEvent::Message {
                lsn: lsn.into(),
                transactional,
                prefix,
                content,
            },
            ReplicationEvent::StoppedAt { .. } => return None,
        })
    }

    /// How far the server has sent WAL, as this event shows (a Begin's commit LSN lies ahead).
    pub fn received(&self) -> Option<Lsn> {
        match self {
            SourceEvent::Begin { .. } => None,
            SourceEvent::Commit(lsn)
            | SourceEvent::KeepAlive(lsn)
            | SourceEvent::Change { lsn, .. }
            | SourceEvent::Message { lsn, .. } => Some(*lsn),
        }
    }
}
