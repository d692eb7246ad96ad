//! I/O: [`TailReader`] reads partitions back with a librdkafka consumer, and
//! [`KafkaSink`] answers [`ReadBack`] with it and its producer's metadata.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::metadata::Metadata;
use rdkafka::producer::Producer;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use super::window::{self, PartitionLog};
use super::{ReadBack, Seen, Tail, TailError};
use crate::lsn::Lsn;
use crate::outbox::ID_HEADER;
use crate::sink::ClientCallbacks;
use crate::sink::cause::Cause;
use crate::sink::{KafkaClients, KafkaSink, SinkError};

/// How long one metadata request or one tail read may take, transport failures waited out
/// within it (a broker restarting, a network blip).
pub const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// The longest one blocking call to librdkafka waits, so a read notices its deadline and a
/// cancellation that soon.
const STEP: Duration = Duration::from_secs(1);

/// How long a read may go on, and whether its caller still wants it: checked between
/// librdkafka's blocking calls, each at most [`STEP`] long.
#[derive(Clone, Debug)]
pub struct Attempt {
    deadline: Instant,
    cancelled: Arc<AtomicBool>,
}

impl Attempt {
    /// A read that may take `timeout`.
    pub fn within(timeout: Duration) -> Attempt {
        Attempt {
            deadline: Instant::now() + timeout,
            cancelled: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Stops the read at its next step (from another thread).
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::SeqCst);
    }

    /// Whether the read must stop: past its deadline, or cancelled.
    fn over(&self) -> bool {
        self.cancelled.load(Ordering::SeqCst) || Instant::now() >= self.deadline
    }

    /// How long the next blocking call may wait.
    fn step(&self) -> Duration {
        self.deadline
            .saturating_duration_since(Instant::now())
            .clamp(Duration::from_millis(1), STEP)
    }

    /// What a read that stopped early says, `last` the transport failure it was waiting out.
    fn stopped(&self, topic: &str, partition: i32, last: Option<&KafkaError>) -> TailError {
        let why = match self.cancelled.load(Ordering::SeqCst) {
            true => "cancelled",
            false => "timed out",
        };
        let reason = match last {
            Some(error) => format!("{why}; the last error: {error}"),
            None => why.to_owned(),
        };
        TailError::Read {
            topic: topic.to_owned(),
            partition,
            reason,
            cause: Cause::Transport,
        }
    }
}

/// Metadata reads of a topic the broker is still creating before giving up.
const TOPIC_ATTEMPTS: u32 = 20;

/// How long `backfill` may spend reading back the records of one topic.
const BACKFILL_READ_TIMEOUT: Duration = Duration::from_secs(600);

/// Events [`TailReader::serve_events`] serves at most.
const SERVED_EVENTS: usize = 4;

/// Reads partitions back to find the records this relay wrote there.
pub struct TailReader {
    consumer: BaseConsumer<ClientCallbacks>,
}

impl TailReader {
    /// A reader with the relay's brokers, `--kafka-auth` and every `-X` property the
    /// producer has: what reaches the brokers (security, TLS verification, SASL, DNS,
    /// message sizes) must reach them the same way; producer-only properties are ignored
    /// by a consumer.
    pub fn new(kafka: &KafkaClients) -> Result<Self, SinkError> {
        let consumer = reader_config(kafka)
            .create_with_context(kafka.context())
            .map_err(|e| kafka.refused(e))?;
        let reader = TailReader { consumer };
        reader.serve_events();
        Ok(reader)
    }

    /// Serves what waits on the consumer's queue between reads: the OAUTHBEARER token
    /// librdkafka asks for (its brokers wait for it) is minted only while the queue is
    /// polled, and a metadata or watermark request does not poll it.
    fn serve_events(&self) {
        // Nothing is assigned between reads: a message left from an earlier read is skipped
        // by the next one anyway. A poll serves one event; a token ask rarely has company.
        for _ in 0..SERVED_EVENTS {
            let _ = self.consumer.poll(Duration::ZERO);
        }
    }

