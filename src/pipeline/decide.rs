//! PURE: the pipeline's decisions, each on a few values it is given, tested without I/O
//! (as quinn-proto's connection is): what to do about a failed event, what may be reported to
//! Postgres, and whether to read on.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::RelayError;
use crate::lsn::Lsn;
use crate::outbox::{DeadLetterInfo, EventError, OutboxRecord, RawParts, dead_letter_record};
use crate::sink::{Blame, Refusal, SinkError};
use crate::source::READ_AHEAD;

/// An event that did not reach Kafka, with what is known of it.
pub(super) enum Failure {
    /// It maps to no record: why, and what could be read of it with its commit time (Unix ms).
    Unmapped(EventError, RawParts, i64),
    /// Kafka refused the record: at hand-over, or in a delivery report (`true`).
    Refused(OutboxRecord, Refusal, bool),
    /// The producer failed (it could not be made).
    Sink(SinkError),
}

impl Failure {
    /// `record`, which the producer refused at hand-over with `error`.
    pub(super) fn enqueue(record: OutboxRecord, error: SinkError) -> Self {
        match error {
            SinkError::Enqueue { source, .. } => Failure::Refused(record, source, false),
            error => Failure::Sink(error),
        }
    }
}

/// What to do next about a [`Failure`].
#[derive(Debug)]
pub(super) enum Verdict {
    /// The broker blamed the record's batch: send it again in a batch of its own.
    SendAlone(OutboxRecord, Refusal),
    /// Poison under `--on-poison dead-letter`: send this dead-letter record in its place.
    DeadLetter(OutboxRecord, DeadLetterInfo),
    /// Stop.
    Stop(RelayError),
}

/// The commit LSN and outbox table of a failed event, and the dead-letter topic if any.
pub(super) struct Origin<'a> {
    pub lsn: Lsn,
    pub table: String,
    pub dead_letter_topic: Option<&'a str>,
}

/// The failure chain as one decision: a batch's fault is retried alone; the record's fault
/// (poison) is dead-lettered or stops the relay, except for a dead-letter record, which would
/// loop; anything else stops the relay.
pub(super) fn verdict(failure: Failure, origin: Origin<'_>) -> Verdict {
    let (lsn, table) = (origin.lsn, origin.table.clone());
    let (record, error, reported) = match failure {
        Failure::Sink(source) => return Verdict::Stop(RelayError::Sink { lsn, table, source }),
        Failure::Unmapped(error, parts, time) => {
            return poison(origin, (parts, Vec::new(), time), error.to_string(), false);
        }
        Failure::Refused(record, refusal, reported) => (record, refusal, reported),
    };
    let (id, topic) = (record.id_text(), record.topic.clone());
    Verdict::Stop(match error.blame {
        Blame::Batch => return Verdict::SendAlone(record, error),
        Blame::Record { .. } if origin.dead_letter_topic == Some(&topic) => {
            RelayError::DeadLetter {
                lsn,
                id,
                topic,
                error,
            }
        }
        Blame::Record { too_large } => {
            let (headers, time) = (record.headers, record.timestamp_ms);
            let parts = RawParts {
                id: record.id,
                key: record.key,
                payload: record.payload,
                intended_topic: Some(record.topic),
            };
            return poison(
                origin,
                (parts, headers, time),
                error.source.to_string(),
                too_large,
            );
        }
        Blame::Fatal if reported => RelayError::Delivery {
            lsn,
            id,
            topic,
            error,
        },
        Blame::Fatal => {
            let source = SinkError::Enqueue {
                topic,
                id,
                source: error,
            };
            RelayError::Sink { lsn, table, source }
        }
    })
}

