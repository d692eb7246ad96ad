//! I/O: the Postgres side at run time, once start-up ([`crate::startup`]) prepared the slot:
//! [`PgSource`] streams with pgwire-replication and looks things up on a control connection
//! (a relation's partition root, a table's columns, the publication, checked while
//! streaming); the [`slot_monitor`] polls the slot, [`failover`] probes the standbys' copies
//! of it, the [`heartbeat`] keeps an idle database's slot moving. [`Stream::ack`] is the only
//! way a position reaches the slot, and only the pipeline calls it, with the ack frontier.
//! Connections and catalog queries are [`crate::postgres`]'s.

pub mod deleter;
mod error;
mod event;
pub mod failover;
pub mod heartbeat;
mod replication;
pub mod slot_monitor;

use std::future::Future;
use std::time::Duration;

use futures_util::future::BoxFuture;

pub use error::{Recovery, SourceError};
pub use event::SourceEvent;
pub use replication::{PgSource, PublicationCheck, ReplicationStream, StreamSettings, log_filter};

use crate::lsn::Lsn;
use crate::outbox::TableName;
use crate::outbox::connect::ColumnFacts;

/// WAL messages read ahead of the pipeline: pgwire-replication's channel holds all but one,
/// its reader the one waiting for room. A message can be a 1 GB row, so the pipeline reserves
/// room for these many of the largest recent rows out of `--max-in-flight-bytes`. Three, not
/// two: the reader then finds room for every other message at once, which halves its
/// hand-offs to the pipeline (their cost is in docs/benchmark.md).
pub const READ_AHEAD: usize = 3;

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
