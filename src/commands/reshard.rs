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
use crate::postgres::{Connector, sql};
use crate::sink::KafkaClients;
use crate::startup::lineage::Lineage;
use crate::startup::{self, Wanted};

/// How often the first step reads the old slots' positions.
const POLL: Duration = Duration::from_millis(500);

/// Runs the step `args` names.
pub(super) async fn run(config: &Config, args: &ReshardArgs) -> Result<(), CommandError> {
    if args.from == args.to {
        return Err(CommandError::Refused(nothing_to_reshard(args.from)));
    }
    let old = shards(config, args.from)?;
    let new = shards(config, args.to)?;
    let connector = Connector::new(config.postgres.clone());
    let kafka = super::kafka(config);
    let client = connector.control().await?;
    let reshard = Reshard {
        client: &client,
        connector: &connector,
        kafka: &kafka,
        old: &old,
        new: &new,
        args,
    };
    match args.finish {
        false => reshard.start().await,
        true => reshard.finish().await,
    }
}

/// The refusal of a resharding to the same count.
fn nothing_to_reshard(count: u32) -> String {
    format!("--from and --to are both {count}: nothing to reshard")
}

/// The configuration of each of `count` relays.
fn shards(config: &Config, count: u32) -> Result<Vec<Config>, CommandError> {
    let shard = |index| (count > 1).then_some(Shard { index, count });
    let configs = (0..count).map(|index| config.with_shard(shard(index)));
    Ok(configs.collect::<Result<_, _>>()?)
}

/// One step, on the server of `--postgres-url`.
struct Reshard<'a> {
    client: &'a Client,
    connector: &'a Connector,
    kafka: &'a KafkaClients,
    /// Each old relay's configuration.
    old: &'a [Config],
    /// Each new relay's configuration.
    new: &'a [Config],
    args: &'a ReshardArgs,
}

