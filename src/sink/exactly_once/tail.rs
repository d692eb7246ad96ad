//! I/O: [`TailReader`] reads partitions back with a librdkafka consumer, and
//! [`KafkaSink`] answers [`ReadBack`] with it and its producer's metadata.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::producer::Producer;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use super::window::{self, PartitionLog};
use super::{ReadBack, Seen, Tail, TailError};
use crate::lsn::Lsn;
use crate::outbox::ID_HEADER;
use crate::sink::{KafkaClients, KafkaSink, SinkError};

/// How long one metadata request or one tail read may take.
const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Metadata reads of a topic the broker is still creating before giving up.
const TOPIC_ATTEMPTS: u32 = 20;

/// How long `backfill` may spend reading back the records of one topic.
const BACKFILL_READ_TIMEOUT: Duration = Duration::from_secs(600);

/// Reads partitions back to find the records this relay wrote there.
pub struct TailReader {
    consumer: BaseConsumer,
}

impl TailReader {
    /// A reader with the relay's brokers and every `-X` property the producer has: what
    /// reaches the brokers (security, TLS verification, SASL, DNS, message sizes) must
    /// reach them the same way; producer-only properties are ignored by a consumer.
    pub fn new(kafka: &KafkaClients) -> Result<Self, SinkError> {
        let consumer = reader_config(kafka)
            .create()
            .map_err(|e| kafka.refused(e))?;
        Ok(TailReader { consumer })
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
        let mut query = TopicPartitionList::new();
        for partition in 0..partitions {
            query
                .add_partition_offset(topic, partition, Offset::Offset(since_ms))
                .map_err(|e| TailError::read(topic, partition, &e))?;
        }
        let by_time = self.consumer.offsets_for_times(query, READ_TIMEOUT).ok();
        let deadline = Instant::now() + BACKFILL_READ_TIMEOUT;
        let mut ranges = Vec::new();
        for partition in 0..partitions {
            let (low, high) = self.watermarks(topic, partition)?;
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
                    let read = self.scan(topic, &last, deadline, |m| m.timestamp().to_millis())?;
                    match read.into_values().flatten().next() {
                        Some(at) if at < since_ms => high,
                        _ => low,
                    }
                }
                _ => low,
            };
            ranges.push((partition, start, high));
        }
        let ids = self.scan(topic, &ranges, deadline, |m| {
            event_id(m).map(<[u8]>::to_vec)
        })?;
        Ok(ids.into_values().flatten().collect())
    }

    /// What `keep` takes from every record of `topic`, up to each partition's end as
    /// found now, in partition then offset order; nothing when the topic does not exist.
    pub fn read_all<T>(
        &self,
        topic: &str,
        keep: impl Fn(&BorrowedMessage<'_>) -> Option<T>,
    ) -> Result<Vec<T>, TailError> {
        let metadata = self
            .consumer
            .fetch_metadata(Some(topic), READ_TIMEOUT)
            .map_err(|e| TailError::read(topic, -1, &e))?;
        let Some(found) = metadata.topics().first() else {
            return Ok(Vec::new());
        };
        match found.error().map(RDKafkaErrorCode::from) {
            None => {}
            Some(RDKafkaErrorCode::UnknownTopicOrPartition) => return Ok(Vec::new()),
            Some(code) => return Err(TailError::read(topic, -1, &KafkaError::MetadataFetch(code))),
        }
        let mut ranges = Vec::new();
        for partition in found.partitions() {
            let (low, high) = self.watermarks(topic, partition.id())?;
            ranges.push((partition.id(), low, high));
        }
        let mut read = self.scan(topic, &ranges, Instant::now() + READ_TIMEOUT, keep)?;
        let records = ranges.iter().map(|r| read.remove(&r.0).unwrap_or_default());
        Ok(records.flatten().collect())
    }

    fn watermarks(&self, topic: &str, partition: i32) -> Result<(i64, i64), TailError> {
        self.consumer
            .fetch_watermarks(topic, partition, READ_TIMEOUT)
            .map_err(|e| TailError::read(topic, partition, &e))
    }

    /// Reads `[start, end)` of each `(partition, start, end)` of `topic`; per
    /// partition, what `keep` takes from its records.
    fn scan<T>(
        &self,
        topic: &str,
        ranges: &[(i32, i64, i64)],
        deadline: Instant,
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
                .map_err(|e| TailError::read(topic, partition, &e))?;
        }
        self.consumer
            .assign(&tpl)
            .map_err(|e| TailError::read(topic, first, &e))?;
        while let Some(&partition) = pending.keys().next() {
            if Instant::now() > deadline {
                return Err(TailError::read(topic, partition, &"timed out"));
            }
            let msg = match self.consumer.poll(Duration::from_millis(200)) {
                None => continue,
                Some(Ok(msg)) => msg,
                Some(Err(KafkaError::PartitionEOF(p))) => {
                    pending.remove(&p);
                    continue;
                }
                Some(Err(e)) => return Err(TailError::read(topic, first, &e)),
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
        // Stop fetching now rather than at the next assignment, which would
        // otherwise wait for these partitions' fetchers to wind down.
        let _ = self.consumer.unassign();
        Ok(found)
    }
}

/// The reader's configuration: the producer's brokers and properties, then what a tail read
/// needs (no group offsets, an end-of-partition signal, no held fetches, no warnings about
/// the producer-only properties).
fn reader_config(kafka: &KafkaClients) -> ClientConfig {
    let mut config = kafka.config(&[]);
    config
        .set("group.id", "outbox-relay-tail-reader")
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
        self.0.watermarks(self.1, partition)
    }

    fn read(
        &self,
        ranges: &[(i32, i64, i64)],
        source: &str,
    ) -> Result<HashMap<i32, Vec<Seen>>, TailError> {
        let deadline = Instant::now() + READ_TIMEOUT;
        self.0.scan(self.1, ranges, deadline, |msg| {
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
    /// Waits a little for a topic the broker is still creating: the first event to it must
    /// not stop the relay.
    async fn partition_count(&self, topic: &str) -> Result<i32, TailError> {
        use RDKafkaErrorCode as C;
        let (mut wait, mut attempt) = (Duration::from_millis(100), 1);
        loop {
            let e = match self.fetch_partition_count(topic).await {
                Ok(n) => return Ok(n),
                Err(e) => e,
            };
            let creating = matches!(
                e.rdkafka_error_code(),
                Some(C::UnknownTopicOrPartition | C::UnknownTopic | C::LeaderNotAvailable)
            );
            if !creating || attempt == TOPIC_ATTEMPTS {
                let reason = format!("cannot read the topic's partition count: {e}");
                return Err(TailError::read(topic, -1, &reason));
            }
            tracing::debug!(topic, error = %e, "topic not there yet; asking again");
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
        // A producer's properties make a working reader: librdkafka ignores its own.
        let producer = [
            ("enable.idempotence", "true"),
            ("linger.ms", "20"),
            ("acks", "all"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()));
        assert!(TailReader::new(&KafkaClients::new("127.0.0.1:1", &producer)).is_ok());
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
