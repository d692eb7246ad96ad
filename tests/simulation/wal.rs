//! The simulated Postgres side: a WAL of committed transactions, pgoutput's
//! encoding of their rows, and replication sessions that replay from the
//! slot's confirmed position as a walsender does.

use std::collections::BTreeSet;

use bytes::{BufMut, Bytes, BytesMut};
use outbox_relay::lsn::Lsn;
use outbox_relay::sink::exactly_once::Position;
use outbox_relay::source::SourceEvent;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// Relation OIDs of the simulated database.
pub const OUTBOX_OID: u32 = 16_385;
pub const ORDERS_OID: u32 = 16_390;
/// The logical message prefix the relay is configured with.
pub const PREFIX: &str = "outbox";
/// Topics: `event_type` routes (the default `--route-by`).
pub const EVENT_TYPES: [&str; 2] = ["a", "b"];
/// Keys: few, so per-key order is checked across many events.
pub const KEYS: [&str; 3] = ["k0", "k1", "k2"];
/// The prefix of the relay's own heartbeat messages (never relayed).
const HEARTBEAT: &str = "outbox-relay-heartbeat";

const TEXT: u32 = 25;
const JSONB: u32 = 3802;

/// One outbox event, as the oracle knows it.
#[derive(Clone, Debug)]
pub struct Event {
    pub id: String,
    pub key: String,
    pub event_type: &'static str,
    pub payload: String,
}

/// One change inside a transaction.
#[derive(Clone, Debug)]
pub enum Change {
    /// An insert into the outbox table.
    Row(Event),
    /// A transactional logical message with the outbox prefix.
    Message(Event),
    /// An insert into another table (only under `FOR ALL TABLES`).
    Other,
    /// A logical message with another prefix.
    Foreign,
}

impl Change {
    pub fn event(&self) -> Option<&Event> {
        match self {
            Change::Row(e) | Change::Message(e) => Some(e),
            Change::Other | Change::Foreign => None,
        }
    }
}

/// A committed transaction and where it sits in the WAL.
#[derive(Clone, Debug)]
pub struct Tx {
    /// LSN of each change.
    pub lsns: Vec<u64>,
    pub changes: Vec<Change>,
    /// The commit record's LSN (pgoutput's `final_lsn`).
    pub final_lsn: u64,
    /// The end of the commit record: what a confirmation past the transaction names.
    pub end_lsn: u64,
    /// The first WAL position after the transaction's end that the next one may use.
    pub next_free: u64,
    /// A heartbeat (a non-transactional message) follows at `next_free`.
    pub heartbeat: bool,
}

impl Tx {
    pub fn events(&self) -> impl Iterator<Item = &Event> {
        self.changes.iter().filter_map(Change::event)
    }
}

/// The whole WAL of one schedule, generated up front (schedules are small).
#[derive(Clone, Debug)]
pub struct Wal {
    pub start: u64,
    pub txs: Vec<Tx>,
    /// The next event's number, for events a promotion makes up.
    next_event: u32,
    max_row: usize,
}

impl Wal {
    pub fn generate(rng: &mut ChaCha8Rng, all_tables: bool, max_row: usize) -> Wal {
        let start = 0x0100_0000 + rng.random_range(0..0x1000u64);
        let mut at = start;
        let mut txs = Vec::new();
        let count = rng.random_range(1..=8);
        let mut next_event = 0;
        for _ in 0..count {
            let size = match rng.random_range(0..10) {
                0 => 0,
                1 => rng.random_range(12..=40),
                _ => rng.random_range(1..=4),
            };
            let mut lsns = Vec::new();
            let mut changes = Vec::new();
            at += rng.random_range(0x10..0x40);
            for _ in 0..size {
                let change = match rng.random_range(0..10) {
                    0 if all_tables => Change::Other,
                    1 => Change::Foreign,
                    2 | 3 => Change::Message(event(rng, &mut next_event, max_row)),
                    _ => Change::Row(event(rng, &mut next_event, max_row)),
                };
                lsns.push(at);
                at += rng.random_range(0x20..0x200);
                changes.push(change);
            }
            let final_lsn = at;
            let end_lsn = final_lsn + 0x30;
            at = end_lsn + rng.random_range(0..0x100);
            txs.push(Tx {
                lsns,
                changes,
                final_lsn,
                end_lsn,
                next_free: at,
                heartbeat: rng.random_range(0..3) == 0,
            });
        }
        Wal {
            start,
            txs,
            next_event,
            max_row,
        }
    }

