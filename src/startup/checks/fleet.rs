//! PURE: one fleet per outbox. Relays of two shard counts K on the same base slot name split
//! the rows two ways: rows owned by no running shard are skipped for good (each new slot
//! starts at its creation), others are relayed twice. That is what a rolling change of K
//! looks like, so a relay refuses to start beside slots of another K unless a resharding
//! (`outbox-relay reshard`) put them there, which the lineage topic records.

use super::{Checked, Refused};
use crate::sink::lineage::{Reshard, SlotRecord, SlotState};
use crate::startup::Wanted;
use crate::startup::facts::{Facts, FleetSlot};

/// The other fleets' slots: beside a resharding's, a warning; otherwise a refusal naming them
/// and the remedy. Without the lineage (`status`, or before the catalog passed), only a
/// warning, since only the lineage says whether a resharding put them there.
pub(super) fn fleet(facts: &Facts, wanted: &Wanted, checked: &mut Checked) {
    if facts.other_fleets.is_empty() {
        return;
    }
    let Some(lineage) = &facts.lineage else {
        let message = drifting(wanted, &facts.other_fleets);
        checked.warnings.push(message);
        return;
    };
    let own = lineage.record.as_ref();
    // A shard `--finish` retired is refused beside the new fleet, even while the new slots'
    // records still say the resharding is under way: its slot must not come back.
    if let Some(done) = own.and_then(|record| retired_by(wanted, record)) {
        let message = retired(wanted, done, &facts.other_fleets);
        return checked.refusals.push(Refused::Misconfigured(message));
    }
    let records = &lineage.other_fleets;
    let (under_way, drift): (Vec<FleetSlot>, Vec<FleetSlot>) = facts
        .other_fleets
        .iter()
        .cloned()
        .partition(|other| resharding_allows(wanted, other, records));
    if !under_way.is_empty() && wanted.resharding.is_none() {
        checked.warnings.push(resharding_away(wanted, &under_way));
    }
    if drift.is_empty() {
        return;
    }
    checked
        .refusals
        .push(Refused::Misconfigured(refusal(wanted, own, &drift)));
}

/// Whether `other` is there by a resharding between its K and this relay's: a new slot
/// recorded as created by `reshard --from K` (this relay's K: the old fleet runs until
/// `--finish`), or an old slot beside which `reshard` itself creates this new one.
fn resharding_allows(wanted: &Wanted, other: &FleetSlot, records: &[SlotRecord]) -> bool {
    let ours = wanted.count();
    let theirs = other.count();
    let creating = Reshard {
        from: theirs,
        to: ours,
    };
    if wanted.resharding == Some(creating) {
        return true;
    }
    let away = Reshard {
        from: ours,
        to: theirs,
    };
    let record = records.iter().find(|record| record.slot == other.slot);
    record.is_some_and(|r| r.state == SlotState::Created && r.reshard == Some(away))
}

/// This relay and its slot, as a message names them.
fn this_relay(wanted: &Wanted) -> String {
    match wanted.shard {
        Some(shard) => format!("shard {shard} (slot {:?})", wanted.slot),
        None => format!("this relay without --shard (slot {:?})", wanted.slot),
    }
}

/// The slots `others`, named with their fleet's K.
fn named(others: &[FleetSlot]) -> String {
    let names: Vec<String> = others
        .iter()
        .map(|other| format!("{:?} (K = {})", other.slot, other.count()))
        .collect();
    names.join(", ")
}

/// The words for slots of another K, whatever put them there.
fn drifting(wanted: &Wanted, others: &[FleetSlot]) -> String {
    format!(
        "slots of the same base name {:?} exist for another shard count than {}'s: {}. Relays \
         of two shard counts split the rows two ways, so rows owned by no running shard are \
         never relayed and others are relayed twice; a relay refuses to start beside them \
         unless `outbox-relay reshard` put them there",
        wanted.base_slot(),
        this_relay(wanted),
        named(others)
    )
}

/// The warning for an old relay streaming while a resharding to another K is under way.
fn resharding_away(wanted: &Wanted, new: &[FleetSlot]) -> String {
    let to = new.first().map_or(1, FleetSlot::count);
    let from = wanted.count();
    format!(
        "`outbox-relay reshard --from {from} --to {to}` is under way (its new slots: {}): {} \
         streams until it is stopped for `outbox-relay reshard --from {from} --to {to} --finish`",
        named(new),
        this_relay(wanted)
    )
}

/// The resharding whose `--finish` dropped this relay's slot (`own` is its last record), if
/// this relay belongs to the fleet it replaced; `reshard` itself creating slots is not.
fn retired_by(wanted: &Wanted, own: &SlotRecord) -> Option<Reshard> {
    let done = own.retired_from(wanted.count())?;
    wanted.resharding.is_none().then_some(done)
}

/// The refusal of a relay whose slot `done`'s `--finish` dropped, beside the new fleet's
/// slots (`new`).
fn retired(wanted: &Wanted, done: Reshard, new: &[FleetSlot]) -> String {
    format!(
        "{} was retired by `{done} --finish`, which dropped its slot; the new fleet's slots are \
         here: {}. Run the {} new relays instead of this one (creating this slot again would \
         relay the new shards' rows a second time)",
        this_relay(wanted),
        named(new),
        done.to
    )
}

/// The refusal beside slots of another K (`drift`), with the remedy that fits what this
/// relay's own lineage record (`own`) says.
fn refusal(wanted: &Wanted, own: Option<&SlotRecord>, drift: &[FleetSlot]) -> String {
    let ours = wanted.count();
    let under_way = own
        .filter(|record| record.state == SlotState::Created)
        .and_then(|record| record.reshard)
        .filter(|reshard| reshard.to == ours);
    // A new shard, started before `--finish` dropped the old fleet's slots.
    if let Some(under_way) = under_way {
        return format!(
            "{} is a new shard of `{under_way}`, which is not finished: the old fleet's slots \
             still exist ({}). Stop every old relay (standbys too), run `{under_way} --finish`, \
             then start this relay",
            this_relay(wanted),
            named(drift)
        );
    }
    let from = drift.first().map_or(1, FleetSlot::count);
    format!(
        "{}. To change the shard count, run `outbox-relay reshard --from {from} --to {ours}` \
         with the old relays running (see docs/operations.md#resharding); if those slots are \
         left over from relays that no longer run, drop each with `outbox-relay drop-slot` \
         (with its --shard) once nothing in it is needed",
        drifting(wanted, drift)
    )
}
