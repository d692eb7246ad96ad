//! What an operator does after the failures that lose events unless someone acts: a lost slot,
//! an invalidated slot, a changed publication. Kept in one place so that every error, log line,
//! `/readyz` reason and `status` warning that meets one of them gives the same way back.

/// After a slot went missing where the relay streamed before (exit 7, at start-up or on a
/// reconnect): what a new slot would skip, and how to get it back.
pub const LOST_SLOT: &str = "No slot was created: a new one would skip the events committed \
    since the last acknowledgement. Start the relay once with --allow-new-slot (it creates a \
    fresh slot and relays new events), then run `outbox-relay backfill --since TIMESTAMP` with a \
    time before the change to re-publish the rows the slot never saw (at-least-once: consumers \
    may see duplicates)";

/// After the publication was dropped and re-created, or a table left it and came back.
pub const PUBLICATION_CHANGED: &str = "Restore it (starting the relay creates a missing one) and \
    run `outbox-relay backfill --since TIMESTAMP` with a time before the change";

/// The way back from a slot that can no longer stream.
const RECREATE: &str = "Drop the slot (outbox-relay drop-slot --yes-i-know), start the relay \
    (it creates a fresh slot), and re-publish events committed since the last confirmed position \
    (`outbox-relay backfill --since TIMESTAMP`)";

/// For a slot whose `wal_status` is `lost`.
pub fn wal_lost() -> String {
    format!(
        "the slot's wal_status is 'lost': Postgres removed WAL it needed and it cannot stream. \
         {RECREATE}; raise max_slot_wal_keep_size to avoid a repeat"
    )
}

/// For an invalidated slot (`invalidation_reason`, or `conflicting` on 16): the cause, the fix
/// and the way back.
pub fn invalidated_slot(reason: &str) -> String {
    const FEEDBACK: &str = "set hot_standby_feedback = on on the standby and stream it through \
        a physical slot on the primary (primary_slot_name), so the primary keeps catalog rows \
        the slot needs";
    const WAL_LEVEL: &str = "set wal_level = logical on the primary and restart it";
    let cause = match reason {
        "rows_removed" => format!(
            "invalidation_reason rows_removed: the primary removed catalog rows the slot still \
             needed; {FEEDBACK}"
        ),
        "wal_level_insufficient" => format!(
            "invalidation_reason wal_level_insufficient: the primary's wal_level is below \
             logical; {WAL_LEVEL}"
        ),
        "conflict with recovery" => format!(
            "conflicting = true: a recovery conflict on the standby. Either the primary removed \
             catalog rows the slot needed ({FEEDBACK}), or its wal_level fell below logical \
             ({WAL_LEVEL})"
        ),
        "wal_removed" => "invalidation_reason wal_removed: the slot held more WAL than \
            max_slot_wal_keep_size; raise it"
            .to_owned(),
        other => format!("invalidation_reason {other}"),
    };
    format!("the slot is invalidated ({reason}) and cannot stream. Cause: {cause}. {RECREATE}")
}
