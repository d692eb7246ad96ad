//! `--cleanup delete` in the simulated world: the outbox table's rows, a deleter
//! that is slow, blocked (a statement stuck for minutes), refused by a row
//! another session holds, or failing (retriably, or for good until the
//! operator fixes it), and the oracle's checks: no row is deleted before
//! everything it held reached Kafka (a dead-letter record without the payload
//! keeps its row for good), the slot never passes a transaction whose rows are
//! still there, the rows waiting to be deleted stay within
//! `--max-in-flight-events` (and `/readyz` says when reading pauses), a delete
//! holds up neither the delivery reports nor a stop, and after recovery every
//! row relayed whole is gone.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use outbox_relay::observability::health::evaluate;
use outbox_relay::outbox::TableName;
use outbox_relay::pipeline::cleanup::Cleanup;
use outbox_relay::sink::exactly_once::Position;
use outbox_relay::source::SourceError;
use outbox_relay::source::deleter::{DeleteFailure, Deleter, Table};
use rand::Rng;
use tokio::time::Instant;

use super::{DLQ, Shared, World};

/// The simulated outbox table.
pub struct Rows {
    /// Ids of the rows still there: every outbox row the WAL inserted, until deleted.
    pub present: BTreeSet<String>,
    /// Rows another session holds, until when.
    pub locked: BTreeMap<String, Instant>,
    /// Deletes fail for good until the operator fixes the cause (after the relay stopped).
    pub refusing: bool,
}

impl Rows {
    pub fn new(world_rows: impl Iterator<Item = String>) -> Rows {
        Rows {
            present: world_rows.collect(),
            locked: BTreeMap::new(),
            refusing: false,
        }
    }
}

/// What one delete does, drawn when it starts.
enum Behaviour {
    Fine,
    /// Blocked for minutes (a lock wait, a stalled server): the pipeline must not wait.
    Blocked,
    Fails,
    Refused,
}

/// The relay's `--cleanup delete` over the simulated table.
pub fn cleanup(shared: &Shared) -> Cleanup {
    let outbox = TableName {
        schema: "public".into(),
        name: "outbox".into(),
    };
    let table = Table::new(&outbox, vec!["id".into()]);
    Cleanup::with(vec![table], Box::new(SimDeleter(shared.clone())))
}

struct SimDeleter(Shared);

impl Deleter for SimDeleter {
    fn delete<'a>(
        &'a mut self,
        table: &'a Table,
        keys: &'a [&'a str],
    ) -> BoxFuture<'a, Result<Vec<usize>, DeleteFailure>> {
        async move {
            let ids: Vec<String> = keys.iter().map(|k| id_of(k)).collect();
            let (behaviour, pause, run) = self.0.lock().start_delete(&ids);
            let failure = |permanent| DeleteFailure {
                table: table.name().to_owned(),
                permanent,
                source: SourceError::Misconfigured(match permanent {
                    true => "simulated: a trigger refuses the delete".into(),
                    false => "simulated: canceling statement due to lock timeout".into(),
                }),
            };
            match behaviour {
                Behaviour::Blocked => {
                    // Records appended in the first half must have their reports processed
                    // by the end: the pipeline kept handling deliveries meanwhile.
                    tokio::time::sleep(pause / 2).await;
                    let appended = self.0.lock().appended();
                    tokio::time::sleep(pause / 2).await;
                    self.0.lock().check_reports_flowed(run, appended);
                }
                _ => tokio::time::sleep(pause).await,
            }
            match behaviour {
                Behaviour::Fails => Err(failure(false)),
                Behaviour::Refused => Err(failure(true)),
                Behaviour::Fine | Behaviour::Blocked => Ok(self.0.lock().delete(&ids)),
            }
        }
        .boxed()
    }
}

/// The id in a key as the relay builds it, `{"id":"e5"}`.
fn id_of(key: &str) -> String {
    let value: serde_json::Value = serde_json::from_str(key).unwrap_or_default();
    value["id"].as_str().unwrap_or_default().to_owned()
}

/// What a run's pipeline had processed when a blocked delete began: its number, the
/// records appended and the acks it had counted.
pub type RunMark = (u64, usize, u64);

