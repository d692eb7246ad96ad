//! The lost-slot guard. A slot missing where this relay streamed before must not be replaced by
//! one starting at "now": that would skip every event since the last acknowledgement. Which
//! slots the relay created lives in the lineage topic ([`crate::sink::lineage`]), read at every
//! start and written (awaiting the broker's ack) before the relay streams from a slot not
//! recorded yet. Deployments of older relays recorded slots in `public.outbox_relay_slots`: a
//! row there is still honoured while the topic has no record of the slot.
//!
//! A topic with time-based retention (the broker's default for an auto-created topic) would
//! drop the record after `retention.ms`, turning the guard off: a relay streaming from the slot
//! writes its record again at every start and every [`REFRESH_INTERVAL`] while it runs.

use std::time::Duration;

use tokio_postgres::Client;

use super::setup::query_err;
use super::{SourceError, replication_err};
use crate::config::Config;
use crate::lsn::Lsn;
use crate::observability::Chain;
use crate::sink::lineage::{self, LineageError, Problem, SlotRecord, SlotState};

/// How often a running relay writes its slot's record again: well inside Kafka's default
/// retention of 7 days.
pub const REFRESH_INTERVAL: Duration = Duration::from_secs(24 * 3600);

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
    legacy: Option<String>,
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

/// PURE: the guard's rule where the slot's last record is not one the relay writes (`error`
/// says so): a slot found is streamed from, and its `created` record written over the
/// unreadable one; a missing slot is replaced only with `--allow-new-slot`, as the record
/// cannot say whether it was lost; otherwise the error, which says how to clear it.
pub(crate) fn judge_unreadable(
    exists: bool,
    allow_new_slot: bool,
    error: LineageError,
) -> Result<Guard, LineageError> {
    if exists {
        tracing::warn!(error = %Chain(&error), "the slot exists, so its record is written again over the unreadable one");
        return Ok(Guard::Keep { record: true });
    }
    match allow_new_slot {
        true => Ok(Guard::Replace(error.to_string())),
        false => Err(error),
    }
}

/// The slot's place in the lineage topic: this cluster's key.
pub struct Lineage<'a> {
    config: &'a Config,
    system_identifier: String,
    key: String,
    /// The slot's record as [`Lineage::judge`] last read it.
    found: Option<SlotRecord>,
}

