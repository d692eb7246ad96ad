//! The simulated Kafka side: topics with partition logs, a producer queue
//! whose acknowledgements arrive in any order across partitions (in order
//! within one, as the idempotent producer guarantees), delays, outages,
//! permanent errors, refusals at hand-over, of a whole batch and of a
//! dead-letter record, and the tail reads exactly-once relies on.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use outbox_relay::outbox::{ID_HEADER, OutboxRecord};
use outbox_relay::sink::exactly_once::window::PartitionLog;
use outbox_relay::sink::exactly_once::{
    CHANGE_HEADER, LSN_HEADER, Position, SOURCE_HEADER, Seen, TailError, partition_for,
};
use outbox_relay::sink::{Blame, Refusal};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use tokio::time::Instant;

/// One record in a partition log.
#[derive(Clone, Debug)]
pub struct Logged {
    pub id: String,
    pub key: Option<Bytes>,
    pub payload: Option<Bytes>,
    /// Its headers but `id`.
    pub headers: Vec<(Arc<str>, Option<Bytes>)>,
}

impl Logged {
    /// As the tail reader classifies it for `source`.
    pub fn seen(&self, source: &str) -> Seen {
        let id = (ID_HEADER, Some(self.id.as_bytes()));
        let headers = self.headers.iter().map(|(k, v)| (&**k, v.as_deref()));
        Seen::classify(source, headers.chain([id]), self.key.as_deref())
    }

    /// Its `outbox.source` header.
    pub fn source(&self) -> Option<&[u8]> {
        self.header(SOURCE_HEADER)
    }

    /// Its position, from the `outbox.lsn` and `outbox.change` headers.
    pub fn position(&self) -> Option<Position> {
        Position::from_headers(self.header(LSN_HEADER)?, self.header(CHANGE_HEADER)?)
    }

    fn header(&self, name: &str) -> Option<&[u8]> {
        let value = self.headers.iter().find(|(k, _)| &**k == name);
        value.and_then(|(_, v)| v.as_deref())
    }
}

/// A record handed to the producer, not yet appended.
#[derive(Debug)]
pub struct Pending {
    pub ticket: u64,
    pub record: OutboxRecord,
    pub partition: i32,
    pub due: Instant,
    pub alone: bool,
    /// Refused with its batch (another record's fault).
    pub with_batch: bool,
}

/// How one delivery ends.
pub enum Outcome {
    Appended,
    Failed(Refusal),
}

/// The cluster: logs survive relay crashes, the producer queue does not.
pub struct Broker {
    pub partitions: BTreeMap<String, i32>,
    pub logs: BTreeMap<(String, i32), Vec<Logged>>,
    /// Records appended by another writer ([`Broker::append`]), not through the producer.
    pub appended_directly: usize,
    /// Per partition, in send order.
    pub queue: BTreeMap<(String, i32), VecDeque<Pending>>,
    pub outage_until: Option<Instant>,
    /// Event ids the broker refuses as too large, with how many more times.
    pub poison: BTreeMap<String, u32>,
    /// The next delivery fails for good for a reason not the record's.
    pub fail_next: bool,
    /// Partitions failing so (authorization): what is queued there fails too.
    pub failing: BTreeSet<(String, i32)>,
    /// The next batch of a partition is refused whole (KIP-467: one invalid record fails
    /// its healthy neighbours): they are to be sent again alone.
    pub fail_batch: bool,
    /// The producer refuses the next record at hand-over, for a reason not the record's.
    pub refuse_enqueue: bool,
    /// Event ids the producer refuses at hand-over as larger than `message.max.bytes`.
    pub too_large: BTreeSet<String>,
    /// The next dead-letter record is refused so (`Fatal`, or the record's fault).
    pub refuse_dead_letter: Option<Blame>,
    pub max_delay_ms: u64,
}

impl Broker {
    pub fn new(rng: &mut ChaCha8Rng, dead_letter_topic: &str) -> Broker {
        let mut partitions = BTreeMap::new();
        for topic in super::wal::EVENT_TYPES {
            partitions.insert(topic.to_owned(), rng.random_range(1..=3));
        }
        partitions.insert(dead_letter_topic.to_owned(), 1);
        Broker {
            partitions,
            logs: BTreeMap::new(),
            appended_directly: 0,
            queue: BTreeMap::new(),
            outage_until: None,
            poison: BTreeMap::new(),
            fail_next: false,
            failing: BTreeSet::new(),
            fail_batch: false,
            refuse_enqueue: false,
            too_large: BTreeSet::new(),
            refuse_dead_letter: None,
            max_delay_ms: rng.random_range(1..=50),
        }
    }

    pub fn in_flight(&self) -> usize {
        self.queue.values().map(VecDeque::len).sum()
    }

    pub fn in_flight_bytes(&self) -> usize {
        self.queue.values().flatten().map(|p| p.record.size()).sum()
    }

    /// What librdkafka's `murmur2_random` (or a pinned partition) picks.
    pub fn partition(&self, record: &OutboxRecord, rng: &mut ChaCha8Rng) -> i32 {
        let count = self.partitions.get(&record.topic).copied().unwrap_or(1);
        match (record.partition, &record.key) {
            (Some(p), _) => p,
            (None, Some(key)) => partition_for(key, count),
            (None, None) => rng.random_range(0..count),
        }
    }

