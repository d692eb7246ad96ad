//! Start-up, in one sequence ([`start`]): open one control session; **gather** every fact in
//! one read-only pass ([`gather`], into [`facts`]: the server, the tables and their columns, the publication
//! and its row filters, the slot and its siblings, the lineage record); **check** them with
//! pure rules ([`checks`], one small function each, returning refusals, warnings and the steps
//! to take); then, only when nothing was refused, **apply** the steps in order ([`apply`]:
//! create the publication, create the slot, record its lineage, mark it for failover).
//! Nothing is written before every refusal has been decided, so a refused start leaves
//! nothing behind on the server.
//!
//! Gathering only reads, so it can run again (after an outage) with nothing to undo, and its
//! errors say whether waiting may help ([`StartupError::transient`]). `status` shows the same
//! checks' refusals as warnings, and `setup --print` prints the same steps.

pub mod apply;
pub mod checks;
pub mod facts;
pub mod gather;
pub mod lineage;
#[cfg(test)]
mod tests;
pub mod wait;
mod wanted;

use std::time::Duration;

use crate::lsn::Lsn;
use crate::outbox::TableName;
use crate::postgres::catalog::publication::Publication;
use crate::postgres::{Connector, PostgresError};
use crate::sink::KafkaClients;
use crate::sink::exactly_once::READ_TIMEOUT;
use crate::sink::lineage::LineageError;

pub use checks::{Checked, Refused, Step};
pub use wanted::{Wanted, WantedTable};

/// Why start-up did not get the relay to its slot.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    /// A check refused: the configuration or the server must change first.
    #[error(transparent)]
    Refused(#[from] Refused),
    /// A connection or a query failed.
    #[error(transparent)]
    Postgres(#[from] PostgresError),
    /// The lineage topic cannot be read or written: the relay does not stream.
    #[error(transparent)]
    Lineage(#[from] LineageError),
}

impl StartupError {
    /// Whether trying again later may succeed without anyone changing anything: a server or a
    /// broker that is not reachable now, a server that takes no connections now, or none of
    /// the URL's servers in the role asked for ([`wait::Outage::of`]). A refusal, a refused
    /// login, TLS setting or ACL, a missing topic, and a server's other answers are not.
    pub fn transient(&self) -> bool {
        wait::Outage::of(self).is_some()
    }
}

/// Where streaming starts, and what start-up did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Started {
    /// The slot's confirmed position: streaming resumes here.
    pub confirmed_flush: Lsn,
    /// The publication as found (or created): later checks compare against it.
    pub publication: Publication,
    /// The statement that created the publication, if start-up created it.
    pub publication_created: Option<String>,
    /// Whether start-up created the slot.
    pub slot_created: bool,
    /// For a shard whose slot was created after other shards' slots, what that costs.
    pub late_shard: Option<String>,
    /// With `--cleanup delete`, each outbox table's primary key columns.
    pub primary_keys: Vec<(TableName, Vec<String>)>,
}

impl Started {
    /// Streaming from a slot confirmed at `confirmed_flush`, with `publication`; nothing created.
    pub fn resuming(confirmed_flush: Lsn, publication: Publication) -> Self {
        Started {
            confirmed_flush,
            publication,
            publication_created: None,
            slot_created: false,
            late_shard: None,
            primary_keys: Vec::new(),
        }
    }
}

/// The one start-up sequence: gather, check, apply. It tries once: the relay waits out
/// outages around it ([`wait::Patient`]); the subcommands say what failed at once.
pub async fn start(
    wanted: &Wanted,
    postgres: &Connector,
    kafka: &KafkaClients,
) -> Result<Started, StartupError> {
    start_within(wanted, postgres, kafka, READ_TIMEOUT).await
}

/// [`start`], its read of the lineage topic waiting for Kafka at most `read_timeout`.
pub async fn start_within(
    wanted: &Wanted,
    postgres: &Connector,
    kafka: &KafkaClients,
    read_timeout: Duration,
) -> Result<Started, StartupError> {
    let (control, pinned) = postgres.locate().await?;
    let facts = gather::gather(&control, &pinned, kafka, wanted, read_timeout).await?;
    let checked = checks::check(&facts, wanted);
    for warning in &checked.warnings {
        tracing::warn!(slot = %wanted.slot, "{warning}");
    }
    if let Some(refused) = checked.refusals.into_iter().next() {
        return Err(refused.into());
    }
    let session = apply::Session {
        control: &control,
        pinned: &pinned,
        kafka,
    };
    apply::run(&session, wanted, &facts, &checked.steps).await
}
