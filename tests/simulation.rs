//! Deterministic simulation: the real pipeline against a simulated Postgres
//! and Kafka under seeded fault schedules, with an oracle checked at every
//! step (issue 12 §2).
//!
//! `SIM_SEED=N cargo test --test integration simulation` replays one
//! schedule; `SIM_SCHEDULES=N` runs N schedules (default 10,000) from
//! `SIM_FIRST` (default 0). Each schedule is a fresh current-thread runtime
//! with paused time, so the same seed takes the same path.
//!
//! A schedule draws the policies (`--delivery`, `--on-poison`, a `FOR ALL
//! TABLES` publication), small in-flight caps and a short WAL (empty, small
//! and large transactions of outbox rows, logical messages and other rows),
//! then injects a few faults at random steps and recovers without them:
//! stream breaks, crashes, SIGTERM, broker outages, poison (refused in the
//! batch, alone, or at hand-over), permanent and batch-wide delivery
//! failures, refused hand-overs and dead-letter records, a promotion (the
//! standby's WAL diverging from the old primary's, its slot behind) and a
//! standby relay taking the slot over for a while. In 30% of schedules keys
//! and values are Avro through a simulated Schema Registry (`registry`) with
//! scheduled outages, so records wait for their schema ids.
//!
//! The oracle checks at every confirmation that no transaction with an event
//! the broker does not hold is passed, and at the end that each event is in
//! its topic with its key and payload (exactly-once: in its key's partition,
//! with its position), each key in one partition per topic, only poison in
//! the dead-letter topic, per-key order and, under exactly-once, no
//! duplicate beyond docs/guarantees.md's exceptions.
//!
//! Under `--cleanup delete` the outbox table is simulated too, with slow,
//! blocked, held and failing deletes (`cleanup`). Not simulated: partitioned
//! outboxes, which the integration tests cover against real servers.

mod broker;
mod cleanup;
mod registry;
mod relay;
mod wal;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tokio::sync::Notify;

use broker::{Broker, Logged};
use outbox_relay::sink::exactly_once::{
    CHANGE_HEADER, LSN_HEADER, Position, SOURCE_HEADER, partition_for,
};
use wal::{Event, Item, Wal};

/// The dead-letter topic under `--on-poison dead-letter`.
pub const DLQ: &str = "dlq";
/// The simulated cluster's system identifier (a promotion keeps it).
pub const SYSTEM_ID: &str = "7000000000000000001";

/// The knobs one schedule draws.
#[derive(Clone, Debug)]
pub struct Plan {
    pub exactly_once: bool,
    pub dead_letter: bool,
    pub all_tables: bool,
    pub max_events: usize,
    pub max_bytes: usize,
    /// Faults still to inject; the schedule then recovers without any.
    pub faults: u32,
    /// Per-step chance of a fault, in 1/1000.
    pub fault_rate: u32,
    /// `--cleanup delete`.
    pub cleanup: bool,
    /// Avro keys and values through a Schema Registry that fails and recovers.
    pub registry: bool,
}

/// The simulated world: Postgres' WAL and slot, the broker, the fault
/// schedule and the oracle's bookkeeping. Shared by the trait
/// implementations; never locked across an await.
pub struct World {
    pub rng: ChaCha8Rng,
    pub plan: Plan,
    pub wal: Wal,
    /// The slot's confirmed position.
    pub confirmed: u64,
    pub broker: Broker,
    /// The live replication session: its number and what it still sends.
    pub session: Option<(u64, std::collections::VecDeque<Item>)>,
    pub sessions: u64,
    /// The current run's shutdown signal (SIGTERM).
    pub sigterm: Option<tokio::sync::oneshot::Sender<()>>,
    /// A crash is under way: the driver drops the pipeline.
    pub crash: bool,
    /// The current run's delivery reports.
    pub deliveries: Option<tokio::sync::mpsc::UnboundedSender<outbox_relay::sink::Delivery>>,
    pub faults_on: bool,
    /// What happened, for a failing seed's report.
    pub trace: Vec<String>,
    /// Largest record the schedule can produce (the byte cap's slack).
    pub largest: usize,
    /// Events refused with their batch: docs/guarantees.md's exception to per-key
    /// order (sent again alone, they land after later records of their partition).
    pub batch_refused: BTreeSet<String>,
    /// Events the broker refused as poison at some point: only they may be dead-lettered.
    pub poisoned: BTreeSet<String>,
    /// The server's timeline; a promotion starts a new one.
    pub timeline: u32,
    /// Events of an old timeline a promotion replaced, with their positions: they may be
    /// in Kafka (relayed from the old primary) but are not owed.
    pub replaced: Vec<(Event, Position)>,
    /// Start attempts the slot is still held by another relay (a standby that took over).
    pub held: u32,
    /// The oracle's first complaint.
    pub violation: Option<String>,
    /// The outbox table, under `--cleanup delete`.
    pub cleanup: Option<cleanup::Rows>,
    /// The current run's number.
    pub runs: u64,
    /// The current run's readiness and progress, as its pipeline published them.
    pub health: Option<Arc<outbox_relay::observability::health::Health>>,
    /// When the current run was sent SIGTERM.
    pub sigterm_at: Option<tokio::time::Instant>,
    /// Ids of the events the current run handed to the producer.
    pub sent: BTreeSet<String>,
    /// The Schema Registry, under `plan.registry`.
    pub registry: registry::Registry,
}