    /// The event ids of the records of `topic` from `since_ms` (Kafka timestamps) on:
    /// what `backfill --delivery exactly-once` must not send again. A partition that
    /// cannot answer by time (an error, or no offset while its last record is that
    /// recent) is read from its start: reading more only finds more ids.
    pub fn event_ids_since(
        &self,
        topic: &str,
        partitions: i32,
        since_ms: i64,
    ) -> Result<HashSet<Vec<u8>>, TailError> {
        self.serve_events();
        let mut query = TopicPartitionList::new();
        for partition in 0..partitions {
            query
                .add_partition_offset(topic, partition, Offset::Offset(since_ms))
                .map_err(|e| TailError::read(topic, partition, &e))?;
        }
        let by_time = self.consumer.offsets_for_times(query, READ_TIMEOUT).ok();
        let attempt = Attempt::within(BACKFILL_READ_TIMEOUT);
        let mut ranges = Vec::new();
        for partition in 0..partitions {
            let (low, high) = self.watermarks(topic, partition, &attempt)?;
            let answer = by_time
                .as_ref()
                .and_then(|tpl| tpl.find_partition(topic, partition))
                .filter(|e| e.error().is_ok())
                .map(|e| e.offset());
            let start = match answer {
                Some(Offset::Offset(offset)) => offset.clamp(low, high),
                // No record from that time on, if the last one is older.
                Some(Offset::End) if high > low => {
                    let last = [(partition, high - 1, high)];
                    let read = self.scan(topic, &last, &attempt, |m| m.timestamp().to_millis())?;
                    match read.into_values().flatten().next() {
                        Some(at) if at < since_ms => high,
                        _ => low,
                    }
                }
                _ => low,
            };
            ranges.push((partition, start, high));
        }
        let ids = self.scan(topic, &ranges, &attempt, |m| {
            event_id(m).map(<[u8]>::to_vec)
        })?;
        Ok(ids.into_values().flatten().collect())
    }

