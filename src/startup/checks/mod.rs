//! PURE: the start-up rules. Each is a small function of the gathered [`Facts`] and what the
//! configuration [`Wanted`]; [`check`] runs them in the order an operator fixes things (the
//! cleanup's needs, the server, the tables, the shard's columns, the publication, the shard's
//! publication, the other fleets' slots, the slot) and returns every refusal, the warnings,
//! and the steps to take. A refused start writes nothing: the steps run only when there is no
//! refusal.

mod fleet;
mod publication;
mod server;
mod shard;
mod slot;

use super::Wanted;
use super::facts::Facts;
use crate::postgres::sql;

pub use publication::{publication_unfit, setup_steps};
pub use server::table_missing;
pub use shard::{HASH_PROBE, late_shard, row_filters, sibling_slots};
pub use slot::{confirmed_flush, in_use, peekable};

/// Why start-up refuses; the message says what to change.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// The server, the role, a table, the publication or the slot does not fit.
    #[error("{0}")]
    Misconfigured(String),
    /// The lineage topic's record of the slot cannot be used (the message says why and how to
    /// clear it).
    #[error("{0}")]
    Lineage(String),
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
}

/// A write start-up makes; [`check`] lists them in the order they run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Create the publication with this statement.
    CreatePublication(String),
    /// Create the slot (marked for failover, then a standby snapshot, when `failover`).
    CreateSlot {
        /// `--slot-failover`.
        failover: bool,
    },
    /// Record in the lineage topic that the relay streams from the slot, at its position.
    RecordLineage,
    /// Write the slot's lineage record again, so that time-based retention keeps it.
    RefreshLineage,
    /// Mark the existing slot for failover, then have the primary log a standby snapshot.
    MarkFailover,
}

impl Step {
    /// The statement the step runs in Postgres for `slot`, if it runs one there.
    pub fn sql(&self, slot: &str) -> Option<String> {
        match self {
            Step::CreatePublication(statement) => Some(statement.clone()),
            Step::CreateSlot { failover } => Some(sql::create_slot(slot, *failover)),
            Step::MarkFailover => Some(sql::mark_failover(slot)),
            Step::RecordLineage | Step::RefreshLineage => None,
        }
    }
}

/// What the rules decided.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Checked {
    /// Every reason not to start, in the order to fix them; start-up reports the first.
    pub refusals: Vec<Refused>,
    /// What needs attention but does not stop the relay, with the remedy.
    pub warnings: Vec<String>,
    /// The writes to make, in order (none matter while there are refusals).
    pub steps: Vec<Step>,
}

/// Runs every rule.
pub fn check(facts: &Facts, wanted: &Wanted) -> Checked {
    let mut checked = Checked::default();
    checked.refusals.extend(server::cleanup(facts, wanted));
    checked
        .refusals
        .extend(server::server(&facts.server, wanted));
    let tables = wanted.tables.iter().zip(&facts.tables);
    let unfit: Vec<Refused> = tables
        .filter_map(|(t, found)| server::table(t, found))
        .collect();
    let tables_fit = unfit.is_empty();
    checked.refusals.extend(unfit);
    // The publication's rules name the tables' columns: they wait until the tables fit.
    if tables_fit {
        publication_rules(facts, wanted, &mut checked);
    }
    checked
        .warnings
        .extend(server::warnings(&facts.server, wanted));
    fleet::fleet(facts, wanted, &mut checked);
    slot::slot(facts, wanted, &mut checked);
    checked
}

/// The shard's columns, then the publication (found, or to create), then a shard's hash and
/// its publication's row filters.
fn publication_rules(facts: &Facts, wanted: &Wanted, checked: &mut Checked) {
    let filters = match shard::row_filters(facts, wanted) {
        Ok(filters) => filters,
        Err(refused) => return checked.refusals.push(refused),
    };
    checked
        .refusals
        .extend(shard::siblings_hash(facts, wanted, &filters));
    let Some(found) = &facts.publication else {
        match publication::create(&facts.server, wanted, &filters) {
            Ok(step) => checked.steps.push(step),
            Err(refused) => checked.refusals.push(refused),
        }
        // The publication created carries the shard's filters.
        checked.refusals.extend(shard::hash(&facts.server, wanted));
        return;
    };
    checked
        .refusals
        .extend(publication::found(found, facts, wanted));
    checked.refusals.extend(shard::hash(&facts.server, wanted));
    let shard = shard::publication(found, wanted, &filters);
    checked.refusals.extend(shard);
}