/// The world plus the driver's wake-up on a crash.
#[derive(Clone)]
pub struct Shared {
    pub world: Arc<Mutex<World>>,
    pub stop: Arc<Notify>,
    pub broker_wake: Arc<Notify>,
    /// The slot's confirmed position moved.
    pub progress: Arc<Notify>,
}

impl Shared {
    pub fn lock(&self) -> MutexGuard<'_, World> {
        self.world.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl World {
    fn new(seed: u64) -> World {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let max_bytes = rng.random_range(1024..4096);
        let plan = Plan {
            exactly_once: rng.random_bool(0.4),
            dead_letter: rng.random_bool(0.5),
            all_tables: rng.random_bool(0.5),
            max_events: rng.random_range(1..=8),
            max_bytes,
            faults: rng.random_range(0..=5),
            fault_rate: rng.random_range(5..=120),
            cleanup: rng.random_bool(0.4),
            // Drawn apart, so the schedules of seeds without a registry stay as they were.
            registry: ChaCha8Rng::seed_from_u64(seed ^ 0x5eed_4e61_7374_7279).random_bool(0.3),
        };
        let mut wal = Wal::generate(&mut rng, plan.all_tables, max_bytes * 2);
        if plan.registry {
            wal.without_messages();
        }
        let broker = Broker::new(&mut rng, DLQ);
        let rows = wal.txs.iter().flat_map(|tx| tx.changes.iter());
        let rows = rows.filter_map(|change| match change {
            wal::Change::Row(e) => Some(e.id.clone()),
            _ => None,
        });
        let cleanup = plan.cleanup.then(|| cleanup::Rows::new(rows));
        World {
            confirmed: wal.start,
            largest: largest(&wal),
            rng,
            plan,
            wal,
            broker,
            batch_refused: BTreeSet::new(),
            poisoned: BTreeSet::new(),
            timeline: 1,
            replaced: Vec::new(),
            held: 0,
            session: None,
            sessions: 0,
            sigterm: None,
            crash: false,
            deliveries: None,
            faults_on: true,
            trace: Vec::new(),
            violation: None,
            cleanup,
            runs: 0,
            health: None,
            sigterm_at: None,
            sent: BTreeSet::new(),
            registry: registry::Registry::default(),
        }
    }

    fn note(&mut self, what: String) {
        if self.trace.len() < 400 {
            self.trace.push(what);
        }
    }

    fn complain(&mut self, what: String) {
        if self.violation.is_none() {
            self.note(format!("VIOLATION: {what}"));
            self.violation = Some(what);
        }
    }

    /// Whether to inject a fault at this step.
    fn fault_now(&mut self) -> bool {
        if !self.faults_on || self.plan.faults == 0 {
            return false;
        }
        if self.rng.random_range(0..1000) < self.plan.fault_rate {
            self.plan.faults -= 1;
            true
        } else {
            false
        }
    }

    /// The `outbox.source` of the current timeline.
    pub fn source_id(&self) -> String {
        format!("outbox_relay@{SYSTEM_ID}/{}", self.timeline)
    }

    /// The events the broker holds: those with a copy in their own topic, and the
    /// poison ones in the dead-letter topic.
    fn landed(&self) -> BTreeSet<&str> {
        let topics: BTreeMap<&str, &str> = self
            .wal
            .events()
            .map(|(_, e)| (e.id.as_str(), e.event_type))
            .collect();
        let mut landed = BTreeSet::new();
        for ((topic, _), log) in &self.broker.logs {
            for record in log {
                let id = record.id.as_str();
                let dead_letter = topic == DLQ && self.poisoned.contains(id);
                if dead_letter || topics.get(id) == Some(&topic.as_str()) {
                    landed.insert(id);
                }
            }
        }
        landed
    }

    /// The highest position that may be confirmed: the commit record of the
    /// first transaction (commit order) with an event the broker holds no
    /// copy of (confirming past it makes Postgres skip that transaction).
    fn safe_limit(&self) -> u64 {
        let landed = self.landed();
        self.wal
            .txs
            .iter()
            .find(|tx| tx.events().any(|e| !landed.contains(e.id.as_str())))
            .map_or(u64::MAX, |tx| tx.final_lsn)
    }

    /// Oracle: a position reported to Postgres on `timeline`; it moves the slot only
    /// over a live session (a broken one's reports are lost), but is checked either way
    /// (a report to a server that is gone, after a promotion, is not).
    pub fn on_ack(&mut self, lsn: u64, live: bool, timeline: u32) {
        if timeline != self.timeline {
            return;
        }
        let limit = self.safe_limit();
        if lsn > limit {
            self.complain(format!(
                "confirmed {lsn:X} past {limit:X}, the commit of a transaction not fully acknowledged"
            ));
        }
        self.check_cleared(lsn);
        if live && lsn > self.confirmed {
            self.note(format!("ack {lsn:X}"));
            self.confirmed = lsn;
        }
    }

    /// Oracle: the caps, each time a record is handed to the producer.
    pub fn on_send(&mut self) {
        let (events, bytes) = (self.broker.in_flight(), self.broker.in_flight_bytes());
        if events > self.plan.max_events {
            self.complain(format!(
                "{events} events in flight, cap {}",
                self.plan.max_events
            ));
        }
        if bytes > self.plan.max_bytes + self.largest {
            self.complain(format!(
                "{bytes} bytes in flight, cap {} (+{} for one record)",
                self.plan.max_bytes, self.largest
            ));
        }
        self.check_backlog();
    }

    /// A new replication session from `from` (the relay's resume point):
    /// the server starts at the slot's confirmed position when that is later.
    pub fn start_session(&mut self, from: u64) -> (u64, u64) {
        let start = from.max(self.confirmed);
        self.sessions += 1;
        let items = wal::session(&self.wal, start).into();
        self.session = Some((self.sessions, items));
        self.note(format!("session {} from {start:X}", self.sessions));
        (self.sessions, start)
    }

    /// One step of a session: the next message, a wait, or a break.
    pub fn recv(&mut self, session: u64) -> Step {
        if self.crash {
            return Step::Wait(Duration::from_secs(3600));
        }
        match &self.session {
            Some((id, _)) if *id == session => {}
            _ => return Step::Break,
        }
        if self.fault_now() {
            let kinds = if self.plan.registry { 13 } else { 12 };
            match self.rng.random_range(0..kinds) {
                0 => {
                    self.note("fault: stream break".into());
                    self.session = None;
                    return Step::Break;
                }
                1 => {
                    self.note("fault: SIGTERM".into());
                    self.sigterm();
                }
                2 => {
                    self.note("fault: crash".into());
                    self.crash = true;
                    return Step::Crash;
                }
                3 => {
                    let end = tokio::time::Instant::now()
                        + Duration::from_millis(self.rng.random_range(100..5000));
                    self.note("fault: broker outage".into());
                    self.broker.outage_until = Some(end);
                }
                4 => {
                    if let Some(id) = self.poison_one() {
                        self.note(format!("fault: poison ({id})"));
                        self.broker.poison.insert(id, 2);
                    }
                }
                5 => {
                    self.note("fault: next delivery fails for good".into());
                    self.broker.fail_next = true;
                }
                6 => {
                    self.note("fault: batch refused".into());
                    self.broker.fail_batch = true;
                }
                7 => {
                    self.note("fault: enqueue refused".into());
                    self.broker.refuse_enqueue = true;
                }
                8 => {
                    if let Some(id) = self.poison_one() {
                        self.note(format!("fault: too large at hand-over ({id})"));
                        self.broker.too_large.insert(id);
                    }
                }
                9 => {
                    // Some poison to dead-letter, and its dead-letter record refused.
                    if let Some(id) = self.poison_one() {
                        let blame = match self.rng.random_bool(0.5) {
                            true => outbox_relay::sink::Blame::Fatal,
                            false => outbox_relay::sink::Blame::Record { too_large: false },
                        };
                        self.note(format!("fault: dead-letter refused ({id}, {blame:?})"));
                        self.broker.poison.insert(id, 2);
                        self.broker.refuse_dead_letter = Some(blame);
                    }
                }
                10 => return self.promote(),
                12 => {
                    let end = tokio::time::Instant::now()
                        + Duration::from_millis(self.rng.random_range(100..10_000));
                    self.note("fault: registry outage".into());
                    self.registry.down_until = Some(end);
                }
                _ => {
                    // The stream breaks and a standby relay takes the slot for a while.
                    self.note("fault: standby takeover".into());
                    self.held = self.rng.random_range(1..=3);
                    self.session = None;
                    return Step::Break;
                }
            }
        }
        if self.rng.random_range(0..8) == 0 {
            return Step::Wait(Duration::from_millis(self.rng.random_range(1..30)));
        }
        let Some((_, items)) = self.session.as_mut() else {
            return Step::Break;
        };
        // A keepalive is the walsender's choice: usually skipped, always at the end.
        loop {
            match items.pop_front() {
                None => {
                    let end = self.wal.end();
                    return Step::Idle(wal::keepalive(&mut self.rng, end, end));
                }
                Some(Item::Event(event)) => return Step::Event(event),
                Some(Item::KeepAlive { low, high }) => {
                    if items.is_empty() || self.rng.random_range(0..3) == 0 {
                        return Step::Event(wal::keepalive(&mut self.rng, low, high));
                    }
                }
            }
        }
    }

    /// Sends the current run SIGTERM, once.
    pub fn sigterm(&mut self) {
        if let Some(tx) = self.sigterm.take() {
            let _ = tx.send(());
            self.sigterm_at = Some(tokio::time::Instant::now());
        }
    }

    /// Picks one event that has not reached the broker yet to be poison
    /// (the broker or the producer refuses it as too large).
    fn poison_one(&mut self) -> Option<String> {
        let landed = self.landed();
        let candidates: Vec<String> = self
            .wal
            .events()
            .map(|(_, e)| e.id.clone())
            .filter(|id| !landed.contains(id.as_str()))
            .collect();
        if candidates.is_empty() {
            return None;
        }
        let id = candidates[self.rng.random_range(0..candidates.len())].clone();
        self.poisoned.insert(id.clone());
        Some(id)
    }

    /// A standby is promoted: a new timeline, whose copy of the slot is at an
    /// earlier commit end, and whose WAL after some later commit (the last the
    /// standby replayed) holds other transactions at the same positions.
    fn promote(&mut self) -> Step {
        let ends = std::iter::once(self.wal.start).chain(self.wal.txs.iter().map(|t| t.end_lsn));
        let synced: Vec<u64> = ends.clone().filter(|&p| p <= self.confirmed).collect();
        let slot = synced[self.rng.random_range(0..synced.len())];
        let later: Vec<u64> = ends.filter(|&p| p >= slot).collect();
        let switch = later[self.rng.random_range(0..later.len())];
        let replaced = self.wal.diverge(&mut self.rng, switch);
        self.promoted(&replaced, switch);
        self.largest = self.largest.max(largest(&self.wal));
        self.replaced.extend(replaced);
        self.timeline += 1;
        self.confirmed = slot;
        self.session = None;
        self.note(format!(
            "fault: promotion (timeline {}, slot at {slot:X}, WAL diverges after {switch:X})",
            self.timeline
        ));
        Step::Break
    }

    /// The standby relay holding the slot: relays up to a few events from the
    /// slot's position as a correct relay does (under exactly-once skipping those
    /// whose position its partition holds), stopping at poison, and may confirm
    /// the transactions it relayed whole.
    pub fn rival(&mut self) {
        let source = self.source_id();
        let mut budget = self.rng.random_range(0..=6);
        let (mut written, mut whole) = (Vec::new(), None);
        let positions: BTreeMap<&str, Position> = self
            .wal
            .positions()
            .map(|(e, p)| (e.id.as_str(), p))
            .collect();
        'txs: for tx in self
            .wal
            .txs
            .iter()
            .filter(|t| t.final_lsn >= self.confirmed)
        {
            for e in tx.events() {
                if budget == 0 || self.poisoned.contains(&e.id) {
                    break 'txs;
                }
                budget -= 1;
                let (key, payload) = match self.plan.registry {
                    true => self.registry.framed(e.event_type, &e.key, &e.payload),
                    false => (e.key.clone().into(), e.payload.clone().into()),
                };
                let count = self.broker.partitions.get(e.event_type).copied();
                let partition = partition_for(&key, count.unwrap_or(1));
                let position = positions[e.id.as_str()];
                let log = self.broker.logs.get(&(e.event_type.to_owned(), partition));
                let there = log.is_some_and(|log| {
                    log.iter().any(|r| {
                        r.position() == Some(position) && r.source() == Some(source.as_bytes())
                    })
                });
                if self.plan.exactly_once && there {
                    continue;
                }
                let headers = match self.plan.exactly_once {
                    true => vec![
                        (SOURCE_HEADER.into(), Some(source.clone().into())),
                        (LSN_HEADER.into(), Some(position.lsn.to_string().into())),
                        (CHANGE_HEADER.into(), Some(position.change_header().into())),
                    ],
                    false => Vec::new(),
                };
                let record = Logged {
                    id: e.id.clone(),
                    key: Some(key.into()),
                    payload: Some(payload.into()),
                    headers,
                };
                written.push((e.event_type, partition, record));
            }
            whole = Some(tx.end_lsn);
        }
        let confirm = whole.filter(|_| self.rng.random_bool(0.5));
        self.note(format!(
            "rival: {} records, confirmed {confirm:X?}",
            written.len()
        ));
        for (topic, partition, record) in written {
            self.broker.append(topic, partition, record);
        }
        if let Some(end) = confirm {
            self.rival_deletes(end);
            self.confirmed = self.confirmed.max(end);
        }
    }

    /// Whether the slot has caught up with the whole WAL.
    pub fn finished(&self) -> bool {
        self.confirmed >= self.wal.txs.last().map_or(self.wal.start, |t| t.end_lsn)
    }

    /// The end-of-schedule checks, after recovery.
    fn check_end(&mut self) {
        let last = self.wal.txs.last().map_or(self.wal.start, |t| t.end_lsn);
        if self.confirmed < last {
            self.complain(format!(
                "after recovery the slot is at {:X}, before the last commit end {last:X}",
                self.confirmed
            ));
        }
        if let Some(first) = self.problems().into_iter().next() {
            self.complain(first);
        }
        self.check_cleanup_end();
    }

    /// What the broker holds that it should not, or lacks.
    fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        // What each id is: an event of the WAL, or one a promotion replaced.
        let replaced = self.replaced.iter().map(|(e, p)| (e, *p, true));
        let current = self.wal.positions().map(|(e, p)| (e, p, false));
        let expected: BTreeMap<&str, (&Event, Position, bool)> = replaced
            .chain(current)
            .map(|x| (x.0.id.as_str(), x))
            .collect();
        // Per event, where its copies are: (topic, partition), index in the log.
        let mut copies: BTreeMap<&str, Vec<Spot<'_>>> = BTreeMap::new();
        let mut dead = BTreeSet::new();
        let mut key_partitions: BTreeMap<(&str, &str), BTreeSet<i32>> = BTreeMap::new();
        for (at @ (topic, partition), log) in &self.broker.logs {
            for (n, record) in log.iter().enumerate() {
                let id = record.id.as_str();
                if topic == DLQ {
                    if !self.poisoned.contains(id) {
                        problems.push(format!("event {id} was dead-lettered but never refused"));
                    }
                    dead.insert(id);
                    continue;
                }
                let Some(&(e, position, _)) = expected.get(id) else {
                    problems.push(format!(
                        "{topic}/{partition}: a record with unknown id {id}"
                    ));
                    continue;
                };
                let text = |b: Option<&[u8]>| match self.plan.registry {
                    true => b.map(|b| registry::unframe(b).unwrap_or_else(|e| e)),
                    false => b.map(|b| String::from_utf8_lossy(b).into_owned()),
                };
                let (key, payload) = (text(record.key.as_deref()), text(record.payload.as_deref()));
                if topic != e.event_type
                    || key.as_deref() != Some(&e.key)
                    || payload.as_deref() != Some(&e.payload)
                {
                    problems.push(format!(
                        "{topic}/{partition}: event {id} has key {key:?} and payload {payload:?}; \
                         it is for topic {:?} with key {:?} and payload {:?}",
                        e.event_type, e.key, e.payload
                    ));
                    continue;
                }
                key_partitions
                    .entry((e.event_type, &e.key))
                    .or_default()
                    .insert(*partition);
                if self.plan.exactly_once {
                    let count = self.broker.partitions.get(topic).copied().unwrap_or(1);
                    // The key's bytes as written: with a registry, framed Avro.
                    let key = match self.plan.registry {
                        true => record.key.as_deref().unwrap_or_default(),
                        false => e.key.as_bytes(),
                    };
                    let pinned = partition_for(key, count);
                    if *partition != pinned || record.position() != Some(position) {
                        problems.push(format!(
                            "{topic}/{partition}: event {id} at {:?}; it belongs in partition \
                             {pinned} at {position:?}",
                            record.position()
                        ));
                    }
                }
                copies.entry(id).or_default().push((at, n));
            }
        }
        for ((topic, key), partitions) in key_partitions {
            if partitions.len() > 1 {
                problems.push(format!(
                    "key {key} is in partitions {partitions:?} of {topic}"
                ));
            }
        }
        for (e, position) in self.wal.positions() {
            let id = e.id.as_str();
            let here = copies.get(id).map_or(&[][..], Vec::as_slice);
            if here.is_empty() && !dead.contains(id) {
                problems.push(format!("event {id} never reached the broker"));
            }
            if self.plan.exactly_once && here.len() > 1 && !self.may_repeat(here, position) {
                problems.push(format!(
                    "event {id} is in the broker {} times under exactly-once",
                    here.len()
                ));
            }
        }
        // Per key within a partition: first copies in commit order.
        let order: BTreeMap<&str, usize> = self
            .wal
            .events()
            .enumerate()
            .map(|(n, (_, e))| (e.id.as_str(), n))
            .collect();
        for ((topic, partition), log) in &self.broker.logs {
            let mut seen = BTreeSet::new();
            let mut last: BTreeMap<Option<&[u8]>, usize> = BTreeMap::new();
            for record in log {
                if !seen.insert(record.id.as_str()) || self.batch_refused.contains(&record.id) {
                    continue;
                }
                let Some(&n) = order.get(record.id.as_str()) else {
                    continue;
                };
                let key = record.key.as_deref();
                if let Some(&before) = last.get(&key)
                    && before > n
                {
                    problems.push(format!(
                        "{topic}/{partition}: event {} after a later event of its key",
                        record.id
                    ));
                }
                last.insert(key, n);
            }
        }
        problems
    }

