//! Start-up waits out outages. A relay restarted while Postgres or Kafka is briefly away (a
//! broker's rolling restart, a network blip during a deploy, a standby still starting, a
//! failover in progress) tries [`super::start`] again with capped exponential back-off and
//! jitter ([`Schedule`]) rather than exiting into a supervisor's crash loop: the events
//! committed meanwhile wait in the slot. It says once per cause what it waits for ([`Waits`]),
//! and `/readyz` says it too, with the next try. What waiting cannot fix (a refused login or
//! ACL, a missing topic, a misconfiguration: [`Outage::of`] finds no outage) still stops it.
//!
//! The decisions are pure: which failures are outages ([`Outage::judge`] over a [`Symptom`]),
//! how long to wait before the next try and how long a try may read ([`Schedule`]), and which
//! failures to log ([`Waits`]). [`start_waiting`] is the loop around them.

use std::future::Future;
use std::time::{Duration, Instant};

use super::{Started, StartupError, Wanted};
use crate::observability::Chain;
use crate::observability::health::Health;
use crate::postgres::{Connector, PostgresError};
use crate::sink::KafkaClients;

/// How long the first try's read of the lineage topic may wait out Kafka not answering; each
/// later try may wait twice as long, up to [`crate::sink::exactly_once::READ_TIMEOUT`].
const FIRST_READ: Duration = Duration::from_secs(5);

/// What a start-up failure shows, as far as waiting is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Symptom<'a> {
    /// Postgres was not reached, or the connection was lost before its answer.
    PostgresSilent,
    /// Postgres answered with this SQLSTATE.
    PostgresSays(&'a str),
    /// No server of the URL is in the role `target_session_attrs` asks for.
    NoSuitableHost,
    /// Kafka did not answer the lineage topic's read or write (or its partition has no leader
    /// now).
    KafkaSilent,
    /// Anything else: a refusal, a refused TLS setting or login, a denied ACL, a missing topic.
    Other,
}

impl<'a> Symptom<'a> {
    /// What `error` shows (`sqlstate` is its SQLSTATE, read by the caller, who owns it).
    fn of(error: &StartupError, sqlstate: Option<&'a str>) -> Self {
        match error {
            StartupError::Postgres(PostgresError::NoSuitableHost { .. }) => Symptom::NoSuitableHost,
            StartupError::Postgres(error) if error.is_transport() => Symptom::PostgresSilent,
            StartupError::Postgres(_) => sqlstate.map_or(Symptom::Other, Symptom::PostgresSays),
            StartupError::Lineage(error) if error.transient() => Symptom::KafkaSilent,
            StartupError::Lineage(_) | StartupError::Refused(_) => Symptom::Other,
        }
    }
}

/// What start-up waits for: each is its own class of attempts, logged once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outage {
    /// Postgres does not answer.
    PostgresSilent,
    /// Postgres answers that it takes no connections now: starting up, shutting down, not yet
    /// consistent after a restart (a standby), or at its connection limit.
    PostgresNotAccepting,
    /// No server of the URL is in the role asked for: a failover in progress.
    NoSuitableHost,
    /// Kafka does not answer.
    KafkaSilent,
}

impl Outage {
    /// The outage `error` is, if waiting may end it.
    pub fn of(error: &StartupError) -> Option<Outage> {
        let sqlstate = match error {
            StartupError::Postgres(error) => error.sqlstate(),
            _ => None,
        };
        Outage::judge(Symptom::of(error, sqlstate.as_deref()))
    }

    /// PURE: the outage a symptom is, if waiting may end it. Of a server's answers, only
    /// those saying it takes no connections *now* are: `57P01`-`57P03` (shut down, crashed,
    /// cannot connect now), `53300` (too many connections) and class `08` (connection
    /// exceptions). A login refused (`28`), a database that does not exist (`3D000`) or a
    /// missing privilege are not.
    pub fn judge(symptom: Symptom<'_>) -> Option<Outage> {
        match symptom {
            Symptom::PostgresSilent => Some(Outage::PostgresSilent),
            Symptom::PostgresSays("57P01" | "57P02" | "57P03" | "53300") => {
                Some(Outage::PostgresNotAccepting)
            }
            Symptom::PostgresSays(code) if code.starts_with("08") => {
                Some(Outage::PostgresNotAccepting)
            }
            Symptom::NoSuitableHost => Some(Outage::NoSuitableHost),
            Symptom::KafkaSilent => Some(Outage::KafkaSilent),
            Symptom::PostgresSays(_) | Symptom::Other => None,
        }
    }

