//! The lost-slot guard. A slot missing where this relay streamed before must not be replaced by
//! one starting at "now": that would skip every event since the last acknowledgement. Which
//! slots the relay created lives in the lineage topic ([`crate::sink::lineage`]), read at every
//! start and written (awaiting the broker's ack) before the relay streams from a slot not
//! recorded yet. Deployments of older relays recorded slots in `public.outbox_relay_slots`: a
//! row there is still honoured while the topic has no record of the slot.
//!
//! A topic with time-based retention (the broker's default for an auto-created topic) would
//! drop the record after `retention.ms`, turning the guard off: a relay streaming from the slot
//! writes its record again at every start and every [`REFRESH_INTERVAL`] while it runs
//! ([`keep_fresh`]).

use std::time::Duration;

use tokio_postgres::Client;

use super::StartupError;
use crate::lsn::Lsn;
use crate::observability::Chain;
use crate::postgres::Connector;
use crate::postgres::catalog::slots::legacy_record;
use crate::sink::KafkaClients;
use crate::sink::exactly_once::READ_TIMEOUT;
use crate::sink::lineage::{self, LineageError, Problem, Reshard, SlotRecord, SlotState};

/// How often a running relay writes its slot's record again: well inside Kafka's default
/// retention of 7 days.
pub const REFRESH_INTERVAL: Duration = Duration::from_secs(24 * 3600);

/// What the lineage topic and the cluster say about the slot, as start-up read them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LineageFacts {
    /// The cluster's system identifier (shared by a primary and its standbys).
    pub system_identifier: String,
    /// The slot's last record in the lineage topic.
    pub record: Option<SlotRecord>,
    /// When an older relay recorded the slot in `public.outbox_relay_slots` of this cluster
    /// (read only when the slot is missing and the topic has no record of it).
    pub legacy: Option<String>,
    /// The slot's last record is not one the relay writes: why, and how to clear it
    /// ([`Problem::Unreadable`]); `record` is `None` then.
    pub unreadable: Option<String>,
    /// The last records of the other fleets' slots ([`super::facts::Facts::other_fleets`])
    /// that have one the relay can read: a resharding in progress says so there.
    pub other_fleets: Vec<SlotRecord>,
}

/// What start-up does about the slot.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Guard {
    /// Stream from the slot found; `record` when its creation is not recorded yet.
    Keep {
        /// Write the `created` record first.
        record: bool,
    },
    /// Create the slot and record it: a first start, or after `drop-slot`.
    Create,
    /// `--allow-new-slot` where the slot was lost (recorded where this says): create it anyway.
    Replace(String),
    /// The slot was lost (recorded where this says): refuse.
    Refuse(String),
}

/// PURE: the guard's rule. `record` is the lineage topic's last record of the slot, `legacy`
/// when `public.outbox_relay_slots` recorded it in this cluster.
pub(crate) fn judge(
    exists: bool,
    record: Option<&SlotRecord>,
    legacy: Option<&str>,
    allow_new_slot: bool,
    topic: &str,
) -> Guard {
    let created = record.filter(|r| r.state == SlotState::Created);
    if exists {
        return Guard::Keep {
            record: created.is_none(),
        };
    }
    let lost = match (record, legacy) {
        (Some(r), _) if r.state == SlotState::Created => format!(
            "recorded in Kafka topic {topic:?}: created {} at {}",
            r.created_at.as_deref().unwrap_or("?"),
            r.created_lsn.as_deref().unwrap_or("?")
        ),
        // A newer `drop-slot` overrides an older relay's row.
        (Some(_), _) | (None, None) => return Guard::Create,
        (None, Some(at)) => format!("recorded in public.outbox_relay_slots at {at}"),
    };
    match allow_new_slot {
        true => Guard::Replace(lost),
        false => Guard::Refuse(lost),
    }
}

/// The slot's place in the lineage topic: this cluster's key.
#[derive(Clone, Debug)]
pub struct Lineage {
    kafka: KafkaClients,
    topic: String,
    slot: String,
    system_identifier: String,
    key: String,
    /// How long a read may wait for Kafka.
    read_timeout: Duration,
}