    /// Whether an event's `copies` (in one partition) are duplicates docs/guarantees.md
    /// allows under exactly-once. Per writer (`outbox.source`: a promotion makes a new one,
    /// whose slot may not have confirmed what the old timeline delivered), one copy, or more
    /// only after a record of that writer below the event's position (an event refused and
    /// sent again above later records: the tail read stops at it).
    fn may_repeat(&self, copies: &[Spot<'_>], position: Position) -> bool {
        let mut writers: BTreeMap<Option<&[u8]>, Vec<Spot<'_>>> = BTreeMap::new();
        for &(at, n) in copies {
            let source = self.broker.logs[at][n].source();
            writers.entry(source).or_default().push((at, n));
        }
        writers.into_iter().all(|(source, copies)| {
            let &[(at, first), _, ..] = copies.as_slice() else {
                return true;
            };
            self.broker.logs[at][first + 1..]
                .iter()
                .any(|r| r.source() == source && r.position().is_some_and(|p| p < position))
        })
    }
}

/// Where one copy of an event is: its partition log, and its index there.
type Spot<'a> = (&'a (String, i32), usize);

/// Largest record `wal` can produce (the byte cap's slack).
fn largest(wal: &Wal) -> usize {
    wal.events()
        .map(|(_, e)| e.payload.len() * 2 + e.key.len() + 200)
        .max()
        .unwrap_or(0)
}

