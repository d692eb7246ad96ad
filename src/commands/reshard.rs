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
use crate::postgres::catalog::slots::{self, Slot};
use crate::postgres::{Connector, sql};
use crate::sink::KafkaClients;
use crate::sink::lineage::{Reshard as Resharding, SlotRecord, SlotState};
use crate::startup::checks::in_use;
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
        config,
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
    /// The configuration given, before a shard's suffixes.
    config: &'a Config,
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
    /// This resharding, as the lineage topic records it.
    fn resharding(&self) -> Resharding {
        Resharding {
            from: self.args.from,
            to: self.args.to,
        }
    }

    /// The first step: the new slots, then the wait for the old ones to pass their start.
    async fn start(&self) -> Result<(), CommandError> {
        let mut out = Steps::new();
        self.old_positions().await?;
        let mut newest = Lsn::ZERO;
        for config in self.new {
            let mut wanted = Wanted::new(config);
            wanted.resharding = Some(self.resharding());
            let started = startup::start(&wanted, self.connector, self.kafka).await?;
            let at = started.confirmed_flush;
            newest = newest.max(at);
            let what = if started.slot_created {
                "created"
            } else {
                "exists"
            };
            out.say(format!(
                "new slot {:?} {what}, starting at {at}",
                wanted.slot
            ))
            .await?;
        }
        out.say(format!(
            "waiting for the old slots to be confirmed past {newest}"
        ))
        .await?;
        self.wait_past(newest).await?;
        let from = self.args.from;
        let to = self.args.to;
        out.say(format!(
            "ready: every old slot is past {newest}. Now stop every old relay (standbys too), \
             run `outbox-relay reshard --from {from} --to {to} --finish`, then start the {to} \
             new relays"
        ))
        .await?;
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
    /// stopped, then the old slots go, then the new slots' records no longer say that a
    /// resharding is under way. Run again after an interruption, it takes up where it stopped:
    /// an old slot it dropped is recorded with the position the new slots were moved to.
    async fn finish(&self) -> Result<(), CommandError> {
        let mut out = Steps::new();
        let system = self.system_identifier().await?;
        let mut old = Vec::new();
        for config in self.old {
            old.push(self.old_slot(&system, config).await?);
        }
        if old.iter().any(|slot| !slot.retired) {
            let stopped_at = self.meet(&old, &mut out).await?;
            for (config, slot) in self.old.iter().zip(&old) {
                if !slot.retired {
                    self.retire(&system, config, stopped_at, &mut out).await?;
                }
            }
        }
        for config in self.old {
            self.drop_old_publication(config, &mut out).await?;
        }
        for config in self.new {
            self.finished(&system, config, &mut out).await?;
        }
        let to = self.args.to;
        out.say(format!("done: start the {to} new relays")).await?;
        Ok(())
    }

    /// The cluster's system identifier, which keys its slots' lineage records.
    async fn system_identifier(&self) -> Result<String, CommandError> {
        let topic = &self.config.flags.lineage_topic;
        let slot = &self.config.flags.slot;
        let lineage = Lineage::open(self.connector, self.kafka, topic, slot).await?;
        Ok(lineage.system_identifier().to_owned())
    }

    /// The lineage record of `config`'s slot.
    fn lineage(&self, system: &str, config: &Config) -> Lineage {
        let topic = &config.flags.lineage_topic;
        Lineage::new(self.kafka, topic, &config.flags.slot, system)
    }

    /// An old shard's slot: idle, or dropped by an earlier run of this step.
    async fn old_slot(&self, system: &str, config: &Config) -> Result<OldSlot, CommandError> {
        let name = &config.flags.slot;
        let found = slots::slot(self.client, name).await?;
        let record = match found {
            Some(_) => None,
            None => self.lineage(system, config).read().await?,
        };
        old_slot(name, found.as_ref(), record.as_ref(), self.resharding())
            .map_err(CommandError::Refused)
    }

    /// Moves every new slot to where the old ones stopped, the lowest of their positions
    /// (those dropped by an earlier run count with the position recorded then); returns it.
    async fn meet(&self, old: &[OldSlot], out: &mut Steps) -> Result<Lsn, CommandError> {
        let mut new = Vec::new();
        for config in self.new {
            let remedy = "stop it: the new relays start after --finish";
            let slot = idle_slot(self.client, &config.flags.slot, remedy).await?;
            let at = slot
                .confirmed_flush_lsn
                .and_then(|at| at.parse::<Lsn>().ok());
            new.push((config.flags.slot.clone(), at));
        }
        let old: Vec<(String, Lsn)> = old.iter().map(|o| (o.slot.clone(), o.at)).collect();
        let (stopped_at, new) =
            meeting_point(&old, &new, self.args).map_err(CommandError::Refused)?;
        for (slot, at) in &new {
            if *at < stopped_at {
                let advance = sql::advance_slot(slot, stopped_at);
                let what = "advance a new slot to where the old ones stopped";
                execute(self.client, &advance, what).await?;
            }
            out.say(format!("new slot {slot:?} starts at {stopped_at}"))
                .await?;
        }
        Ok(stopped_at)
    }

    /// Drops an old shard's slot, recorded first in the lineage topic as dropped by this
    /// resharding with the new slots' start `stopped_at` (so that a later resharding may use
    /// the name again, 2 → 4 → 2, that the old shard's relays are refused from then on, and
    /// that a rerun meets the new slots at the same position).
    async fn retire(
        &self,
        system: &str,
        config: &Config,
        stopped_at: Lsn,
        out: &mut Steps,
    ) -> Result<(), CommandError> {
        let slot = &config.flags.slot;
        let lineage = self.lineage(system, config);
        lineage.retired(self.resharding(), stopped_at).await?;
        out.say(format!(
            "recorded old slot {slot:?} as dropped by this resharding"
        ))
        .await?;
        let drop = sql::drop_slot(slot);
        execute(self.client, &drop, "drop an old shard's slot").await?;
        out.say(format!("dropped old slot {slot:?}")).await
    }

    /// Drops an old shard's publication, if it still exists. One unsharded relay's
    /// publication may be the operator's own (sql/): it stays.
    async fn drop_old_publication(
        &self,
        config: &Config,
        out: &mut Steps,
    ) -> Result<(), CommandError> {
        if config.flags.shard.is_none() {
            return Ok(());
        }
        let publication = &config.flags.publication;
        let drop = sql::drop_publication(publication);
        execute(self.client, &drop, "drop an old shard's publication").await?;
        out.say(format!("dropped old publication {publication:?}"))
            .await
    }

    /// A new shard's lineage record no longer says that a resharding is under way: its relay
    /// may start, and the old fleet's relays are refused beside it.
    async fn finished(
        &self,
        system: &str,
        config: &Config,
        out: &mut Steps,
    ) -> Result<(), CommandError> {
        let lineage = self.lineage(system, config);
        let found = lineage.read().await?;
        if found
            .as_ref()
            .is_some_and(|record| record.reshard.is_some())
        {
            lineage.refresh(found.as_ref(), None).await?;
        }
        let slot = &config.flags.slot;
        out.say(format!("new slot {slot:?} is ready to stream"))
            .await
    }
}