    /// What `keep` takes from every record of `topic`, with its partition and offset, up to
    /// each partition's end as found now, in partition then offset order; nothing when the
    /// topic does not exist. Transport failures are waited out within `attempt`.
    pub fn read_all<T>(
        &self,
        topic: &str,
        attempt: &Attempt,
        keep: impl Fn(&BorrowedMessage<'_>) -> Option<T>,
    ) -> Result<Vec<T>, TailError> {
        self.serve_events();
        let metadata = self.metadata(topic, attempt)?;
        let Some(found) = metadata.topics().first() else {
            return Ok(Vec::new());
        };
        match found.error().map(RDKafkaErrorCode::from) {
            None => {}
            Some(RDKafkaErrorCode::UnknownTopicOrPartition) => return Ok(Vec::new()),
            Some(code) => {
                return Err(TailError::kafka(
                    topic,
                    -1,
                    &KafkaError::MetadataFetch(code),
                ));
            }
        }
        let mut ranges = Vec::new();
        for partition in found.partitions() {
            let (low, high) = self.watermarks(topic, partition.id(), attempt)?;
            ranges.push((partition.id(), low, high));
        }
        let mut read = self.scan(topic, &ranges, attempt, keep)?;
        let records = ranges.iter().map(|r| read.remove(&r.0).unwrap_or_default());
        Ok(records.flatten().collect())
    }

    /// The topic's metadata, transport failures waited out within `attempt`.
    fn metadata(&self, topic: &str, attempt: &Attempt) -> Result<Metadata, TailError> {
        loop {
            match self.consumer.fetch_metadata(Some(topic), attempt.step()) {
                Ok(metadata) => return Ok(metadata),
                Err(e) if Cause::of(&e).transient() && !attempt.over() => {
                    tracing::debug!(topic, error = %e, "reading the topic's metadata again");
                    // A broker that refused the login answers no better by waiting.
                    self.serve_events();
                    if let Some(refusal) = self.consumer.context().refusal() {
                        return Err(TailError::Read {
                            topic: topic.to_owned(),
                            partition: -1,
                            reason: format!("the brokers refused the login: {refusal}"),
                            cause: Cause::Other,
                        });
                    }
                }
                Err(e) if Cause::of(&e).transient() => {
                    return Err(attempt.stopped(topic, -1, Some(&e)));
                }
                Err(e) => return Err(TailError::kafka(topic, -1, &e)),
            }
        }
    }

    fn watermarks(
        &self,
        topic: &str,
        partition: i32,
        attempt: &Attempt,
    ) -> Result<(i64, i64), TailError> {
        loop {
            match self
                .consumer
                .fetch_watermarks(topic, partition, attempt.step())
            {
                Ok(marks) => return Ok(marks),
                Err(e) if Cause::of(&e).transient() && !attempt.over() => {
                    tracing::debug!(topic, partition, error = %e, "reading the partition's offsets again");
                }
                Err(e) if Cause::of(&e).transient() => {
                    return Err(attempt.stopped(topic, partition, Some(&e)));
                }
                Err(e) => return Err(TailError::kafka(topic, partition, &e)),
            }
        }
    }

    /// Reads `[start, end)` of each `(partition, start, end)` of `topic`; per
    /// partition, what `keep` takes from its records. Transport failures are waited out
    /// within `attempt`; the partitions are unassigned however the read ends, so the next
    /// read starts clean.
    fn scan<T>(
        &self,
        topic: &str,
        ranges: &[(i32, i64, i64)],
        attempt: &Attempt,
        keep: impl Fn(&BorrowedMessage<'_>) -> Option<T>,
    ) -> Result<HashMap<i32, Vec<T>>, TailError> {
        let mut found: HashMap<i32, Vec<T>> = ranges.iter().map(|r| (r.0, Vec::new())).collect();
        // The partitions still being read, each with its end.
        let mut pending: HashMap<i32, i64> = ranges
            .iter()
            .filter(|&&(_, start, end)| start < end)
            .map(|&(partition, _, end)| (partition, end))
            .collect();
        let Some(&(first, _, _)) = ranges.first() else {
            return Ok(found);
        };
        let mut tpl = TopicPartitionList::new();
        for &(partition, start, _) in ranges {
            tpl.add_partition_offset(topic, partition, Offset::Offset(start))
                .map_err(|e| TailError::kafka(topic, partition, &e))?;
        }
        let assigned = Assignment::new(&self.consumer, &tpl)
            .map_err(|e| TailError::kafka(topic, first, &e))?;
        let mut waiting_out = None;
        while let Some(&partition) = pending.keys().next() {
            if attempt.over() {
                return Err(attempt.stopped(topic, partition, waiting_out.as_ref()));
            }
            let msg = match assigned.consumer.poll(Duration::from_millis(200)) {
                None => continue,
                Some(Ok(msg)) => msg,
                Some(Err(KafkaError::PartitionEOF(p))) => {
                    pending.remove(&p);
                    continue;
                }
                // The group is only a name librdkafka's assignment wants (READER_GROUP).
                Some(Err(e)) if Cause::of(&e) == Cause::GroupDenied => {
                    tracing::debug!(topic, error = %e, "the reader's group is denied; it needs none");
                    continue;
                }
                // librdkafka reconnects and fetches on by itself.
                Some(Err(e)) if Cause::of(&e).transient() => {
                    tracing::debug!(topic, error = %e, "waiting out a transport failure while reading back");
                    waiting_out = Some(e);
                    continue;
                }
                Some(Err(e)) => return Err(TailError::kafka(topic, first, &e)),
            };
            // Messages of a previously assigned partition may still arrive.
            let p = msg.partition();
            let Some(&end) = pending.get(&p).filter(|_| msg.topic() == topic) else {
                continue;
            };
            if msg.offset() + 1 >= end {
                pending.remove(&p);
            }
            if msg.offset() < end {
                found.entry(p).or_default().extend(keep(&msg));
            }
        }
        Ok(found)
    }
}

/// Partitions assigned to a reader's consumer for one read, unassigned when it ends however
/// it ends: assigning again partitions still assigned aborts inside librdkafka
/// (`rd_kafka_assignment_partition_stopped: Assertion 'rktp->rktp_started' failed`).
struct Assignment<'a> {
    consumer: &'a BaseConsumer<ClientCallbacks>,
}

impl<'a> Assignment<'a> {
    fn new(
        consumer: &'a BaseConsumer<ClientCallbacks>,
        partitions: &TopicPartitionList,
    ) -> Result<Self, KafkaError> {
        consumer.assign(partitions)?;
        Ok(Assignment { consumer })
    }
}

impl Drop for Assignment<'_> {
    fn drop(&mut self) {
        // Stops fetching now rather than at the next assignment, which would otherwise wait
        // for these partitions' fetchers to wind down.
        if let Err(error) = self.consumer.unassign() {
            tracing::warn!(error = %error, "cannot unassign the partitions read back");
        }
    }
}