impl World {
    /// A delete of `ids` begins: how it goes, how long it takes, and where the run was.
    fn start_delete(&mut self, ids: &[String]) -> (Behaviour, Duration, RunMark) {
        let mark = (self.runs, self.appended(), self.acks_counted());
        let refusing = self.cleanup.as_ref().is_some_and(|c| c.refusing);
        let behaviour = match (refusing, self.fault_now()) {
            (true, _) => Behaviour::Refused,
            (false, false) => Behaviour::Fine,
            (false, true) => match self.rng.random_range(0..4) {
                0 => {
                    self.note("fault: delete blocked".into());
                    Behaviour::Blocked
                }
                1 => {
                    self.note("fault: delete fails".into());
                    Behaviour::Fails
                }
                2 => {
                    self.note("fault: delete refused for good".into());
                    if let Some(rows) = self.cleanup.as_mut() {
                        rows.refusing = true;
                    }
                    Behaviour::Refused
                }
                _ => {
                    // Another session locks one of the rows (an open transaction).
                    let id = ids[self.rng.random_range(0..ids.len())].clone();
                    let until = Instant::now() + Duration::from_secs(self.rng.random_range(1..120));
                    self.note(format!("fault: row locked ({id})"));
                    if let Some(rows) = self.cleanup.as_mut() {
                        rows.locked.insert(id, until);
                    }
                    Behaviour::Fine
                }
            },
        };
        let pause = match behaviour {
            Behaviour::Blocked => Duration::from_secs(self.rng.random_range(30..300)),
            _ => Duration::from_millis(self.rng.random_range(0..200)),
        };
        (behaviour, pause, mark)
    }

    /// Deletes the rows of `ids` nobody holds; returns the positions of those left.
    fn delete(&mut self, ids: &[String]) -> Vec<usize> {
        let now = Instant::now();
        let mut held = Vec::new();
        let mut early = Vec::new();
        let Some(rows) = self.cleanup.as_mut() else {
            return held;
        };
        rows.locked.retain(|_, until| *until > now);
        for (n, id) in ids.iter().enumerate() {
            if rows.locked.contains_key(id) {
                held.push(n);
            } else if rows.present.remove(id) {
                early.push(id.clone());
            }
        }
        let full = self.delivered_whole();
        for id in early {
            self.note(format!("deleted {id}"));
            if !full.contains(&id) {
                self.complain(format!(
                    "row {id} deleted before everything it held reached Kafka"
                ));
            }
        }
        held
    }

    /// Ids whose event reached Kafka whole: in its topic, or dead-lettered with the payload.
    fn delivered_whole(&self) -> BTreeSet<String> {
        let logs = self.broker.logs.iter();
        let records = logs.flat_map(|((topic, _), log)| log.iter().map(move |r| (topic, r)));
        records
            .filter(|(topic, r)| *topic != DLQ || r.payload.is_some())
            .map(|(_, r)| r.id.clone())
            .collect()
    }

    /// A promotion: the new primary's table holds the rows of its own WAL after `switch`,
    /// not those of the old primary's it replaced.
    pub fn promoted(&mut self, replaced: &[(super::wal::Event, Position)], switch: u64) {
        let Some(rows) = self.cleanup.as_mut() else {
            return;
        };
        for (event, _) in replaced {
            rows.present.remove(&event.id);
        }
        let after = self.wal.txs.iter().filter(|tx| tx.final_lsn > switch);
        for change in after.flat_map(|tx| tx.changes.iter()) {
            if let super::wal::Change::Row(e) = change {
                rows.present.insert(e.id.clone());
            }
        }
    }

    /// The standby relay (with `--cleanup delete` too) confirms up to `end`: it deleted the
    /// rows before it that reached Kafka whole.
    pub fn rival_deletes(&mut self, end: u64) {
        let full = self.delivered_whole();
        let Some(rows) = self.cleanup.as_mut() else {
            return;
        };
        let covered = self.wal.txs.iter().filter(|tx| tx.end_lsn <= end);
        for change in covered.flat_map(|tx| tx.changes.iter()) {
            if let super::wal::Change::Row(e) = change
                && full.contains(&e.id)
            {
                rows.present.remove(&e.id);
            }
        }
    }

    /// Ids dead-lettered without their payload: their rows stay in the table for good.
    fn kept(&self) -> BTreeSet<String> {
        let dead = self
            .broker
            .logs
            .iter()
            .filter(|((topic, _), _)| topic == DLQ);
        let records = dead.flat_map(|(_, log)| log.iter());
        let without = records.filter(|r| r.payload.is_none());
        without.map(|r| r.id.clone()).collect()
    }