    /// A promoted standby's WAL: the transactions committing after `switch` are other ones
    /// (the old primary's never reached it) at the same positions. Returns the old events
    /// with their positions.
    pub fn diverge(&mut self, rng: &mut ChaCha8Rng, switch: u64) -> Vec<(Event, Position)> {
        let mut replaced = Vec::new();
        for tx in self.txs.iter_mut().filter(|tx| tx.final_lsn > switch) {
            for (change, &at) in tx.changes.iter_mut().zip(&tx.lsns) {
                if let Change::Row(e) | Change::Message(e) = change {
                    let new = event(rng, &mut self.next_event, self.max_row);
                    let position = position(tx.final_lsn, at);
                    replaced.push((std::mem::replace(e, new), position));
                }
            }
        }
        replaced
    }

    /// The outbox's logical messages as another prefix's: the relay's Debezium formats relay
    /// tables only.
    pub fn without_messages(&mut self) {
        for tx in &mut self.txs {
            for change in &mut tx.changes {
                if let Change::Message(_) = change {
                    *change = Change::Foreign;
                }
            }
        }
    }

    /// Every event with the position exactly-once gives it (`outbox.lsn`, `outbox.change`).
    pub fn positions(&self) -> impl Iterator<Item = (&Event, Position)> {
        self.txs.iter().flat_map(|tx| {
            let changes = tx.changes.iter().zip(&tx.lsns);
            changes.filter_map(|(c, &at)| Some((c.event()?, position(tx.final_lsn, at))))
        })
    }

    /// Where the server's WAL ends (past the last transaction: other writes).
    pub fn end(&self) -> u64 {
        self.txs.last().map_or(self.start, |t| t.next_free) + 0x80
    }

    pub fn events(&self) -> impl Iterator<Item = (usize, &Event)> {
        self.txs
            .iter()
            .enumerate()
            .flat_map(|(i, tx)| tx.events().map(move |e| (i, e)))
    }
}

/// The position of the one event at change `at` of the transaction committing at `commit`.
fn position(commit: u64, at: u64) -> Position {
    Position {
        lsn: Lsn(commit),
        change: Lsn(at),
        index: 0,
    }
}

fn event(rng: &mut ChaCha8Rng, next: &mut u32, max_row: usize) -> Event {
    let n = *next;
    *next += 1;
    let pad = if rng.random_range(0..20) == 0 {
        rng.random_range(0..max_row)
    } else {
        rng.random_range(0..16)
    };
    Event {
        id: format!("e{n}"),
        key: KEYS[rng.random_range(0..KEYS.len())].to_owned(),
        event_type: EVENT_TYPES[rng.random_range(0..EVENT_TYPES.len())],
        payload: format!("{{\"n\": {n}, \"pad\": \"{}\"}}", "x".repeat(pad)),
    }
}

fn cstr(buf: &mut BytesMut, s: &str) {
    buf.put_slice(s.as_bytes());
    buf.put_u8(0);
}

/// pgoutput's Relation message.
pub fn relation(oid: u32, name: &str, columns: &[(&str, u32)]) -> Bytes {
    let mut buf = BytesMut::new();
    buf.put_u8(b'R');
    buf.put_u32(oid);
    cstr(&mut buf, "public");
    cstr(&mut buf, name);
    buf.put_u8(b'd');
    buf.put_i16(columns.len() as i16);
    for (i, (column, type_oid)) in columns.iter().enumerate() {
        buf.put_u8(u8::from(i == 0));
        cstr(&mut buf, column);
        buf.put_u32(*type_oid);
        buf.put_i32(-1);
    }
    buf.freeze()
}

/// pgoutput's Insert message with text values.
pub fn insert(oid: u32, values: &[&str]) -> Bytes {
    let mut buf = BytesMut::new();
    buf.put_u8(b'I');
    buf.put_u32(oid);
    buf.put_u8(b'N');
    buf.put_i16(values.len() as i16);
    for value in values {
        buf.put_u8(b't');
        buf.put_i32(value.len() as i32);
        buf.put_slice(value.as_bytes());
    }
    buf.freeze()
}

pub fn outbox_relation() -> Bytes {
    relation(
        OUTBOX_OID,
        "outbox",
        &[
            ("id", TEXT),
            ("aggregate_type", TEXT),
            ("aggregate_id", TEXT),
            ("event_type", TEXT),
            ("payload", JSONB),
        ],
    )
}

fn orders_relation() -> Bytes {
    relation(ORDERS_OID, "orders", &[("id", TEXT), ("total", TEXT)])
}

/// The JSON a service emits with `pg_logical_emit_message(true, 'outbox', ...)`.
fn message_content(e: &Event) -> Bytes {
    Bytes::from(format!(
        "{{\"id\": \"{}\", \"aggregate_type\": \"t\", \"aggregate_id\": \"{}\", \"event_type\": \"{}\", \"payload\": {}}}",
        e.id, e.key, e.event_type, e.payload
    ))
}