/// The consumer group the readers name: librdkafka assigns partitions only to a consumer with
/// a group. They commit nothing and read no group offsets (every read starts at an offset it
/// gives), so a principal denied the group reads all the same: the coordinator look-up's
/// refusal is ignored ([`Cause::GroupDenied`] in [`TailReader::scan`]).
pub const READER_GROUP: &str = "outbox-relay-tail-reader";

/// The reader's configuration: the producer's brokers and properties, then what a tail read
/// needs (the group librdkafka's assignment wants, no group offsets, an end-of-partition
/// signal, no held fetches, no warnings about the producer-only properties).
fn reader_config(kafka: &KafkaClients) -> ClientConfig {
    let mut config = kafka.config(&[]);
    config
        .set("group.id", READER_GROUP)
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("fetch.wait.max.ms", "10")
        .set("log_level", "3");
    config
}

/// One topic of a [`TailReader`], for [`window::tails`].
struct Topic<'a>(&'a TailReader, &'a str);

impl PartitionLog for Topic<'_> {
    fn watermarks(&self, partition: i32) -> Result<(i64, i64), TailError> {
        self.0
            .watermarks(self.1, partition, &Attempt::within(READ_TIMEOUT))
    }

    fn read(
        &self,
        ranges: &[(i32, i64, i64)],
        source: &str,
    ) -> Result<HashMap<i32, Vec<Seen>>, TailError> {
        let attempt = Attempt::within(READ_TIMEOUT);
        self.0.scan(self.1, ranges, &attempt, |msg| {
            let headers = msg.headers().into_iter().flat_map(|h| h.iter());
            Some(Seen::classify(
                source,
                headers.map(|h| (h.key, h.value)),
                msg.key(),
            ))
        })
    }
}

fn event_id<'a>(msg: &'a BorrowedMessage<'_>) -> Option<&'a [u8]> {
    let mut headers = msg.headers().into_iter().flat_map(|h| h.iter());
    headers.find(|h| h.key == ID_HEADER).and_then(|h| h.value)
}

impl KafkaSink {
    /// The partition count of `topic` from the producer's metadata: the producer's, so a topic
    /// the broker auto-creates is created.
    pub async fn fetch_partition_count(&self, topic: &str) -> Result<i32, KafkaError> {
        let (producer, topic) = (Arc::clone(&self.producer), topic.to_owned());
        let fetch = tokio::task::spawn_blocking(move || {
            let metadata = producer
                .client()
                .fetch_metadata(Some(&topic), READ_TIMEOUT)?;
            let count = metadata
                .topics()
                .first()
                .filter(|t| t.error().is_none())
                .map_or(0, |t| t.partitions().len());
            match i32::try_from(count) {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(KafkaError::MetadataFetch(
                    RDKafkaErrorCode::UnknownTopicOrPartition,
                )),
            }
        });
        fetch
            .await
            .unwrap_or(Err(KafkaError::MetadataFetch(RDKafkaErrorCode::Fail)))
    }
}

