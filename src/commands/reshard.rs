//! `outbox-relay reshard --from K --to K' [--finish]`: moves the outbox from K relays to K'
//! (1 is one relay without `--shard`) with no event lost and no key's events reordered.
//!
//! 1. With the K old relays running, the first step creates the K' new publications and slots
//!    (nothing streams them yet) and waits until every old slot is confirmed past the newest
//!    new slot's start `S`. From `S` on, each new slot holds every transaction that commits.
//! 2. The operator stops every old relay (standbys too).
//! 3. `--finish` checks that no old slot is in use and that the lowest old position `F` is at
//!    or past `S`, moves every new slot to `F` (`pg_replication_slot_advance`), then drops the
//!    old slots (recorded `dropped` in the lineage topic, as `drop-slot` does) and the old
//!    shards' publications.
//! 4. The operator starts the K' new relays.
//!
//! No loss: an old slot confirmed at `F_i >= F` means its relay delivered all its rows that
//! committed before `F_i`, so the old relays together delivered everything before `F`; a new
//! slot, started at `S <= F` and moved to `F`, streams everything after `F`. No reordering: a
//! key's events before `F` came from one old slot in commit order, those after `F` come from one
//! new slot in commit order, and the new relay starts only after the old one stopped, so its
//! records follow the old ones in the key's partition. Duplicates: an old relay that delivered
//! past `F` (another old slot is behind, or it was killed before confirming) sends those events
//! again through the new slot, as at-least-once allows after any restart.

use std::io::Write;
use std::time::{Duration, Instant};

use tokio_postgres::Client;

use super::status::idle_slot;
use super::{CommandError, execute};
use crate::config::{Config, ReshardArgs};
use crate::lsn::Lsn;
use crate::outbox::Shard;
use crate::postgres::catalog::slots;
use crate::postgres::sql;
use crate::source::lineage::Lineage;
use crate::source::setup;

/// How often the first step reads the old slots' positions.
const POLL: Duration = Duration::from_millis(500);

/// Runs the step `args` names.
pub(super) async fn run(config: &Config, args: &ReshardArgs) -> Result<(), CommandError> {
    if args.from == args.to {
        let same = format!("--from and --to are both {}: nothing to reshard", args.from);
        return Err(CommandError::Refused(same));
    }
    let (old, new) = (shards(config, args.from)?, shards(config, args.to)?);
    let client = setup::connect(config).await?;
    match args.finish {
        false => start(&client, &old, &new, args).await,
        true => finish(&client, &old, &new, args).await,
    }
}

/// The configuration of each of `count` relays.
fn shards(config: &Config, count: u32) -> Result<Vec<Config>, CommandError> {
    let shard = |index| (count > 1).then_some(Shard { index, count });
    let configs = (0..count).map(|index| config.with_shard(shard(index)));
    Ok(configs.collect::<Result<_, _>>()?)
}

/// The first step: the new slots, then the wait for the old ones to pass their start.
async fn start(
    client: &Client,
    old: &[Config],
    new: &[Config],
    args: &ReshardArgs,
) -> Result<(), CommandError> {
    let mut out = std::io::stdout().lock();
    positions(client, old).await?;
    let mut newest = Lsn::ZERO;
    for config in new {
        let slot = setup::prepare(client, config).await?;
        newest = newest.max(slot.confirmed_flush);
        let what = if slot.created { "created" } else { "exists" };
        let (name, at) = (&config.flags.slot, slot.confirmed_flush);
        writeln!(out, "new slot {name:?} {what}, starting at {at}")?;
    }
    writeln!(
        out,
        "waiting for the old slots to be confirmed past {newest}"
    )?;
    let deadline = Instant::now() + args.timeout;
    loop {
        let behind = positions(client, old).await?;
        let behind: Vec<_> = behind.into_iter().filter(|(_, at)| *at < newest).collect();
        if behind.is_empty() {
            break;
        }
        if Instant::now() >= deadline {
            let behind = behind.iter().map(|(slot, at)| format!("{slot:?} at {at}"));
            return Err(CommandError::Refused(format!(
                "within --timeout {}, the old slots {} were not confirmed past {newest}, where \
                 the new slots start: are their relays running? Rerun this step once they are \
                 (the new slots are kept)",
                humantime::format_duration(args.timeout),
                behind.collect::<Vec<_>>().join(", ")
            )));
        }
        tokio::time::sleep(POLL).await;
    }
    let (from, to) = (args.from, args.to);
    writeln!(
        out,
        "ready: every old slot is past {newest}. Now stop every old relay (standbys too), run \
         `outbox-relay reshard --from {from} --to {to} --finish`, then start the {to} new relays"
    )?;
    Ok(())
}

