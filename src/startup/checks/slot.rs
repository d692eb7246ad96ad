//! PURE: the slot's rules: one found must be a usable pgoutput slot with a position; one
//! missing is created unless the lineage topic shows it was lost; then its lineage is
//! recorded or refreshed, and a failover slot marked.

use super::{Checked, Refused, Step};
use crate::lsn::Lsn;
use crate::postgres::catalog::slots::Slot;
use crate::startup::Wanted;
use crate::startup::facts::Facts;
use crate::startup::lineage::{Guard, judge};

/// The slot: one found must be a usable pgoutput slot with a position; one missing is created
/// unless the lineage topic shows it was lost. Either way its lineage is recorded or
/// refreshed, and a failover slot marked.
pub(super) fn slot(facts: &Facts, wanted: &Wanted, checked: &mut Checked) {
    let lineage = facts.lineage.as_ref();
    let record = lineage.and_then(|l| l.record.as_ref());
    let legacy = lineage.and_then(|l| l.legacy.as_deref());
    let topic = &wanted.lineage_topic;
    let exists = facts.slot.is_some();
    let unreadable = lineage.and_then(|l| l.unreadable.as_deref());
    if let Some(refused) =
        unreadable.and_then(|why| unreadable_record(exists, why, wanted, checked))
    {
        checked.refusals.push(refused);
        return;
    }
    let guard = judge(exists, record, legacy, wanted.allow_new_slot, topic);
    let Some(found) = &facts.slot else {
        match guard {
            // Without the lineage (`status`), a missing slot is only a warning there.
            Guard::Refuse(recorded) if lineage.is_some() => {
                checked.refusals.push(Refused::SlotLost {
                    slot: wanted.slot.clone(),
                    url: wanted.url.clone(),
                    recorded,
                });
                return;
            }
            Guard::Replace(recorded) => checked.warnings.push(format!(
                "--allow-new-slot: creating a fresh slot where this relay streamed before \
                 ({recorded}); events committed between the last acknowledgement and now are \
                 relayed only by `outbox-relay backfill`"
            )),
            _ => {}
        }
        let failover = wanted.slot_failover;
        checked.steps.push(Step::CreateSlot { failover });
        checked.steps.push(Step::RecordLineage);
        return;
    };
    let slot = &wanted.slot;
    if let Some(problem) = &found.unusable {
        let text = unusable(slot, problem, &wanted.dbname);
        checked.refusals.push(Refused::Misconfigured(text));
        return;
    }
    if let Err(refused) = confirmed_flush(slot, found.confirmed_flush.as_deref()) {
        checked.refusals.push(refused);
        return;
    }
    checked.steps.push(match guard {
        // A slot created by `setup`, by hand, or before the lineage topic existed.
        Guard::Keep { record: true } => Step::RecordLineage,
        // Written again, so that time-based retention does not drop it.
        _ => Step::RefreshLineage,
    });
    if wanted.slot_failover && found.failover == Some(false) {
        checked.steps.push(Step::MarkFailover);
    }
}

/// The slot's last lineage record is not one the relay writes (`why`): a slot found is
/// streamed from and its record written over the unreadable one; a missing slot is created
/// only with `--allow-new-slot`, as the record cannot say whether it was lost; otherwise the
/// refusal, which says how to clear it (`drop-slot`).
fn unreadable_record(
    exists: bool,
    why: &str,
    wanted: &Wanted,
    checked: &mut Checked,
) -> Option<Refused> {
    if exists {
        checked.warnings.push(format!(
            "{why}. The slot exists, so the relay writes its record again over that one"
        ));
        return None;
    }
    if wanted.allow_new_slot {
        checked.warnings.push(format!(
            "--allow-new-slot: creating a fresh slot although the lineage topic cannot say \
             whether it was lost ({why})"
        ));
        return None;
    }
    Some(Refused::Lineage(why.to_owned()))
}

/// A slot's confirmed position; none means it lost its WAL.
pub fn confirmed_flush(slot: &str, text: Option<&str>) -> Result<Lsn, Refused> {
    let lsn = text.and_then(|text| text.parse().ok());
    lsn.ok_or_else(|| {
        Refused::Misconfigured(format!(
            "replication slot {slot:?}: it has no confirmed position (it may have been \
             invalidated after exceeding max_slot_wal_keep_size); drop and recreate it, and \
             re-publish or reconcile events written meanwhile"
        ))
    })
}

/// The refusal of a slot the relay cannot use (`problem`: physical, another plugin, another
/// database).
fn unusable(slot: &str, problem: &str, dbname: &str) -> String {
    format!(
        "replication slot {slot:?} {problem}; the relay needs a logical pgoutput slot in \
         database {dbname:?} of --postgres-url. Use another --slot, or drop it with SELECT \
         pg_drop_replication_slot('{slot}'); if nothing uses it"
    )
}

/// The refusal of a slot server process `pid` streams from (`remedy` says what to do).
pub fn in_use(name: &str, pid: i32, remedy: &str) -> String {
    format!(
        "slot {name:?} is in use by server process {pid} (a running relay?); Postgres lets only \
         one session use a slot: {remedy}"
    )
}

/// The slot `peek` may decode without moving it, by start-up's rules for a found slot: it
/// exists (else nothing is pending), no server process streams from it (`remedy` says what to
/// do then), it is a logical pgoutput slot of database `dbname`, and it has a confirmed
/// position, which is returned.
pub fn peekable(
    name: &str,
    dbname: &str,
    found: Option<&Slot>,
    remedy: &str,
) -> Result<Lsn, String> {
    let Some(found) = found else {
        return Err(format!(
            "slot {name:?} does not exist: nothing is pending (the relay or `outbox-relay setup` \
             creates it)"
        ));
    };
    if let Some(pid) = found.active_pid {
        return Err(in_use(name, pid, remedy));
    }
    if let Some(problem) = &found.unusable {
        return Err(unusable(name, problem, dbname));
    }
    confirmed_flush(name, found.confirmed_flush.as_deref()).map_err(|r| r.to_string())
}