impl ReadBack for KafkaSink {
    /// Waits a little for a topic the broker is still creating (the first event to it must
    /// not stop the relay), and for brokers that do not answer (a blip).
    async fn partition_count(&self, topic: &str) -> Result<i32, TailError> {
        use RDKafkaErrorCode as C;
        let mut wait = Duration::from_millis(100);
        let mut attempt = 1;
        loop {
            let e = match self.fetch_partition_count(topic).await {
                Ok(n) => return Ok(n),
                Err(e) => e,
            };
            let creating = matches!(
                e.rdkafka_error_code(),
                Some(C::UnknownTopicOrPartition | C::UnknownTopic | C::LeaderNotAvailable)
            );
            if !(creating || Cause::of(&e).transient()) || attempt == TOPIC_ATTEMPTS {
                return Err(TailError::kafka(topic, -1, &e));
            }
            tracing::debug!(topic, error = %e, "no partition count yet; asking again");
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_secs(2));
            attempt += 1;
        }
    }

    async fn tails(
        &self,
        topic: &str,
        source: &str,
        partitions: i32,
        floor: Lsn,
        wal_end: Lsn,
    ) -> Vec<Result<Tail, TailError>> {
        let failed = |reason: String| {
            (0..partitions)
                .map(|partition| Err(TailError::read(topic, partition, &reason)))
                .collect()
        };
        let Some(reader) = self.tails.clone() else {
            return failed("no tail reader (not --delivery exactly-once)".to_owned());
        };
        let (owned, source) = (topic.to_owned(), source.to_owned());
        let read = tokio::task::spawn_blocking(move || {
            let reader = reader.lock().unwrap_or_else(PoisonError::into_inner);
            reader.serve_events();
            let topic = Topic(&reader, &owned);
            window::tails(&topic, &owned, &source, partitions, floor, wal_end)
        });
        read.await
            .unwrap_or_else(|e| failed(format!("the blocking read stopped: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 21 §7: every `-X` property reaches the reader, security ones included.
    #[test]
    fn the_reader_has_every_property_the_producer_has() {
        let properties: Vec<(String, String)> = [
            ("security.protocol", "sasl_ssl"),
            ("enable.ssl.certificate.verification", "false"),
            ("enable.sasl.oauthbearer.unsecure.jwt", "true"),
            ("ssl.endpoint.identification.algorithm", "none"),
            (
                "client.dns.lookup",
                "resolve_canonical_bootstrap_servers_only",
            ),
            ("message.max.bytes", "20000000"),
            ("bootstrap.servers", "broker:9093"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .into();
        let config = reader_config(&KafkaClients::new("broker:9092", &properties));
        for (k, v) in &properties {
            assert_eq!(config.get(k), Some(v.as_str()), "{k}");
        }
        // What a tail read needs is not the user's to change.
        let own = [("enable.partition.eof".to_owned(), "false".to_owned())];
        assert_eq!(
            reader_config(&KafkaClients::new("b", &own)).get("enable.partition.eof"),
            Some("true")
        );
        let group = [("group.id".to_owned(), "relays".to_owned())];
        assert_eq!(
            reader_config(&KafkaClients::new("b", &group)).get("group.id"),
            Some(READER_GROUP)
        );
        // A producer's properties make a working reader: librdkafka ignores its own.
        let producer = [
            ("enable.idempotence", "true"),
            ("linger.ms", "20"),
            ("acks", "all"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()));
        assert!(TailReader::new(&KafkaClients::new("127.0.0.1:1", &producer)).is_ok());
    }

    /// Issue 32: a read waiting out brokers that do not answer stops when cancelled (a
    /// SIGTERM at start-up), saying so, instead of running to its deadline.
    #[test]
    fn a_read_waiting_for_brokers_stops_when_cancelled() {
        let reader = TailReader::new(&KafkaClients::new("127.0.0.1:1", &[])).unwrap();
        let attempt = Attempt::within(Duration::from_secs(600));
        let canceller = attempt.clone();
        let cancel = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            canceller.cancel();
        });
        let read = reader.read_all("t", &attempt, |_| Some(()));
        cancel.join().unwrap();
        let Err(error) = read else {
            panic!("nothing answers at 127.0.0.1:1");
        };
        assert_eq!(error.cause(), Cause::Transport, "{error}");
        assert!(error.to_string().contains("cancelled"), "{error}");
    }

    #[test]
    fn a_refused_reader_property_shows_the_key_never_the_value() {
        let properties = [("sasl.pasword".to_owned(), "hunter2".to_owned())];
        let err = TailReader::new(&KafkaClients::new("127.0.0.1:1", &properties))
            .err()
            .map(|e| format!("{e} {e:?}"))
            .unwrap_or_default();
        assert!(err.contains("sasl.pasword"), "{err}");
        assert!(!err.contains("hunter2"), "{err}");
    }
}