/// What one `recv` step yields.
pub enum Step {
    Event(outbox_relay::source::SourceEvent),
    /// End of the WAL: a keepalive after a pause.
    Idle(outbox_relay::source::SourceEvent),
    Wait(Duration),
    Break,
    Crash,
}

/// Every fault and stop the schedules inject, as counted from the traces.
const FAULTS: [&str; 24] = [
    "fault SIGTERM",
    "fault batch refused",
    "fault broker outage",
    "fault connect refused",
    "fault crash",
    "fault crash before a delivery report",
    "fault delete blocked",
    "fault delete fails",
    "fault delete refused for good",
    "fault row locked",
    "stop cleanup",
    "fault dead-letter refused",
    "fault enqueue refused",
    "fault next delivery fails for good",
    "fault poison",
    "fault promotion",
    "fault registry outage",
    "fault standby takeover",
    "fault stream break",
    "fault too large at hand-over",
    "stop dead-letter",
    "stop delivery",
    "stop enqueue",
    "stop poison",
];

/// The number of schedules and the first seed, from the environment.
fn schedules() -> (u64, u64) {
    let var = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    match var("SIM_SEED") {
        Some(seed) => (seed, 1),
        None => (
            var("SIM_FIRST").unwrap_or(0),
            var("SIM_SCHEDULES").unwrap_or(10_000),
        ),
    }
}

