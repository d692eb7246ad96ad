//! librdkafka's own log lines and error callbacks, folded. During an outage librdkafka reports
//! the same failure for every broker, request and reconnect (hundreds of `AllBrokersDown` in a
//! millisecond when a read gives up); the relay says itself what it waits for and what failed
//! for good. So each kind of line is logged once per [`WINDOW`], the next one saying how many
//! were folded meanwhile, and a partition's end (`PartitionEOF`, which every read back asks
//! for) is no error at all.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rdkafka::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::ConsumerContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// How long lines of one kind are folded after one was logged.
pub const WINDOW: Duration = Duration::from_secs(30);

/// Lines of more kinds than this are not folded: a bound on the memory it takes.
const KINDS: usize = 256;

/// PURE: which lines to log, by kind.
#[derive(Debug, Default)]
pub struct Limiter {
    kinds: HashMap<String, Kind>,
}

#[derive(Debug)]
struct Kind {
    logged_at: Instant,
    folded: u64,
}

/// What to do with one line.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Log it, saying how many of its kind were folded since the last one logged.
    Log {
        /// Lines of its kind not logged since.
        folded: u64,
    },
    /// Fold it into the next one logged.
    Fold,
}

impl Limiter {
    /// Whether a line of `kind` seen at `now` is logged.
    pub fn admit(&mut self, kind: &str, now: Instant) -> Verdict {
        if let Some(seen) = self.kinds.get_mut(kind) {
            if now.saturating_duration_since(seen.logged_at) < WINDOW {
                seen.folded += 1;
                return Verdict::Fold;
            }
            let folded = std::mem::take(&mut seen.folded);
            seen.logged_at = now;
            return Verdict::Log { folded };
        }
        if self.kinds.len() < KINDS {
            let kind_seen = Kind {
                logged_at: now,
                folded: 0,
            };
            self.kinds.insert(kind.to_owned(), kind_seen);
        }
        Verdict::Log { folded: 0 }
    }
}

/// The librdkafka client context of every Kafka client the relay makes but the producer's own
/// (which delegates its log lines and errors here too).
/// Clones share one [`Limiter`].
#[derive(Clone, Debug, Default)]
pub struct ClientLog {
    limiter: Arc<Mutex<Limiter>>,
}

impl ClientLog {
    fn admit(&self, kind: &str) -> Verdict {
        let mut limiter = self.limiter.lock().unwrap_or_else(PoisonError::into_inner);
        limiter.admit(kind, Instant::now())
    }

    /// librdkafka's error callback: logged as a warning (it retries what it can; what fails
    /// for good reaches the relay as an error of its own), once per kind and window.
    pub fn error(&self, error: &KafkaError, reason: &str) {
        let code = error.rdkafka_error_code();
        if code == Some(RDKafkaErrorCode::PartitionEOF) {
            return;
        }
        let kind = format!("error {code:?}");
        if let Verdict::Log { folded } = self.admit(&kind) {
            tracing::warn!(target: "librdkafka", error = %error, folded, "Kafka client error: {reason}");
        }
    }

    /// librdkafka's log line, at its level, once per facility and window.
    pub fn log(&self, level: RDKafkaLogLevel, facility: &str, line: &str) {
        let Verdict::Log { folded } = self.admit(&format!("log {facility}")) else {
            return;
        };
        use RDKafkaLogLevel as L;
        match level {
            L::Emerg | L::Alert | L::Critical | L::Error => {
                tracing::error!(target: "librdkafka", folded, "librdkafka: {facility} {line}");
            }
            L::Warning => {
                tracing::warn!(target: "librdkafka", folded, "librdkafka: {facility} {line}")
            }
            L::Notice | L::Info => {
                tracing::info!(target: "librdkafka", folded, "librdkafka: {facility} {line}");
            }
            L::Debug => tracing::debug!(target: "librdkafka", "librdkafka: {facility} {line}"),
        }
    }
}

impl ClientContext for ClientLog {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, line: &str) {
        ClientLog::log(self, level, facility, line);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        ClientLog::error(self, &error, reason);
    }
}

impl ConsumerContext for ClientLog {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_is_logged_once_per_window_then_says_how_many_were_folded() {
        let start = Instant::now();
        let at = |secs: u64| start + Duration::from_secs(secs);
        let mut limiter = Limiter::default();
        // (kind, seconds since start, verdict)
        let table = [
            ("AllBrokersDown", 0, Verdict::Log { folded: 0 }),
            ("AllBrokersDown", 0, Verdict::Fold),
            ("AllBrokersDown", 1, Verdict::Fold),
            ("BrokerTransportFailure", 1, Verdict::Log { folded: 0 }),
            ("AllBrokersDown", 29, Verdict::Fold),
            ("AllBrokersDown", 30, Verdict::Log { folded: 3 }),
            ("AllBrokersDown", 31, Verdict::Fold),
            ("BrokerTransportFailure", 100, Verdict::Log { folded: 0 }),
            ("AllBrokersDown", 100, Verdict::Log { folded: 1 }),
        ];
        for (kind, secs, verdict) in table {
            assert_eq!(limiter.admit(kind, at(secs)), verdict, "{kind} at {secs} s");
        }
    }

    #[test]
    fn a_thousand_identical_errors_in_a_millisecond_are_one_line() {
        let mut limiter = Limiter::default();
        let now = Instant::now();
        let logged = (0..1_000)
            .filter(|_| limiter.admit("error AllBrokersDown", now) != Verdict::Fold)
            .count();
        assert_eq!(logged, 1);
    }

    #[test]
    fn kinds_beyond_the_bound_are_all_logged_and_take_no_memory() {
        let mut limiter = Limiter::default();
        let now = Instant::now();
        for n in 0..KINDS + 10 {
            assert_eq!(
                limiter.admit(&n.to_string(), now),
                Verdict::Log { folded: 0 }
            );
        }
        assert_eq!(limiter.kinds.len(), KINDS);
        assert_eq!(
            limiter.admit(&(KINDS + 5).to_string(), now),
            Verdict::Log { folded: 0 }
        );
    }
}