    /// What the relay waits for, in a sentence: `postgres` is the URL (password hidden),
    /// `kafka` the brokers.
    pub fn describe(self, postgres: &str, kafka: &str, topic: &str) -> String {
        match self {
            Outage::PostgresSilent => format!("Postgres at {postgres} does not answer"),
            Outage::PostgresNotAccepting => format!(
                "Postgres at {postgres} takes no connections now (starting up, shutting down, \
                 or at its connection limit)"
            ),
            Outage::NoSuitableHost => format!(
                "no server of {postgres} is in the role target_session_attrs asks for (a \
                 failover in progress?)"
            ),
            Outage::KafkaSilent => format!(
                "Kafka at {kafka} does not answer (reading or writing the lineage topic {topic:?})"
            ),
        }
    }
}

/// PURE: when to try again, and for how long a try may wait for Kafka.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Schedule {
    /// The wait after the first failure (`--reconnect-backoff-min`).
    pub min: Duration,
    /// The longest wait (`--reconnect-backoff-max`).
    pub max: Duration,
}

impl Schedule {
    /// The wait after the `failures`th failure in a row (from 1): `min`, doubled per failure
    /// up to `max`, less up to a quarter by `jitter` (in `[0, 1)`), so that relays restarted
    /// together do not all knock at once, and a wait never exceeds `max`.
    pub fn delay(&self, failures: u32, jitter: f64) -> Duration {
        let doublings = failures.saturating_sub(1).min(30);
        let capped = self.min.saturating_mul(1 << doublings).min(self.max);
        let jitter = jitter.clamp(0.0, 1.0);
        capped.saturating_sub(capped.mul_f64(jitter / 4.0))
    }

    /// How long the try after `failures` failures may wait for the lineage topic's read:
    /// [`FIRST_READ`], doubled per failure, up to the read timeout of every other read. A
    /// short first try says soon that Kafka does not answer; a slow broker gets longer each
    /// time.
    pub fn read_timeout(&self, failures: u32) -> Duration {
        let longest = crate::sink::exactly_once::READ_TIMEOUT;
        FIRST_READ
            .saturating_mul(1 << failures.min(30))
            .min(longest)
    }
}

/// PURE: the failed tries so far, and which to log: the first of each outage in a row, not
/// every try of the same one.
#[derive(Clone, Debug, Default)]
pub struct Waits {
    /// The outage of the last failed try.
    current: Option<Outage>,
    /// Failed tries since the last success.
    failures: u32,
    /// When the first of them failed.
    since: Option<Instant>,
}

impl Waits {
    /// Failed tries since the last success.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// Counts a try that failed at `now` for `outage`; whether it is the first of its kind in
    /// a row, and so logged.
    pub fn failed(&mut self, outage: Outage, now: Instant) -> bool {
        self.failures = self.failures.saturating_add(1);
        self.since.get_or_insert(now);
        self.current.replace(outage) != Some(outage)
    }

    /// A try succeeded at `now`: how many failed before it and since when, if any did.
    pub fn succeeded(&mut self, now: Instant) -> Option<(u32, Duration)> {
        let waited = std::mem::take(self);
        let since = waited.since?;
        Some((waited.failures, now.saturating_duration_since(since)))
    }
}

/// Start-up that waits: where it goes, when it tries again, and where it says what it waits
/// for.
pub struct Patient<'a> {
    /// What the configuration wants.
    pub wanted: &'a Wanted,
    /// Postgres.
    pub postgres: &'a Connector,
    /// Kafka.
    pub kafka: &'a KafkaClients,
    /// When to try again.
    pub schedule: Schedule,
    /// `/readyz`'s state: while start-up waits, a reason says for what.
    pub health: &'a Health,
}