/// Runs one schedule: its trace, or the violation and the trace.
pub fn run_schedule(seed: u64) -> Result<Vec<String>, String> {
    run_then(seed, |world| match world.violation.clone() {
        None => Ok(std::mem::take(&mut world.trace)),
        Some(v) => Err(format!(
            "{v}\nplan: {:?}\ntrace:\n  {}",
            world.plan,
            world.trace.join("\n  ")
        )),
    })
    .unwrap_or_else(Err)
}

/// Runs one schedule and its end checks, then hands the world to `then`.
fn run_then<T>(seed: u64, then: impl FnOnce(&mut World) -> T) -> Result<T, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .map_err(|e| e.to_string())?;
    let shared = Shared {
        world: Arc::new(Mutex::new(World::new(seed))),
        stop: Arc::new(Notify::new()),
        broker_wake: Arc::new(Notify::new()),
        progress: Arc::new(Notify::new()),
    };
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        runtime.block_on(relay::drive(shared.clone()))
    }));
    drop(runtime);
    let mut world = shared.lock();
    match outcome {
        Err(panic) => {
            let what = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_default();
            world.complain(format!("panic: {what}"));
        }
        Ok(Err(e)) => world.complain(e),
        Ok(Ok(())) => world.check_end(),
    }
    Ok(then(&mut world))
}