/// Each slot's confirmed position; a missing slot is refused.
async fn positions(
    client: &Client,
    configs: &[Config],
) -> Result<Vec<(String, Lsn)>, CommandError> {
    let names: Vec<String> = configs.iter().map(|c| c.flags.slot.clone()).collect();
    let found = slots::positions(client, &names).await?;
    let position = |(slot, at): (String, Option<String>)| match at.and_then(|at| at.parse().ok()) {
        Some(at) => Ok((slot, at)),
        None => Err(CommandError::Refused(format!(
            "slot {slot:?} of the old shards does not exist (or has no position) on \
                 --postgres-url's server: check --from and --slot, which name the old shards' \
                 slots. reshard needs every old and new slot on that one server, so shards that \
                 decode on different standbys cannot be resharded by it"
        ))),
    };
    found.into_iter().map(position).collect()
}

/// The second step, with the old relays stopped: the new slots move to where the old ones
/// stopped, then the old slots go.
async fn finish(
    client: &Client,
    old: &[Config],
    new: &[Config],
    args: &ReshardArgs,
) -> Result<(), CommandError> {
    let mut out = std::io::stdout().lock();
    let stop = "stop every relay of the old shards (standbys too), then run --finish again";
    for config in old {
        idle_slot(client, &config.flags.slot, stop).await?;
    }
    let stopped_at = positions(client, old)
        .await?
        .into_iter()
        .map(|(_, at)| at)
        .min();
    let stopped_at = stopped_at.unwrap_or(Lsn(u64::MAX));
    let first = format!(
        "run `outbox-relay reshard --from {} --to {}` first",
        args.from, args.to
    );
    let mut new_slots = Vec::new();
    for config in new {
        let remedy = "stop it: the new relays start after --finish";
        let slot = idle_slot(client, &config.flags.slot, remedy).await?;
        let at = slot
            .confirmed_flush_lsn
            .and_then(|at| at.parse::<Lsn>().ok());
        let at = at.ok_or_else(|| {
            let name = &config.flags.slot;
            CommandError::Refused(format!("new slot {name:?} does not exist: {first}"))
        })?;
        new_slots.push((config.flags.slot.clone(), at));
    }
    if let Some((slot, at)) = new_slots.iter().find(|(_, at)| *at > stopped_at) {
        return Err(CommandError::Refused(format!(
            "the old slots stopped at {stopped_at}, before new slot {slot:?} starts ({at}): \
             events in between would be lost. Start the old relays again and {first}, which \
             waits until they are past it"
        )));
    }
    for (slot, at) in &new_slots {
        if *at < stopped_at {
            let advance = sql::advance_slot(slot, stopped_at);
            let what = "advance a new slot to where the old ones stopped";
            execute(client, &advance, what).await?;
        }
        writeln!(out, "new slot {slot:?} starts at {stopped_at}")?;
    }
    for config in old {
        let (slot, publication) = (&config.flags.slot, &config.flags.publication);
        // So that a later resharding may use the name again (2 → 4 → 2): dropped, not lost.
        Lineage::open(config).await?.dropped().await?;
        execute(client, &sql::drop_slot(slot), "drop an old shard's slot").await?;
        writeln!(out, "dropped old slot {slot:?}")?;
        // One unsharded relay's publication may be the operator's own (sql/): it stays.
        if config.flags.shard.is_some() {
            let drop = sql::drop_publication(publication);
            execute(client, &drop, "drop an old shard's publication").await?;
            writeln!(out, "dropped old publication {publication:?}")?;
        }
    }
    let to = args.to;
    writeln!(out, "done: start the {to} new relays")?;
    Ok(())
}