/// A poison event (what could be read of it, its headers and timestamp) and why: dead-lettered
/// where a dead-letter topic is configured (without its payload when that is `too_large`),
/// else the relay stops.
fn poison(origin: Origin<'_>, event: Event, error: String, too_large: bool) -> Verdict {
    let (parts, headers, timestamp_ms) = event;
    let size = parts.payload.as_ref().map_or(0, Bytes::len);
    let info = DeadLetterInfo {
        error,
        lsn: origin.lsn,
        table: origin.table,
        intended_topic: parts.intended_topic.clone(),
        payload_omitted: too_large.then(|| {
            format!(
                "payload of {size} bytes is the reason: larger than the producer's or \
                 broker's message.max.bytes"
            )
        }),
    };
    let Some(topic) = origin.dead_letter_topic else {
        let id = String::from_utf8_lossy(&parts.id).into_owned();
        return Verdict::Stop(RelayError::Poison { id, info });
    };
    let record = dead_letter_record(topic, parts, headers, &info, timestamp_ms);
    Verdict::DeadLetter(record, info)
}

/// What a dead-letter record is made of: the event's parts, extra headers and timestamp.
type Event = (RawParts, Vec<(Arc<str>, Option<Bytes>)>, i64);

/// The position that may be reported to Postgres: the ack frontier, held back until the rows
/// it covers are deleted (`cleared`, under `--cleanup delete`) and, where a dropped
/// publication goes unnoticed by the stream (PostgreSQL 18), until a check covered it
/// (`checked`).
pub(super) fn reportable(frontier: Lsn, cleared: Option<Lsn>, checked: Option<Lsn>) -> Lsn {
    [cleared, checked]
        .into_iter()
        .flatten()
        .fold(frontier, Lsn::min)
}

/// The longest wait between publication checks that cannot run (no new control connection).
pub(super) const UNCHECKED_WAIT_MAX: Duration = Duration::from_secs(60);

/// When to check the publication again after `failures` checks in a row could not run (0: the
/// last one ran): every status interval while they run, then from a second on, doubling to
/// [`UNCHECKED_WAIT_MAX`], so a server refusing connections is not asked every second.
pub(super) fn next_publication_check(failures: u32, status_interval: Duration) -> Duration {
    if failures == 0 {
        return status_interval;
    }
    let doubled = Duration::from_secs(1).saturating_mul(1 << (failures - 1).min(16));
    doubled.clamp(status_interval, UNCHECKED_WAIT_MAX.max(status_interval))
}

/// The read gate: reads stop at the in-flight caps, so the replication channel fills and TCP
/// slows the walsender (invariant 3).
#[derive(Debug)]
pub(super) struct ReadGate {
    /// `--max-in-flight-events` and `--max-in-flight-bytes`.
    pub max_events: usize,
    pub max_bytes: usize,
    /// The largest recent WAL message, decaying by 1/64 per message so one huge row does not
    /// throttle the rest of the run.
    pub largest: usize,
}

impl ReadGate {
    /// A WAL message of `len` bytes was read.
    pub(super) fn saw(&mut self, len: usize) {
        self.largest = len.max(self.largest - self.largest / 64);
    }