    /// Oracle, at each send: the rows waiting to be deleted stay within
    /// `--max-in-flight-events`, counted in the table (rows the current run relayed and has
    /// not deleted) and as the relay publishes them, and `/readyz` says when reading pauses.
    pub fn check_backlog(&mut self) {
        let Some(rows) = self.cleanup.as_ref() else {
            return;
        };
        let kept = self.kept();
        let waiting = self
            .sent
            .iter()
            .filter(|id| rows.present.contains(*id) && !kept.contains(*id));
        let waiting = waiting.count();
        let limit = self.plan.max_events;
        let Some(health) = self.health.clone() else {
            return;
        };
        let published = health.progress().cleanup;
        let readiness = evaluate(
            &health.snapshot(std::time::Instant::now()),
            &health.thresholds(),
        );
        let shown = readiness
            .reasons
            .iter()
            .any(|r| r.starts_with("--cleanup delete"));
        if waiting > limit || published.rows > limit {
            self.complain(format!(
                "{waiting} relayed rows wait in the table, {} in the relay's backlog, limit {limit}",
                published.rows
            ));
        } else if published.full && !shown {
            self.complain("the cleanup backlog is full but /readyz gives no reason".into());
        }
    }

    /// Records the broker appended from the relay's producer so far.
    pub fn appended(&self) -> usize {
        let all: usize = self.broker.logs.values().map(Vec::len).sum();
        all - self.broker.appended_directly
    }

    /// Acks the current run's pipeline has processed, as it published them.
    fn acks_counted(&self) -> u64 {
        self.health
            .as_ref()
            .map_or(0, |h| h.progress().events_acked)
    }

    /// Oracle, at the end of a blocked delete: the reports of the records appended in its
    /// first half were processed (a pipeline waiting on the delete processes none).
    fn check_reports_flowed(
        &mut self,
        (run, appended_before, acked_before): RunMark,
        appended: usize,
    ) {
        if self.runs != run || self.crash {
            return;
        }
        let due = appended.saturating_sub(appended_before) as u64;
        let acked = self.acks_counted().saturating_sub(acked_before);
        if acked < due {
            self.complain(format!(
                "a blocked delete held up delivery reports: {due} records appended while it \
                 ran, {acked} acks processed"
            ));
        }
    }

    /// Oracle, on a position reported to Postgres: no transaction it covers has a row
    /// still in the table, unless the row is kept (its event was not delivered whole).
    pub fn check_cleared(&mut self, lsn: u64) {
        let Some(rows) = self.cleanup.as_ref() else {
            return;
        };
        // A row dead-lettered without its payload is kept, even if a copy from an earlier
        // run is in its topic (the relay cannot know).
        let (full, kept) = (self.delivered_whole(), self.kept());
        let owed =
            |id: &String| rows.present.contains(id) && full.contains(id) && !kept.contains(id);
        let covered = self.wal.txs.iter().filter(|tx| tx.end_lsn <= lsn);
        let left = covered
            .flat_map(|tx| tx.changes.iter())
            .find_map(|change| match change {
                super::wal::Change::Row(e) if owed(&e.id) => Some(e.id.clone()),
                _ => None,
            });
        if let Some(id) = left {
            self.complain(format!(
                "confirmed {lsn:X} past the transaction of row {id}, which is still in the table"
            ));
        }
    }

    /// Oracle, after recovery: every row whose event reached Kafka whole is deleted, and a
    /// row dead-lettered without its payload is kept.
    pub fn check_cleanup_end(&mut self) {
        let Some(rows) = self.cleanup.as_ref() else {
            return;
        };
        let (full, kept) = (self.delivered_whole(), self.kept());
        let mut problems: Vec<String> = rows
            .present
            .iter()
            .filter(|id| full.contains(*id) && !kept.contains(*id))
            .map(|id| format!("row {id} was relayed whole but never deleted"))
            .collect();
        let changes = self.wal.txs.iter().flat_map(|tx| tx.changes.iter());
        let gone = changes.filter_map(|change| match change {
            super::wal::Change::Row(e) if !rows.present.contains(&e.id) => Some(&e.id),
            _ => None,
        });
        problems.extend(
            gone.filter(|id| !full.contains(*id))
                .map(|id| format!("row {id} deleted though its event never reached Kafka whole")),
        );
        if let Some(first) = problems.into_iter().next() {
            self.complain(first);
        }
    }
}

/// How long after SIGTERM a run may take to stop: `--shutdown-timeout` plus the final
/// publication check and the stream's close.
pub fn stop_bound(shutdown_timeout: Duration) -> Duration {
    shutdown_timeout + Duration::from_secs(10)
}