impl Reshard<'_> {
    /// The first step: the new slots, then the wait for the old ones to pass their start.
    async fn start(&self) -> Result<(), CommandError> {
        let mut out = std::io::stdout().lock();
        self.old_positions().await?;
        let mut newest = Lsn::ZERO;
        for config in self.new {
            let wanted = Wanted::new(config);
            let started = startup::start(&wanted, self.connector, self.kafka).await?;
            let at = started.confirmed_flush;
            newest = newest.max(at);
            let what = if started.slot_created {
                "created"
            } else {
                "exists"
            };
            writeln!(out, "new slot {:?} {what}, starting at {at}", wanted.slot)?;
        }
        writeln!(
            out,
            "waiting for the old slots to be confirmed past {newest}"
        )?;
        self.wait_past(newest).await?;
        let from = self.args.from;
        let to = self.args.to;
        writeln!(
            out,
            "ready: every old slot is past {newest}. Now stop every old relay (standbys too), \
             run `outbox-relay reshard --from {from} --to {to} --finish`, then start the {to} \
             new relays"
        )?;
        Ok(())
    }

    /// Waits, up to `--timeout`, until every old slot is confirmed at or past `newest`.
    async fn wait_past(&self, newest: Lsn) -> Result<(), CommandError> {
        let deadline = Instant::now() + self.args.timeout;
        loop {
            let positions = self.old_positions().await?;
            let behind: Vec<_> = positions
                .into_iter()
                .filter(|(_, at)| *at < newest)
                .collect();
            if behind.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let refused = still_behind(self.args.timeout, &behind, newest);
                return Err(CommandError::Refused(refused));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Each old slot's confirmed position; a missing one is refused.
    async fn old_positions(&self) -> Result<Vec<(String, Lsn)>, CommandError> {
        let names: Vec<String> = self.old.iter().map(|c| c.flags.slot.clone()).collect();
        let found = slots::positions(self.client, &names).await?;
        old_positions(found).map_err(CommandError::Refused)
    }

    /// The second step, with the old relays stopped: the new slots move to where the old ones
    /// stopped, then the old slots go.
    async fn finish(&self) -> Result<(), CommandError> {
        let mut out = std::io::stdout().lock();
        let stop = "stop every relay of the old shards (standbys too), then run --finish again";
        for config in self.old {
            idle_slot(self.client, &config.flags.slot, stop).await?;
        }
        let old = self.old_positions().await?;
        let mut new = Vec::new();
        for config in self.new {
            let remedy = "stop it: the new relays start after --finish";
            let slot = idle_slot(self.client, &config.flags.slot, remedy).await?;
            let at = slot
                .confirmed_flush_lsn
                .and_then(|at| at.parse::<Lsn>().ok());
            new.push((config.flags.slot.clone(), at));
        }
        let (stopped_at, new) =
            meeting_point(&old, &new, self.args).map_err(CommandError::Refused)?;
        for (slot, at) in &new {
            if *at < stopped_at {
                let advance = sql::advance_slot(slot, stopped_at);
                let what = "advance a new slot to where the old ones stopped";
                execute(self.client, &advance, what).await?;
            }
            writeln!(out, "new slot {slot:?} starts at {stopped_at}")?;
        }
        for config in self.old {
            self.drop_old(config, &mut out).await?;
        }
        let to = self.args.to;
        writeln!(out, "done: start the {to} new relays")?;
        Ok(())
    }

    /// Drops an old shard's slot (recorded `dropped` in the lineage topic first) and its
    /// publication.
    async fn drop_old(&self, config: &Config, out: &mut impl Write) -> Result<(), CommandError> {
        let slot = &config.flags.slot;
        let publication = &config.flags.publication;
        // So that a later resharding may use the name again (2 → 4 → 2): dropped, not lost.
        let topic = &config.flags.lineage_topic;
        let lineage = Lineage::open(self.connector, self.kafka, topic, slot).await?;
        lineage.dropped().await?;
        let drop = sql::drop_slot(slot);
        execute(self.client, &drop, "drop an old shard's slot").await?;
        writeln!(out, "dropped old slot {slot:?}")?;
        // One unsharded relay's publication may be the operator's own (sql/): it stays.
        if config.flags.shard.is_some() {
            let drop = sql::drop_publication(publication);
            execute(self.client, &drop, "drop an old shard's publication").await?;
            writeln!(out, "dropped old publication {publication:?}")?;
        }
        Ok(())
    }
}

/// PURE: each old slot's confirmed position, or the refusal of one that does not exist.
fn old_positions(found: Vec<(String, Option<String>)>) -> Result<Vec<(String, Lsn)>, String> {
    let mut positions = Vec::new();
    for (slot, at) in found {
        let Some(at) = at.and_then(|at| at.parse().ok()) else {
            return Err(format!(
                "slot {slot:?} of the old shards does not exist (or has no position) on \
                 --postgres-url's server: check --from and --slot, which name the old shards' \
                 slots. reshard needs every old and new slot on that one server, so shards that \
                 decode on different standbys cannot be resharded by it"
            ));
        };
        positions.push((slot, at));
    }
    Ok(positions)
}

/// PURE: the refusal when old slots stay `behind` the new slots' start `newest`.
fn still_behind(timeout: Duration, behind: &[(String, Lsn)], newest: Lsn) -> String {
    let behind: Vec<String> = behind
        .iter()
        .map(|(slot, at)| format!("{slot:?} at {at}"))
        .collect();
    format!(
        "within --timeout {}, the old slots {} were not confirmed past {newest}, where the new \
         slots start: are their relays running? Rerun this step once they are (the new slots \
         are kept)",
        humantime::format_duration(timeout),
        behind.join(", ")
    )
}

/// PURE: where the new slots start, the lowest position the old ones stopped at, with each new
/// slot's position now; refused when a new slot is missing or starts after that point (the
/// events in between would be lost).
fn meeting_point(
    old: &[(String, Lsn)],
    new: &[(String, Option<Lsn>)],
    args: &ReshardArgs,
) -> Result<(Lsn, Vec<(String, Lsn)>), String> {
    let stopped_at = old.iter().map(|(_, at)| *at).min().unwrap_or(Lsn(u64::MAX));
    let first = format!(
        "run `outbox-relay reshard --from {} --to {}` first",
        args.from, args.to
    );
    let mut found = Vec::new();
    for (slot, at) in new {
        let Some(at) = at else {
            return Err(format!("new slot {slot:?} does not exist: {first}"));
        };
        if *at > stopped_at {
            return Err(format!(
                "the old slots stopped at {stopped_at}, before new slot {slot:?} starts ({at}): \
                 events in between would be lost. Start the old relays again and {first}, which \
                 waits until they are past it"
            ));
        }
        found.push((slot.clone(), *at));
    }
    Ok((stopped_at, found))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(finish: bool) -> ReshardArgs {
        ReshardArgs {
            from: 2,
            to: 4,
            finish,
            timeout: Duration::from_secs(60),
        }
    }

    fn slot(name: &str, at: u64) -> (String, Lsn) {
        (name.to_owned(), Lsn(at))
    }

    #[test]
    fn resharding_refuses_the_same_count_and_a_missing_old_slot() {
        assert!(nothing_to_reshard(2).contains("both 2"));
        let found = vec![("a".to_owned(), Some("0/10".to_owned()))];
        assert_eq!(old_positions(found), Ok(vec![slot("a", 0x10)]));
        let missing = vec![
            ("a".to_owned(), Some("0/10".to_owned())),
            ("b".to_owned(), None),
        ];
        let refused = old_positions(missing).unwrap_err();
        assert!(
            refused.contains("\"b\" of the old shards does not exist"),
            "{refused}"
        );
        let behind = still_behind(Duration::from_secs(60), &[slot("a", 0x10)], Lsn(0x20));
        for needle in ["--timeout 1m", "\"a\" at 0/10", "past 0/20", "kept"] {
            assert!(behind.contains(needle), "{needle}: {behind}");
        }
    }

    /// One case: the new slots' positions, and where they meet the old ones or the words of
    /// the refusal.
    struct Case {
        new: &'static [(&'static str, Option<u64>)],
        meets_at: Option<u64>,
        refused: &'static str,
    }

    #[test]
    fn new_slots_meet_the_old_ones_where_the_first_stopped_or_are_refused() {
        let old = [slot("old0", 0x50), slot("old1", 0x40)];
        let cases = [
            Case {
                new: &[("new0", Some(0x30)), ("new1", Some(0x40))],
                meets_at: Some(0x40),
                refused: "",
            },
            Case {
                new: &[("new0", None)],
                meets_at: None,
                refused: "new slot \"new0\" does not exist: run",
            },
            Case {
                new: &[("new0", Some(0x41))],
                meets_at: None,
                refused: "before new slot \"new0\" starts (0/41)",
            },
        ];
        for case in cases {
            let new: Vec<(String, Option<Lsn>)> = (case.new.iter())
                .map(|(name, at)| ((*name).to_owned(), at.map(Lsn)))
                .collect();
            match (meeting_point(&old, &new, &args(true)), case.meets_at) {
                (Ok((at, found)), Some(point)) => {
                    assert_eq!(at, Lsn(point), "{new:?}");
                    assert_eq!(found.len(), new.len(), "{new:?}");
                }
                (Err(refused), None) => assert!(refused.contains(case.refused), "{refused}"),
                (decided, _) => panic!("{new:?}: {decided:?}"),
            }
        }
    }
}