impl Lineage {
    /// The record of `slot` in `topic`, for the cluster `system_identifier`.
    pub fn new(kafka: &KafkaClients, topic: &str, slot: &str, system_identifier: &str) -> Self {
        Lineage {
            kafka: kafka.clone(),
            topic: topic.to_owned(),
            slot: slot.to_owned(),
            system_identifier: system_identifier.to_owned(),
            key: lineage::key(system_identifier, slot),
            read_timeout: READ_TIMEOUT,
        }
    }

    /// This record, its reads waiting for Kafka at most `read_timeout`.
    pub fn within(mut self, read_timeout: Duration) -> Self {
        self.read_timeout = read_timeout;
        self
    }

    /// Reads the cluster's system identifier with IDENTIFY_SYSTEM, which a role with
    /// REPLICATION may run on any server.
    pub async fn open(
        connector: &Connector,
        kafka: &KafkaClients,
        topic: &str,
        slot: &str,
    ) -> Result<Self, StartupError> {
        let mut session = connector.command_session(slot).await?;
        let identified = session.identify_system().await;
        let system =
            identified.map_err(|e| connector.replication_error("identify the system", slot, e))?;
        Ok(Lineage::new(kafka, topic, slot, &system.system_id))
    }

    /// The cluster's system identifier.
    pub fn system_identifier(&self) -> &str {
        &self.system_identifier
    }

    /// The slot's last record; `None` when there is none or the last is a tombstone.
    pub async fn read(&self) -> Result<Option<SlotRecord>, LineageError> {
        lineage::read_within(&self.kafka, &self.topic, &self.key, self.read_timeout).await
    }

    /// What the topic, and where it has no record of a missing slot the cluster, say about
    /// the slot (`exists`: it is on the server), and about the slots `other_fleets`.
    pub async fn facts(
        &self,
        control: &Client,
        exists: bool,
        other_fleets: &[String],
    ) -> Result<LineageFacts, StartupError> {
        let keys: Vec<String> = other_fleets
            .iter()
            .map(|slot| lineage::key(&self.system_identifier, slot))
            .collect();
        let read = lineage::read_keys(
            &self.kafka,
            &self.topic,
            &self.key,
            &keys,
            self.read_timeout,
        );
        let read = read.await?;
        let (record, unreadable) = match read.own {
            Ok(record) => (record, None),
            Err(error) if error.problem() == Problem::Unreadable => (None, Some(error.to_string())),
            Err(error) => return Err(error.into()),
        };
        let legacy = match exists || record.is_some() || unreadable.is_some() {
            true => None,
            false => legacy_record(control, &self.slot, &self.system_identifier).await?,
        };
        Ok(LineageFacts {
            system_identifier: self.system_identifier.clone(),
            record,
            legacy,
            unreadable,
            other_fleets: read.others,
        })
    }

    /// Records that the relay streams from the slot, confirmed at `lsn`, and waits for the ack;
    /// `reshard` when that resharding created it beside the old fleet's slots.
    pub async fn created(&self, lsn: Lsn, reshard: Option<Reshard>) -> Result<(), LineageError> {
        let record = self.record(SlotState::Created, Some(lsn));
        self.write(record.resharding(reshard)).await
    }

    /// Writes `found`, the slot's `created` record, again (see [`REFRESH_INTERVAL`]), saying
    /// `reshard` (a resharding under way) or nothing (no longer, or never); nothing for another
    /// record.
    pub async fn refresh(
        &self,
        found: Option<&SlotRecord>,
        reshard: Option<Reshard>,
    ) -> Result<(), LineageError> {
        let Some(record) = found.filter(|r| r.state == SlotState::Created) else {
            return Ok(());
        };
        let record = record.clone().resharding(reshard).refreshed();
        lineage::write(&self.kafka, &self.topic, &self.key, Some(&record)).await
    }