/// Where `reshard` says what it did, a line a step. A test seam: with
/// `OUTBOX_RELAY_TEST_RESHARD_PAUSE_AT=TEXT` in its environment, the command stops after the
/// first line containing TEXT (for an hour at most), so that a test can SIGKILL it right after
/// a given step.
struct Steps {
    pause_at: Option<String>,
}

impl Steps {
    fn new() -> Self {
        let pause_at = std::env::var("OUTBOX_RELAY_TEST_RESHARD_PAUSE_AT").ok();
        Steps {
            pause_at: pause_at.filter(|text| !text.is_empty()),
        }
    }

    /// Says `line`, one step done.
    async fn say(&mut self, line: String) -> Result<(), CommandError> {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{line}")?;
        out.flush()?;
        drop(out);
        if self
            .pause_at
            .as_ref()
            .is_some_and(|text| line.contains(text))
        {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
        Ok(())
    }
}

/// An old shard's slot as `--finish` finds it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct OldSlot {
    slot: String,
    /// Its confirmed position, or the one recorded when this resharding dropped it.
    at: Lsn,
    /// Dropped by an earlier run of `--finish`.
    retired: bool,
}

/// PURE: an old shard's slot, from its row (`found`) or, when it is missing, from its last
/// lineage record; refused in use, without a position, or missing without a record that this
/// resharding dropped it.
fn old_slot(
    name: &str,
    found: Option<&Slot>,
    record: Option<&SlotRecord>,
    reshard: Resharding,
) -> Result<OldSlot, String> {
    let stop = "stop every relay of the old shards (standbys too), then run --finish again";
    let at = match (found, record) {
        (Some(found), _) => {
            if let Some(pid) = found.active_pid {
                return Err(in_use(name, pid, stop));
            }
            let at = found
                .confirmed_flush
                .as_deref()
                .and_then(|at| at.parse().ok());
            (at, false)
        }
        (None, Some(record))
            if record.state == SlotState::Dropped && record.reshard == Some(reshard) =>
        {
            let at = record.dropped_lsn.as_deref().and_then(|at| at.parse().ok());
            (at, true)
        }
        (None, _) => (None, false),
    };
    match at {
        (Some(at), retired) => Ok(OldSlot {
            slot: name.to_owned(),
            at,
            retired,
        }),
        (None, _) => Err(missing_old_slot(name)),
    }
}