impl<'a> Lineage<'a> {
    /// Reads the cluster's system identifier (shared by a primary and its standbys) with
    /// IDENTIFY_SYSTEM, which a role with REPLICATION may run on any server.
    pub async fn open(config: &'a Config) -> Result<Lineage<'a>, SourceError> {
        let mut session = super::command_session(config).await?;
        let system = session.identify_system().await;
        let system_identifier = system.map_err(replication_err(config))?.system_id;
        let key = lineage::key(&system_identifier, &config.flags.slot);
        Ok(Lineage {
            config,
            system_identifier,
            key,
            found: None,
        })
    }

    /// What to do about the slot, found (`exists`) or not.
    pub(crate) async fn judge(
        &mut self,
        client: &Client,
        exists: bool,
    ) -> Result<Guard, SourceError> {
        let flags = &self.config.flags;
        let record = match lineage::read(self.config, &self.key).await {
            Ok(record) => record,
            Err(error) if error.problem() == Problem::Unreadable => {
                return Ok(judge_unreadable(exists, flags.allow_new_slot, error)?);
            }
            Err(error) => return Err(error.into()),
        };
        self.found = record.clone();
        let legacy = match exists || record.is_some() {
            true => None,
            false => legacy(client, &self.config.flags.slot, &self.system_identifier).await?,
        };
        let (allow, topic) = (flags.allow_new_slot, &flags.lineage_topic);
        Ok(judge(exists, record.as_ref(), legacy, allow, topic))
    }

    /// Records that the relay streams from the slot, confirmed at `lsn`, and waits for the ack.
    pub async fn created(&self, lsn: Lsn) -> Result<(), SourceError> {
        self.write(SlotState::Created, Some(lsn)).await
    }

    /// Writes the slot's `created` record, as last read, again (see [`REFRESH_INTERVAL`]).
    pub async fn refresh(&self) -> Result<(), SourceError> {
        let Some(record) = self.found.clone().filter(|r| r.state == SlotState::Created) else {
            return Ok(());
        };
        let record = record.refreshed();
        Ok(lineage::write(self.config, &self.key, Some(&record)).await?)
    }

    /// Records that the slot was dropped on purpose: the next start creates a fresh one.
    pub async fn dropped(&self) -> Result<(), SourceError> {
        self.write(SlotState::Dropped, None).await
    }

    /// Removes the slot's record (a tombstone): the demo leaves nothing behind.
    pub async fn forget(&self) -> Result<(), SourceError> {
        Ok(lineage::write(self.config, &self.key, None).await?)
    }

    async fn write(&self, state: SlotState, lsn: Option<Lsn>) -> Result<(), SourceError> {
        let (slot, id) = (&self.config.flags.slot, &self.system_identifier);
        let record = SlotRecord::now(slot, id, state, lsn.map(|l| l.to_string()));
        lineage::write(self.config, &self.key, Some(&record)).await?;
        tracing::info!(slot, topic = %self.config.flags.lineage_topic, ?state, "recorded the slot's lineage");
        Ok(())
    }
}

/// Writes the slot's record again every [`REFRESH_INTERVAL`] while the relay runs; a failure
/// is logged and retried at the next interval (the record written at start-up stands meanwhile).
pub async fn keep_fresh(config: Config) {
    loop {
        tokio::time::sleep(REFRESH_INTERVAL).await;
        let refreshed = async {
            let mut lineage = Lineage::open(&config).await?;
            lineage.found = lineage::read(&config, &lineage.key).await?;
            lineage.refresh().await
        };
        if let Err(error) = refreshed.await {
            tracing::warn!(
                error = %Chain(&error),
                slot = %config.flags.slot,
                "cannot write the slot's lineage record again; a lineage topic with time-based \
                 retention may drop it, which would let a lost slot be replaced silently"
            );
        }
    }
}

/// When an older relay recorded the slot in `public.outbox_relay_slots` of this cluster.
async fn legacy(client: &Client, slot: &str, system: &str) -> Result<Option<String>, SourceError> {
    let found = client
        .query_opt(
            "SELECT created_at::text FROM public.outbox_relay_slots \
             WHERE slot_name = $1 AND system_identifier = $2",
            &[&slot, &system],
        )
        .await;
    match found {
        Ok(row) => Ok(row.map(|r| r.get(0))),
        // No table: no older relay ran here.
        Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE) => Ok(None),
        Err(source) => Err(query_err("read public.outbox_relay_slots")(source)),
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
        let legacy = || Some("2025-01-01".to_owned());
        let judged = |exists, record, legacy, allow| judge(exists, record, legacy, allow, "t");
        // A slot found is streamed from, recorded first unless it is already.
        assert_eq!(
            judged(true, Some(&created), None, false),
            Guard::Keep { record: false }
        );
        for r in [None, Some(&dropped)] {
            assert_eq!(
                judged(true, r, legacy(), false),
                Guard::Keep { record: true }
            );
        }
        // Missing: a first start, or after drop-slot (which overrides an older relay's row).
        assert_eq!(judged(false, None, None, false), Guard::Create);
        assert_eq!(
            judged(false, Some(&dropped), legacy(), false),
            Guard::Create
        );
        // Missing where it was created: refused, unless --allow-new-slot.
        let Guard::Refuse(at) = judged(false, Some(&created), None, false) else {
            panic!("a lost slot must be refused");
        };
        assert!(
            at.contains("Kafka topic \"t\"") && at.contains("0/10"),
            "{at}"
        );
        let Guard::Refuse(at) = judged(false, None, legacy(), false) else {
            panic!("an older relay's record must be honoured");
        };
        assert!(at.contains("public.outbox_relay_slots"), "{at}");
        assert!(matches!(
            judged(false, Some(&created), None, true),
            Guard::Replace(_)
        ));
        assert!(matches!(
            judged(false, None, legacy(), true),
            Guard::Replace(_)
        ));
    }

    #[test]
    fn an_unreadable_record_is_written_over_where_the_slot_exists_and_refused_where_not() {
        let unreadable = || {
            let text =
                "the last record of key \"k\" (partition 0, offset 3) is not one the relay writes";
            LineageError::unreadable("t", text)
        };
        // (slot exists, --allow-new-slot, verdict)
        let table = [
            (true, false, Some(Guard::Keep { record: true })),
            (true, true, Some(Guard::Keep { record: true })),
            (false, false, None),
        ];
        for (exists, allow, verdict) in table {
            let judged = judge_unreadable(exists, allow, unreadable()).ok();
            assert_eq!(judged, verdict, "exists: {exists}, allow: {allow}");
        }
        let Ok(Guard::Replace(why)) = judge_unreadable(false, true, unreadable()) else {
            panic!("--allow-new-slot replaces a slot whose record is unreadable");
        };
        assert!(why.contains("offset 3"), "{why}");
        let Err(refusal) = judge_unreadable(false, false, unreadable()) else {
            panic!("a missing slot with an unreadable record is refused");
        };
        assert!(
            refusal.to_string().contains("drop-slot --yes-i-know"),
            "{refusal}"
        );
    }
}