/// One item a session delivers.
#[derive(Clone, Debug)]
pub enum Item {
    Event(SourceEvent),
    /// A keepalive; its `wal_end` is chosen when it is sent.
    KeepAlive {
        low: u64,
        high: u64,
    },
}

/// What a replication session started at `start` sends, in order, before
/// keepalives are sprinkled in: every transaction whose commit record is at
/// or after `start` (Postgres skips one whose commit record starts before the
/// decoding start point), each Relation announced once per session before
/// its first row.
pub fn session(wal: &Wal, start: u64) -> Vec<Item> {
    let mut announced = BTreeSet::new();
    let mut items = Vec::new();
    let mut before = start;
    for tx in wal.txs.iter().filter(|tx| tx.final_lsn >= start) {
        // Between transactions the walsender has sent up to somewhere before
        // the next commit (its sentPtr).
        items.push(Item::KeepAlive {
            low: before,
            high: tx.final_lsn,
        });
        items.push(Item::Event(SourceEvent::Begin {
            commit_lsn: Lsn(tx.final_lsn),
            commit_time_us: 1_746_684_800_000_000 + tx.final_lsn as i64,
        }));
        for (change, &lsn) in tx.changes.iter().zip(&tx.lsns) {
            // Mid-transaction, the walsender has decoded the commit already.
            items.push(Item::KeepAlive {
                low: tx.end_lsn,
                high: tx.next_free,
            });
            let xlog = |data: Bytes| {
                Item::Event(SourceEvent::Change {
                    lsn: Lsn(lsn),
                    data,
                    sent_us: 1_746_684_800_000_000 + tx.final_lsn as i64,
                })
            };
            match change {
                Change::Row(e) => {
                    if announced.insert(OUTBOX_OID) {
                        items.push(xlog(outbox_relation()));
                    }
                    items.push(xlog(insert(
                        OUTBOX_OID,
                        &[&e.id, "t", &e.key, e.event_type, &e.payload],
                    )));
                }
                Change::Other => {
                    if announced.insert(ORDERS_OID) {
                        items.push(xlog(orders_relation()));
                    }
                    items.push(xlog(insert(ORDERS_OID, &["o1", "12.50"])));
                }
                Change::Message(e) => items.push(Item::Event(SourceEvent::Message {
                    transactional: true,
                    lsn: Lsn(lsn),
                    prefix: PREFIX.to_owned(),
                    content: message_content(e),
                })),
                Change::Foreign => items.push(Item::Event(SourceEvent::Message {
                    transactional: true,
                    lsn: Lsn(lsn),
                    prefix: "audit".to_owned(),
                    content: Bytes::from_static(b"{}"),
                })),
            }
        }
        items.push(Item::Event(SourceEvent::Commit(Lsn(tx.end_lsn))));
        before = tx.end_lsn;
        if tx.heartbeat {
            items.push(Item::Event(SourceEvent::Message {
                transactional: false,
                lsn: Lsn(tx.next_free),
                prefix: HEARTBEAT.to_owned(),
                content: Bytes::new(),
            }));
        }
    }
    items.push(Item::KeepAlive {
        low: before.max(start),
        high: wal.end(),
    });
    items
}

/// A keepalive at a position in `[low, high]`.
pub fn keepalive(rng: &mut ChaCha8Rng, low: u64, high: u64) -> SourceEvent {
    let wal_end = if high > low {
        rng.random_range(low..=high)
    } else {
        low
    };
    SourceEvent::KeepAlive(Lsn(wal_end))
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_relay::pgoutput::{Message, decode};
    use rand::SeedableRng;

    #[test]
    fn simulation_wal_encodes_what_the_decoder_reads() {
        let Message::Relation(rel) = decode(&outbox_relation()).unwrap() else {
            panic!("not a relation")
        };
        assert_eq!(
            (rel.id, rel.name.as_str(), rel.columns.len()),
            (OUTBOX_OID, "outbox", 5)
        );
        let Message::Insert { relation_id, new } =
            decode(&insert(OUTBOX_OID, &["a", "b"])).unwrap()
        else {
            panic!("not an insert")
        };
        assert_eq!((relation_id, new.0.len()), (OUTBOX_OID, 2));
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let wal = Wal::generate(&mut rng, true, 100);
        let all = session(&wal, 0);
        let later = session(&wal, wal.txs[0].final_lsn + 1);
        let begins = |items: &[Item]| {
            items
                .iter()
                .filter(|i| matches!(i, Item::Event(SourceEvent::Begin { .. })))
                .count()
        };
        assert_eq!(begins(&all), wal.txs.len());
        assert_eq!(begins(&later), wal.txs.len() - 1);
    }
}