/// [`run_schedule`] on a thread of its own, bounded in wall time: a pipeline that spins at one
/// virtual instant never lets the paused clock advance, so the virtual bounds cannot catch it.
fn run_bounded(seed: u64) -> Result<Vec<String>, String> {
    const LIMIT: Duration = Duration::from_secs(120);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(run_schedule(seed));
    });
    rx.recv_timeout(LIMIT).unwrap_or_else(|_| {
        // The thread is left spinning; the failed test ends the process.
        Err(format!(
            "the schedule did not end within {LIMIT:?} of wall time: the pipeline spins \
             without letting virtual time advance (or waits on nothing)"
        ))
    })
}

#[test]
fn simulation() {
    let (first, count) = schedules();
    let started = std::time::Instant::now();
    // What the schedules exercised: faults by kind, stops by cause.
    let mut seen: BTreeMap<String, u64> = BTreeMap::new();
    for seed in first..first + count {
        match run_bounded(seed) {
            Ok(trace) => {
                for line in trace {
                    let Some((kind @ ("fault" | "stop"), what)) = line.split_once(": ") else {
                        continue;
                    };
                    let what = what.split(['(', ':']).next().unwrap_or(what).trim();
                    *seen.entry(format!("{kind} {what}")).or_default() += 1;
                }
            }
            Err(report) => panic!(
                "simulation failed with seed {seed} (after {} schedules; replay with \
                 SIM_SEED={seed} cargo test --test integration simulation):\n{report}",
                seed - first + 1
            ),
        }
    }
    eprintln!(
        "simulation: {count} schedules from seed {first} in {:.1?}; {seen:?}",
        started.elapsed()
    );
    // A schedule generator that stopped injecting some fault would pass silently.
    if count >= 1000 {
        for kind in FAULTS {
            assert!(seen.contains_key(kind), "no schedule exercised {kind:?}");
        }
    }
}