/// PURE: each old slot's confirmed position, or the refusal of one that does not exist.
fn old_positions(found: Vec<(String, Option<String>)>) -> Result<Vec<(String, Lsn)>, String> {
    let mut positions = Vec::new();
    for (slot, at) in found {
        let Some(at) = at.and_then(|at| at.parse().ok()) else {
            return Err(missing_old_slot(&slot));
        };
        positions.push((slot, at));
    }
    Ok(positions)
}

/// PURE: the refusal of an old shard's slot that is not there.
fn missing_old_slot(slot: &str) -> String {
    format!(
        "slot {slot:?} of the old shards does not exist (or has no position) on \
         --postgres-url's server: check --from and --slot, which name the old shards' slots. \
         reshard needs every old and new slot on that one server, so shards that decode on \
         different standbys cannot be resharded by it"
    )
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

    #[test]
    fn an_old_slot_is_idle_or_dropped_by_this_resharding() {
        let this = Resharding { from: 2, to: 4 };
        let idle = Slot {
            confirmed_flush: Some("0/40".to_owned()),
            ..Slot::default()
        };
        let in_use = Slot {
            active_pid: Some(7),
            ..idle.clone()
        };
        let no_position = Slot::default();
        let dropped = |by: Option<Resharding>, at: Option<&str>| {
            SlotRecord::now("old", "7300", SlotState::Dropped, None)
                .resharding(by)
                .dropped_at_lsn(at.map(str::to_owned))
        };
        let created = SlotRecord::now("old", "7300", SlotState::Created, Some("0/10".into()));
        let by_this = dropped(Some(this), Some("0/30"));
        let by_drop_slot = dropped(None, None);
        let by_another = dropped(Some(Resharding { from: 2, to: 3 }), Some("0/30"));
        let at = |at: u64, retired| {
            Ok(OldSlot {
                slot: "old".to_owned(),
                at: Lsn(at),
                retired,
            })
        };
        let missing = Err(missing_old_slot("old"));
        // (the slot's row, its record when it is missing, what --finish makes of it)
        let cases = [
            (Some(&idle), None, at(0x40, false)),
            // Found, it counts as found, whatever the topic says.
            (Some(&idle), Some(&by_this), at(0x40, false)),
            (Some(&in_use), None, Err(in_use_refusal())),
            (Some(&no_position), None, missing.clone()),
            // Dropped by an earlier run of this step: where the new slots were moved.
            (None, Some(&by_this), at(0x30, true)),
            (None, Some(&by_drop_slot), missing.clone()),
            (None, Some(&by_another), missing.clone()),
            (None, Some(&created), missing.clone()),
            (None, None, missing.clone()),
        ];
        for (found, record, expected) in cases {
            let decided = old_slot("old", found, record, this);
            assert_eq!(decided, expected, "{found:?} {record:?}");
        }
    }

    fn in_use_refusal() -> String {
        let stop = "stop every relay of the old shards (standbys too), then run --finish again";
        in_use("old", 7, stop)
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