impl Patient<'_> {
    /// [`super::start`] until it succeeds, or fails for a reason waiting cannot end, or
    /// `shutdown` resolves first (then `None`, at once: a try under way is dropped).
    pub async fn start(
        &self,
        shutdown: &mut (impl Future<Output = ()> + Unpin),
    ) -> Result<Option<Started>, StartupError> {
        let mut waits = Waits::default();
        self.health.set_starting(Some(
            "starting: start-up has not finished (connecting to Postgres, checking it, reading \
             and writing the slot's lineage in Kafka)"
                .to_owned(),
        ));
        loop {
            let read_timeout = self.schedule.read_timeout(waits.failures());
            let attempt = super::start_within(self.wanted, self.postgres, self.kafka, read_timeout);
            let result = tokio::select! {
                biased;
                () = &mut *shutdown => return Ok(None),
                result = attempt => result,
            };
            let error = match result {
                Ok(started) => {
                    self.recovered(&mut waits);
                    self.health.set_starting(None);
                    return Ok(Some(started));
                }
                Err(error) => error,
            };
            let Some(outage) = Outage::of(&error) else {
                self.health.set_starting(None);
                return Err(error);
            };
            let delay = self
                .schedule
                .delay(waits.failures().saturating_add(1), jitter());
            self.waiting(&mut waits, outage, &error, delay);
            tokio::select! {
                biased;
                () = &mut *shutdown => return Ok(None),
                () = tokio::time::sleep(delay) => {}
            }
        }
    }

    /// Says what start-up waits for: in the log once per outage in a row (later tries at
    /// debug), on `/readyz` at every try.
    fn waiting(&self, waits: &mut Waits, outage: Outage, error: &StartupError, delay: Duration) {
        let first = waits.failed(outage, Instant::now());
        let wanted = self.wanted;
        let what = outage.describe(&wanted.url, self.kafka.brokers(), &wanted.lineage_topic);
        let next = humantime::format_duration(truncate(delay));
        let failures = waits.failures();
        self.health.set_starting(Some(format!(
            "starting: start-up waits: {what} ({}); failed tries: {failures}, the next in {next}",
            Chain(error)
        )));
        if !first {
            tracing::debug!(error = %Chain(error), failures, retry_in = %next, "start-up still waits: {what}");
            return;
        }
        let longest = humantime::format_duration(self.schedule.max);
        tracing::warn!(
            error = %Chain(error),
            retry_in = %next,
            "start-up waits: {what}. It tries again with back-off (up to {longest} apart), logging \
             this once, and again when it answers or the cause changes; nothing is lost \
             meanwhile, the slot keeps what is committed"
        );
    }

    /// Says that start-up goes on after waiting, if it waited.
    fn recovered(&self, waits: &mut Waits) {
        let Some((failures, waited)) = waits.succeeded(Instant::now()) else {
            return;
        };
        let waited = humantime::format_duration(truncate(waited));
        tracing::info!(
            slot = %self.wanted.slot,
            failures,
            %waited,
            "start-up no longer waits: what it waited for answers"
        );
    }
}

/// `duration` to whole milliseconds, for a readable line.
fn truncate(duration: Duration) -> Duration {
    Duration::from_millis(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX))
}