#[test]
fn simulation_replays_a_seed_identically() {
    for seed in 0..20 {
        assert_eq!(run_schedule(seed), run_schedule(seed), "seed {seed}");
    }
}

/// Each end check can fail: a passing schedule's broker, spoiled one way at a time, is
/// reported. The exactly-once schedule had a refusal, after which the old oracle checked
/// no duplicate at all.
#[test]
fn simulation_oracle_reports_each_wrong_record() {
    let mut checked = [false, false];
    for seed in 0..2000 {
        run_then(seed, |world| {
            let eo = usize::from(world.plan.exactly_once);
            let refused = world.trace.iter().any(|l| l.starts_with("refused"));
            // A log of a topic with two partitions and first copies of two events of one
            // key, neither refused with its batch nor replaced by a promotion, ending in a
            // record of the current writer.
            let plain = |log: &[Logged], i: usize| {
                let id = &log[i].id;
                log[..i].iter().all(|r| &r.id != id)
                    && !world.batch_refused.contains(id)
                    && !world.poisoned.contains(id)
                    && world.replaced.iter().all(|(e, _)| &e.id != id)
            };
            let current = world.source_id();
            let spoilable = world.broker.logs.iter().find_map(|((topic, p), log)| {
                let last = log.last()?;
                let ours = last.source().is_none_or(|s| s == current.as_bytes());
                let two = world.broker.partitions[topic] > 1 && topic != DLQ;
                let pair = (0..log.len()).find_map(|i| {
                    let j = (i + 1..log.len()).find(|&j| log[j].key == log[i].key)?;
                    (plain(log, i) && plain(log, j) && log[i].id != log[j].id).then_some((i, j))
                })?;
                (two && ours && plain(log, log.len() - 1)).then(|| ((topic.clone(), *p), pair))
            });
            let (Some((at, (i, j))), None, false) = (spoilable, &world.violation, checked[eo])
            else {
                return;
            };
            if eo == 1 && !refused {
                return;
            }
            checked[eo] = true;
            for (what, expected) in spoils(world.plan.exactly_once) {
                let logs = world.broker.logs.clone();
                let log = world.broker.logs.get_mut(&at).expect("the log is there");
                let moved = what(log, i, j);
                if let Some(record) = moved {
                    let other = (at.0.clone(), (at.1 + 1) % world.broker.partitions[&at.0]);
                    world.broker.logs.entry(other).or_default().push(record);
                }
                let problems = world.problems();
                assert!(
                    problems.iter().any(|p| p.contains(expected)),
                    "seed {seed}: expected {expected:?}, got {problems:?}"
                );
                world.broker.logs = logs;
            }
            // A healthy event in the dead-letter topic.
            let logs = world.broker.logs.clone();
            let healthy = world.broker.logs[&at][i].clone();
            world
                .broker
                .logs
                .entry((DLQ.into(), 0))
                .or_default()
                .push(healthy);
            let problems = world.problems();
            assert!(
                problems
                    .iter()
                    .any(|p| p.contains("dead-lettered but never refused")),
                "seed {seed}: {problems:?}"
            );
            world.broker.logs = logs;
            assert!(world.problems().is_empty(), "seed {seed}");
        })
        .expect("the schedule runs");
        if checked == [true, true] {
            return;
        }
    }
    panic!("no schedule to spoil: {checked:?}");
}