    /// Records that the slot was dropped on purpose: the next start creates a fresh one.
    pub async fn dropped(&self) -> Result<(), LineageError> {
        self.write(self.record(SlotState::Dropped, None)).await
    }

    /// Records that `reshard --finish` dropped the slot, whose relay had delivered everything
    /// before `at`: its old fleet's relays are refused from then on, and a rerun of `--finish`
    /// meets the new slots there.
    pub async fn retired(&self, reshard: Reshard, at: Lsn) -> Result<(), LineageError> {
        let record = self.record(SlotState::Dropped, None);
        let record = record.resharding(Some(reshard));
        self.write(record.dropped_at_lsn(Some(at.to_string())))
            .await
    }

    /// Removes the slot's record (a tombstone): the demo leaves nothing behind.
    pub async fn forget(&self) -> Result<(), LineageError> {
        lineage::write(&self.kafka, &self.topic, &self.key, None).await
    }

    /// A record of the slot in `state` now.
    fn record(&self, state: SlotState, lsn: Option<Lsn>) -> SlotRecord {
        let lsn = lsn.map(|lsn| lsn.to_string());
        SlotRecord::now(&self.slot, &self.system_identifier, state, lsn)
    }

    async fn write(&self, record: SlotRecord) -> Result<(), LineageError> {
        lineage::write(&self.kafka, &self.topic, &self.key, Some(&record)).await?;
        let state = record.state;
        tracing::info!(slot = %self.slot, topic = %self.topic, ?state, "recorded the slot's lineage");
        Ok(())
    }
}

/// Writes the slot's record again every [`REFRESH_INTERVAL`] while the relay runs; a failure
/// is logged and retried at the next interval (the record written at start-up stands meanwhile).
pub async fn keep_fresh(connector: Connector, kafka: KafkaClients, topic: String, slot: String) {
    loop {
        tokio::time::sleep(REFRESH_INTERVAL).await;
        let refreshed = async {
            let lineage = Lineage::open(&connector, &kafka, &topic, &slot).await?;
            let found = lineage.read().await?;
            Ok::<_, StartupError>(lineage.refresh(found.as_ref(), None).await?)
        };
        if let Err(error) = refreshed.await {
            tracing::warn!(
                error = %Chain(&error),
                slot = %slot,
                "cannot write the slot's lineage record again; a lineage topic with time-based \
                 retention may drop it, which would let a lost slot be replaced silently"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(state: SlotState) -> SlotRecord {
        SlotRecord::now("s", "7300", state, Some("0/10".into()))
    }

    #[test]
    fn a_slot_starts_over_only_on_a_first_start_after_a_drop_or_with_consent() {
        let created = record(SlotState::Created);
        let dropped = record(SlotState::Dropped);
        let legacy = Some("2025-01-01");
        let judged = |exists, record, legacy, allow| judge(exists, record, legacy, allow, "t");
        // A slot found is streamed from, recorded first unless it is already.
        assert_eq!(
            judged(true, Some(&created), None, false),
            Guard::Keep { record: false }
        );
        for r in [None, Some(&dropped)] {
            assert_eq!(judged(true, r, legacy, false), Guard::Keep { record: true });
        }
        // Missing: a first start, or after drop-slot (which overrides an older relay's row).
        assert_eq!(judged(false, None, None, false), Guard::Create);
        assert_eq!(judged(false, Some(&dropped), legacy, false), Guard::Create);
        // Missing where it was created: refused, unless --allow-new-slot.
        let Guard::Refuse(at) = judged(false, Some(&created), None, false) else {
            panic!("a lost slot must be refused");
        };
        assert!(
            at.contains("Kafka topic \"t\"") && at.contains("0/10"),
            "{at}"
        );
        let Guard::Refuse(at) = judged(false, None, legacy, false) else {
            panic!("an older relay's record must be honoured");
        };
        assert!(at.contains("public.outbox_relay_slots"), "{at}");
        assert!(matches!(
            judged(false, Some(&created), None, true),
            Guard::Replace(_)
        ));
        assert!(matches!(
            judged(false, None, legacy, true),
            Guard::Replace(_)
        ));
    }
}