    pub fn enqueue(
        &mut self,
        rng: &mut ChaCha8Rng,
        ticket: u64,
        record: OutboxRecord,
        alone: bool,
    ) {
        let partition = self.partition(&record, rng);
        let queue = self
            .queue
            .entry((record.topic.clone(), partition))
            .or_default();
        let after = queue.back().map_or(Instant::now(), |p| p.due);
        // Retriable errors are retried inside librdkafka: only a delay shows.
        let retried = if rng.random_range(0..20) == 0 { 200 } else { 0 };
        let delay = Duration::from_millis(rng.random_range(0..=self.max_delay_ms) + retried);
        queue.push_back(Pending {
            ticket,
            record,
            partition,
            due: after.max(Instant::now() + delay),
            alone,
            with_batch: false,
        });
    }

    /// Whether the producer refuses `record` at hand-over, as librdkafka's `produce()` does.
    pub fn refuse_at_enqueue(&mut self, record: &OutboxRecord) -> Option<Refusal> {
        if std::mem::take(&mut self.refuse_enqueue) {
            return Some(refusal(Blame::Fatal, "unknown_topic"));
        }
        let id = String::from_utf8_lossy(&record.id);
        (record.topic != super::DLQ && self.too_large.contains(id.as_ref()))
            .then(|| refusal(Blame::Record { too_large: true }, "msg_size_too_large"))
    }

    /// Appends a record another writer produced.
    pub fn append(&mut self, topic: &str, partition: i32, record: Logged) {
        self.appended_directly += 1;
        let key = (topic.to_owned(), partition);
        self.logs.entry(key).or_default().push(record);
    }

    /// When the next queued record is due (heads of each partition only).
    pub fn next_due(&self) -> Option<Instant> {
        let due = self
            .queue
            .values()
            .filter_map(|q| q.front())
            .map(|p| p.due)
            .min()?;
        Some(self.outage_until.map_or(due, |o| due.max(o)))
    }

    /// Takes the earliest due head, if due now.
    pub fn pop_due(&mut self, now: Instant) -> Option<(Pending, Outcome)> {
        if self.outage_until.is_some_and(|o| o > now) {
            return None;
        }
        let key = self
            .queue
            .iter()
            .filter_map(|(k, q)| q.front().map(|p| (p.due, k.clone())))
            .filter(|(due, _)| *due <= now)
            .min()?
            .1;
        let queue = self.queue.get_mut(&key)?;
        let mut pending = queue.pop_front()?;
        if !pending.alone && std::mem::take(&mut self.fail_batch) {
            // The records batched with it (up to three) fail with it.
            pending.with_batch = true;
            for next in queue.iter_mut().take(3).take_while(|p| !p.alone) {
                next.with_batch = true;
            }
        }
        if pending.with_batch {
            let error = refusal(Blame::Batch, "invalid_record");
            return Some((pending, Outcome::Failed(error)));
        }
        if pending.record.topic == super::DLQ
            && let Some(blame) = self.refuse_dead_letter.take()
        {
            let code = match blame {
                Blame::Fatal => "topic_authorization_failed",
                _ => "policy_violation",
            };
            let error = refusal(blame, code);
            return Some((pending, Outcome::Failed(error)));
        }
        let id = String::from_utf8_lossy(&pending.record.id).into_owned();
        if pending.record.topic != super::DLQ
            && let Some(left) = self.poison.get_mut(&id).filter(|left| **left > 0)
        {
            *left -= 1;
            // As the real sink classifies librdkafka's MSG_SIZE_TOO_LARGE: the batch's
            // fault unless the record was sent alone.
            let blame = match pending.alone {
                true => Blame::Record { too_large: true },
                false => Blame::Batch,
            };
            let error = refusal(blame, "message_size_too_large");
            return Some((pending, Outcome::Failed(error)));
        }
        if std::mem::take(&mut self.fail_next) || self.failing.contains(&key) {
            if self.queue.get(&key).is_some_and(VecDeque::is_empty) {
                self.failing.remove(&key);
            } else {
                self.failing.insert(key);
            }
            let error = refusal(Blame::Fatal, "topic_authorization_failed");
            return Some((pending, Outcome::Failed(error)));
        }
        let record = &pending.record;
        self.logs.entry(key).or_default().push(Logged {
            id,
            key: record.key.clone(),
            payload: record.payload.clone(),
            headers: record.headers.clone(),
        });
        Some((pending, Outcome::Appended))
    }
}

/// One topic of the broker, read back as the real tail reader reads Kafka.
pub struct TopicLog<'a>(pub &'a Broker, pub &'a str);

impl PartitionLog for TopicLog<'_> {
    fn watermarks(&self, partition: i32) -> Result<(i64, i64), TailError> {
        let log = self.0.logs.get(&(self.1.to_owned(), partition));
        Ok((0, log.map_or(0, |l| l.len() as i64)))
    }

    fn read(
        &self,
        ranges: &[(i32, i64, i64)],
        source: &str,
    ) -> Result<HashMap<i32, Vec<Seen>>, TailError> {
        let read = |&(partition, start, end): &(i32, i64, i64)| {
            let log = self.0.logs.get(&(self.1.to_owned(), partition));
            let records = log.map_or(&[][..], |l| &l[start as usize..end as usize]);
            (partition, records.iter().map(|r| r.seen(source)).collect())
        };
        Ok(ranges.iter().map(read).collect())
    }
}

/// A refusal as the sink reports it, with librdkafka's error `code` as its text.
fn refusal(blame: Blame, code: &str) -> Refusal {
    Refusal {
        blame,
        code: code.to_owned(),
        source: code.into(),
    }
}