/// One way to spoil a partition log (given two records `i` < `j` of one key; a record
/// returned is appended to the next partition), and what the oracle must say.
type Spoil = fn(&mut Vec<Logged>, usize, usize) -> Option<Logged>;

fn spoils(exactly_once: bool) -> Vec<(Spoil, &'static str)> {
    let mut spoils: Vec<(Spoil, &str)> = vec![
        (
            |log, i, _| {
                log[i].payload = Some("{}".into());
                None
            },
            "has key",
        ),
        (
            |log, i, _| {
                log[i].key = Some("k9".into());
                None
            },
            "has key",
        ),
        (
            |log, i, _| {
                log[i].id = "e999".into();
                None
            },
            "unknown id",
        ),
        (|log, i, _| Some(log.remove(i)), "is in partitions"),
        (|log, _, j| Some(log.remove(j)), "is in partitions"),
        (
            |log, i, j| {
                log.swap(i, j);
                None
            },
            "after a later event of its key",
        ),
        (
            |log, i, _| {
                let id = log[i].id.clone();
                log.retain(|r| r.id != id);
                None
            },
            "never reached the broker",
        ),
    ];
    if exactly_once {
        spoils.extend([
            (
                (|log, _, j| {
                    let lsn = log[j].headers.iter_mut().find(|(k, _)| &**k == LSN_HEADER);
                    lsn.expect("a position").1 = Some("0/1".into());
                    None
                }) as Spoil,
                "belongs in partition",
            ),
            (
                |log, _, _| {
                    log.push(log.last().expect("a record").clone());
                    None
                },
                "times under exactly-once",
            ),
        ]);
    }
    spoils
}