/// A number in `[0, 1)`, different at each call (from a random UUID's bits: no other source
/// of randomness is needed).
fn jitter() -> f64 {
    let (high, _) = uuid::Uuid::new_v4().as_u64_pair();
    (high >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_outages_are_waited_out() {
        // (symptom, the outage, if waiting may end it)
        let table = [
            (Symptom::PostgresSilent, Some(Outage::PostgresSilent)),
            (
                Symptom::PostgresSays("57P03"),
                Some(Outage::PostgresNotAccepting),
            ),
            (
                Symptom::PostgresSays("57P01"),
                Some(Outage::PostgresNotAccepting),
            ),
            (
                Symptom::PostgresSays("57P02"),
                Some(Outage::PostgresNotAccepting),
            ),
            (
                Symptom::PostgresSays("53300"),
                Some(Outage::PostgresNotAccepting),
            ),
            (
                Symptom::PostgresSays("08006"),
                Some(Outage::PostgresNotAccepting),
            ),
            (Symptom::NoSuitableHost, Some(Outage::NoSuitableHost)),
            (Symptom::KafkaSilent, Some(Outage::KafkaSilent)),
            // A refused login, a database or role that does not exist, a missing privilege,
            // a server running out of disk: a human's turn.
            (Symptom::PostgresSays("28P01"), None),
            (Symptom::PostgresSays("28000"), None),
            (Symptom::PostgresSays("3D000"), None),
            (Symptom::PostgresSays("42501"), None),
            (Symptom::PostgresSays("57P04"), None),
            (Symptom::PostgresSays("53100"), None),
            (Symptom::Other, None),
        ];
        for (symptom, outage) in table {
            assert_eq!(Outage::judge(symptom), outage, "{symptom:?}");
        }
    }

    #[test]
    fn each_outage_names_what_it_waits_for() {
        let url = "postgres://relay:***@db:5432/app";
        // (outage, what its sentence must name)
        let table = [
            (Outage::PostgresSilent, url),
            (Outage::PostgresNotAccepting, "takes no connections now"),
            (Outage::NoSuitableHost, "target_session_attrs"),
            (Outage::KafkaSilent, "kafka-1:9092"),
            (Outage::KafkaSilent, "\"outbox-relay.lineage\""),
        ];
        for (outage, needle) in table {
            let text = outage.describe(url, "kafka-1:9092", "outbox-relay.lineage");
            assert!(text.contains(needle), "{outage:?}: {text}");
        }
    }

    #[test]
    fn the_wait_doubles_up_to_the_cap_less_a_random_quarter() {
        let schedule = Schedule {
            min: Duration::from_millis(500),
            max: Duration::from_secs(30),
        };
        let ms = Duration::from_millis;
        // (failures so far, jitter, the wait)
        let table = [
            (1, 0.0, ms(500)),
            (2, 0.0, ms(1_000)),
            (3, 0.0, ms(2_000)),
            (7, 0.0, ms(30_000)),
            (8, 0.0, ms(30_000)),
            (u32::MAX, 0.0, ms(30_000)),
            // Up to a quarter less, never more than the cap.
            (1, 0.5, ms(437) + Duration::from_micros(500)),
            (8, 0.75, ms(24_375)),
            (8, 7.0, ms(22_500)),
            (8, -1.0, ms(30_000)),
            // A first failure waits the minimum too.
            (0, 0.0, ms(500)),
        ];
        for (failures, jitter, wait) in table {
            assert_eq!(
                schedule.delay(failures, jitter),
                wait,
                "{failures} {jitter}"
            );
        }
    }

    #[test]
    fn a_try_may_wait_for_kafka_longer_after_each_failure() {
        let schedule = Schedule {
            min: Duration::from_millis(500),
            max: Duration::from_secs(30),
        };
        let secs = Duration::from_secs;
        // (failures so far, how long the next try may read)
        let table = [
            (0, secs(5)),
            (1, secs(10)),
            (2, secs(20)),
            (3, secs(30)),
            (u32::MAX, secs(30)),
        ];
        for (failures, timeout) in table {
            assert_eq!(schedule.read_timeout(failures), timeout, "{failures}");
        }
    }

    #[test]
    fn each_cause_is_logged_once_in_a_row() {
        use Outage::{KafkaSilent as K, PostgresNotAccepting as N, PostgresSilent as S};
        let start = Instant::now();
        let mut waits = Waits::default();
        // (the outage of a failed try, whether it is logged)
        let table = [
            (S, true),
            (S, false),
            (S, false),
            (N, true),
            (N, false),
            (K, true),
            (K, false),
            (S, true),
        ];
        for (n, (outage, logged)) in table.into_iter().enumerate() {
            let at = start + Duration::from_secs(n as u64);
            assert_eq!(waits.failed(outage, at), logged, "try {n}: {outage:?}");
        }
        assert_eq!(waits.failures(), 8);
        let end = start + Duration::from_secs(20);
        assert_eq!(waits.succeeded(end), Some((8, Duration::from_secs(20))));
        // After a success, counting starts again, and a success without failures is silent.
        assert_eq!(waits.failures(), 0);
        assert_eq!(waits.succeeded(end), None);
        assert!(waits.failed(S, end));
    }
}