    /// Whether to read on with `window` tickets and `bytes` in flight. The stream reads up to
    /// [`READ_AHEAD`] messages beyond what is in flight; with nothing in flight, read anyway, so
    /// a row larger than the byte cap goes through.
    pub(super) fn open(&self, window: usize, bytes: usize) -> bool {
        let read_ahead = bytes.saturating_add(READ_AHEAD * self.largest);
        window < self.max_events && (bytes == 0 || read_ahead < self.max_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(topic: &str, payload: &'static str) -> OutboxRecord {
        OutboxRecord {
            topic: topic.to_owned(),
            key: Some(Bytes::from_static(b"k")),
            payload: Some(Bytes::from_static(payload.as_bytes())),
            id: Bytes::from_static(b"e1"),
            headers: Vec::new(),
            id_header_at: Some(0),
            timestamp_ms: 7,
            partition: None,
            schemas: None,
        }
    }

    fn refused(topic: &str, blame: Blame, reported: bool) -> Failure {
        let refusal = Refusal {
            blame,
            code: "some_code".to_owned(),
            source: "what Kafka said".into(),
        };
        Failure::Refused(record(topic, "{}"), refusal, reported)
    }

    /// The verdict in short: what is sent next (and where), or which error stops the relay.
    fn summary(verdict: Verdict) -> String {
        match verdict {
            Verdict::SendAlone(record, _) => format!("alone to {}", record.topic),
            Verdict::DeadLetter(record, info) => {
                format!(
                    "dead-letter to {}{}",
                    record.topic,
                    if record.payload.is_none() {
                        " without payload"
                    } else {
                        ""
                    }
                ) + &format!(" ({})", info.error)
            }
            Verdict::Stop(error) => format!("stop: {}", error.exit_code()),
        }
    }

    #[test]
    fn verdicts() {
        let too_large = Blame::Record { too_large: true };
        let poison = Blame::Record { too_large: false };
        let unmapped = || {
            let error = EventError::EmptyRoutingValue {
                column: "event_type".into(),
            };
            let parts = RawParts {
                id: Bytes::from_static(b"e1"),
                key: None,
                payload: Some(Bytes::from_static(b"{}")),
                intended_topic: None,
            };
            Failure::Unmapped(error, parts, 7)
        };
        let sink = || {
            Failure::Sink(SinkError::Create {
                reason: "no".into(),
            })
        };
        let (kafka, poison_exit, dead_letter_exit) = (4, 5, 6);
        // (failure, dead-letter topic) -> verdict
        let table: Vec<(Failure, Option<&str>, String)> = vec![
            (refused("orders", Blame::Batch, true), None, "alone to orders".into()),
            (refused("dlq", Blame::Batch, true), Some("dlq"), "alone to dlq".into()),
            (
                refused("orders", too_large, true),
                Some("dlq"),
                "dead-letter to dlq without payload (what Kafka said)".into(),
            ),
            (
                refused("orders", poison, false),
                Some("dlq"),
                "dead-letter to dlq (what Kafka said)".into(),
            ),
            (refused("orders", too_large, true), None, format!("stop: {poison_exit}")),
            (refused("orders", poison, false), None, format!("stop: {poison_exit}")),
            // A dead-letter record is never dead-lettered again.
            (refused("dlq", too_large, true), Some("dlq"), format!("stop: {dead_letter_exit}")),
            (refused("dlq", poison, false), Some("dlq"), format!("stop: {dead_letter_exit}")),
            (refused("orders", Blame::Fatal, true), Some("dlq"), format!("stop: {kafka}")),
            (refused("orders", Blame::Fatal, false), None, format!("stop: {kafka}")),
            (refused("dlq", Blame::Fatal, false), Some("dlq"), format!("stop: {kafka}")),
            (
                unmapped(),
                Some("dlq"),
                r#"dead-letter to dlq (column "event_type", used in the topic name, is NULL or empty)"#
                    .into(),
            ),
            (unmapped(), None, format!("stop: {poison_exit}")),
            (sink(), Some("dlq"), format!("stop: {kafka}")),
        ];
        for (n, (failure, dead_letter_topic, expected)) in table.into_iter().enumerate() {
            let origin = Origin {
                lsn: Lsn(10),
                table: "public.outbox".into(),
                dead_letter_topic,
            };
            assert_eq!(summary(verdict(failure, origin)), expected, "case {n}");
        }
    }

    #[test]
    fn failures_stop_with_the_error_of_where_they_happened() {
        let origin = || Origin {
            lsn: Lsn(10),
            table: "public.outbox".into(),
            dead_letter_topic: None,
        };
        let stop = |failure| match verdict(failure, origin()) {
            Verdict::Stop(error) => error,
            other => panic!("not a stop: {other:?}"),
        };
        let reported = stop(refused("orders", Blame::Fatal, true));
        assert!(
            matches!(reported, RelayError::Delivery { lsn: Lsn(10), .. }),
            "{reported:?}"
        );
        let enqueue = stop(refused("orders", Blame::Fatal, false));
        assert!(
            matches!(&enqueue, RelayError::Sink { table, source: SinkError::Enqueue { .. }, .. } if table == "public.outbox"),
            "{enqueue:?}"
        );
        let RelayError::Poison { id, info } =
            stop(refused("orders", Blame::Record { too_large: true }, true))
        else {
            panic!("not poison");
        };
        assert_eq!(
            (id.as_str(), info.intended_topic.as_deref()),
            ("e1", Some("orders"))
        );
        assert_eq!(info.error, "what Kafka said");
        assert!(
            info.payload_omitted
                .is_some_and(|why| why.contains("payload of 2 bytes"))
        );
    }

    #[test]
    fn reportable_positions() {
        let (l, none) = (Lsn, None);
        // (frontier, cleared, checked) -> reportable
        let table = [
            (l(100), none, none, l(100)),
            (l(100), Some(l(80)), none, l(80)),
            (l(100), Some(l(120)), none, l(100)),
            (l(100), none, Some(l(90)), l(90)),
            (l(100), none, Some(l(150)), l(100)),
            (l(100), Some(l(80)), Some(l(90)), l(80)),
            (l(100), Some(l(95)), Some(l(90)), l(90)),
        ];
        for (frontier, cleared, checked, expected) in table {
            assert_eq!(
                reportable(frontier, cleared, checked),
                expected,
                "{frontier} {cleared:?} {checked:?}"
            );
        }
    }

    #[test]
    fn the_read_gate_holds_at_the_caps_with_the_read_ahead() {
        // (largest message, window, bytes in flight) -> open, under caps of 10 events, 1000 bytes
        let table = [
            (0, 0, 0, true),
            (0, 9, 999, true),
            (0, 10, 0, false),
            (0, 9, 1000, false),
            // Three messages of read-ahead (`READ_AHEAD`) are reserved out of the byte cap.
            (100, 5, 699, true),
            (100, 5, 700, false),
            // Nothing in flight: a row larger than the cap is read all the same.
            (5000, 0, 0, true),
            (5000, 1, 1, false),
            (5000, 10, 0, false),
        ];
        for (largest, window, bytes, expected) in table {
            let gate = ReadGate {
                max_events: 10,
                max_bytes: 1000,
                largest,
            };
            assert_eq!(
                gate.open(window, bytes),
                expected,
                "largest {largest}, window {window}, bytes {bytes}"
            );
        }
    }

    #[test]
    fn one_huge_message_stops_throttling_as_it_decays() {
        let mut gate = ReadGate {
            max_events: 10,
            max_bytes: 1000,
            largest: 0,
        };
        gate.saw(64_000);
        assert_eq!(gate.largest, 64_000);
        gate.saw(10);
        assert_eq!(gate.largest, 63_000);
        for _ in 0..1000 {
            gate.saw(10);
        }
        // Integer decay ends below 64 bytes: less than a row's headers.
        assert_eq!(gate.largest, 63);
        gate.saw(500);
        assert_eq!(gate.largest, 500);
    }

    /// Issue 32: checks that cannot run were retried every second with no back-off.
    #[test]
    fn unrunnable_publication_checks_back_off_to_a_minute() {
        let ms = Duration::from_millis;
        let secs = Duration::from_secs;
        // (failures in a row, status interval, wait)
        let table = [
            (0, ms(100), ms(100)),
            (1, ms(100), secs(1)),
            (2, ms(100), secs(2)),
            (3, ms(100), secs(4)),
            (7, ms(100), secs(60)),
            (40, ms(100), secs(60)),
            (u32::MAX, ms(100), secs(60)),
            // A status interval longer than the cap is never shortened.
            (0, secs(90), secs(90)),
            (3, secs(90), secs(90)),
        ];
        for (failures, interval, wait) in table {
            assert_eq!(
                next_publication_check(failures, interval),
                wait,
                "{failures}, {interval:?}"
            );
        }
    }
}
