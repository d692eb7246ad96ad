//! Schema ids between mapping and the producer. A record whose key or value schema has no
//! known id waits here, and so does every record after it (keys keep their order): one
//! registry lookup at a time resolves the first unknown schema of the first waiting record,
//! the id goes into the shared cache, and what then has all its ids goes to the producer.
//!
//! The records here already hold their tickets in the ack tracker, so nothing past them is
//! acknowledged while they wait, and the read gate counts them. The loop keeps handling
//! delivery reports, shutdown and the stream meanwhile: waiting on the registry holds up
//! nothing that came before. A registry that is unavailable is retried with a capped
//! backoff; one that refuses a schema makes that event poison (`--on-poison` decides); one
//! that refuses the relay stops it.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::decide::Failure;
use super::{Pipeline, RelayError};
use crate::outbox::EventError;
use crate::outbox::OutboxRecord;
use crate::outbox::connect::registry::{Pending, PendingSchemas, SchemaIds};
use crate::sink::exactly_once::{Position, ReadBack};
use crate::sink::registry::{self, Resolving, SchemaRegistry};
use crate::sink::{Sink, Ticket};
use crate::source::Source;

/// First wait before asking an unavailable registry again; doubles up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// A record waiting for schema ids, with what its hand-over needs.
pub(super) struct Waiting {
    pub ticket: Ticket,
    pub record: OutboxRecord,
    pub table: Arc<str>,
    pub position: Position,
    /// The commit time (Unix ms), for a dead letter's timestamp.
    pub commit_time_ms: i64,
}

/// The records waiting for schema ids, and the one lookup in flight.
pub(super) struct Registering {
    registry: Option<Arc<dyn SchemaRegistry>>,
    ids: SchemaIds,
    queue: VecDeque<Waiting>,
    lookup: Option<(Pending, Resolving)>,
    /// After an unavailable registry: when to ask again, and the wait after that.
    retry_at: Option<Instant>,
    backoff: Duration,
    /// Failed attempts in a row, for the log.
    failures: u64,
}

/// What one lookup came to.
pub(super) type Outcome = (Pending, Result<u32, registry::Failure>);

impl Registering {
    /// No registry: records never wait (a record with pending schemas then stops the relay).
    pub(super) fn new(ids: SchemaIds) -> Self {
        Registering {
            registry: None,
            ids,
            queue: VecDeque::new(),
            lookup: None,
            retry_at: None,
            backoff: MIN_BACKOFF,
            failures: 0,
        }
    }

    /// Resolves schema ids through `registry`.
    pub(super) fn with_registry(mut self, registry: Arc<dyn SchemaRegistry>) -> Self {
        self.registry = Some(registry);
        self
    }

    /// Whether `record` must wait: it lacks an id, or others wait before it.
    pub(super) fn holds(&self, record: &OutboxRecord) -> bool {
        !self.queue.is_empty() || record.schemas.is_some()
    }

    /// Records waiting.
    pub(super) fn len(&self) -> usize {
        self.queue.len()
    }

    /// Whether a lookup or a retry is under way.
    pub(super) fn active(&self) -> bool {
        self.lookup.is_some() || self.retry_at.is_some()
    }

    /// The next record whose ids are all known, taken off the queue (ids written in).
    pub(super) fn ready(&mut self) -> Option<Waiting> {
        let front = self.queue.front_mut()?;
        if !PendingSchemas::complete(&mut front.record, &self.ids) {
            return None;
        }
        self.queue.pop_front()
    }

    /// Queues `waiting` behind the others.
    pub(super) fn wait(&mut self, waiting: Waiting) {
        self.queue.push_back(waiting);
    }

    /// Starts the lookup of the first waiting record's first unknown schema, unless one is
    /// under way. `Err`: there is no registry to ask.
    fn start(&mut self) -> Result<(), String> {
        if self.active() {
            return Ok(());
        }
        let next = self.queue.front().and_then(|w| w.record.schemas.as_ref());
        let unknown = next.and_then(|p| {
            p.each()
                .find(|p| self.ids.get(&p.subject, &p.schema).is_none())
        });
        let Some(pending) = unknown.cloned() else {
            return Ok(());
        };
        let Some(registry) = &self.registry else {
            return Err(format!(
                "no Schema Registry to register the schema of subject {:?} with",
                pending.subject
            ));
        };
        let resolving = registry.resolve(pending.clone());
        self.lookup = Some((pending, resolving));
        Ok(())
    }

    /// The lookup's outcome (after the backoff, when retrying); pending forever when idle.
    /// Cancel-safe: the lookup stays here between polls.
    pub(super) async fn next(&mut self) -> Outcome {
        if let Some(at) = self.retry_at {
            tokio::time::sleep_until(at).await;
            self.retry_at = None;
            if self.start().is_err() {
                return std::future::pending().await;
            }
        }
        let result = match self.lookup.as_mut() {
            Some((_, resolving)) => resolving.await,
            None => return std::future::pending().await,
        };
        match self.lookup.take() {
            Some((pending, _)) => (pending, result),
            None => std::future::pending().await,
        }
    }

    /// An unavailable registry: try again after the backoff. Returns how many attempts have
    /// failed in a row.
    fn retry_later(&mut self) -> u64 {
        self.retry_at = Some(Instant::now() + self.backoff);
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
        self.failures += 1;
        self.failures
    }

    /// The registry answered.
    fn answered(&mut self) {
        self.backoff = MIN_BACKOFF;
        self.failures = 0;
    }
}

impl<S: Source, K: Sink + ReadBack> Pipeline<S, K> {
    /// Queues a record that lacks a schema id (or follows one that does) under its ticket,
    /// then hands over what is ready.
    pub(super) async fn register(
        &mut self,
        record: OutboxRecord,
        table: Arc<str>,
        position: Position,
    ) -> Result<(), RelayError> {
        let ticket = self.tracker.push(record.size(), &table)?;
        let commit_time_ms = self.tx.commit_time_ms();
        self.registering.wait(Waiting {
            ticket,
            record,
            table,
            position,
            commit_time_ms,
        });
        self.release().await
    }

    /// Hands over every waiting record whose ids are known, in order, and starts the lookup
    /// the first one left needs.
    pub(super) async fn release(&mut self) -> Result<(), RelayError> {
        while let Some(ready) = self.registering.ready() {
            let Waiting {
                ticket,
                record,
                table,
                position,
                ..
            } = ready;
            self.deliver(Some(ticket), record, table, position).await?;
        }
        let started = self.registering.start();
        self.observer
            .schema_registry_waiting(self.registering.len());
        started.map_err(|reason| self.registry_stop(reason))
    }

    /// A lookup came back: its id is known now, or the registry is retried, or the first
    /// waiting record is poison, or the relay stops.
    pub(super) async fn on_registered(
        &mut self,
        (pending, result): Outcome,
    ) -> Result<(), RelayError> {
        let failure = match result {
            Ok(id) => {
                self.observer.schema_registry_answered("ok", None);
                self.registering.answered();
                self.registering
                    .ids
                    .insert(&pending.subject, &pending.schema, id);
                return self.release().await;
            }
            Err(failure) => failure,
        };
        match &failure {
            registry::Failure::Unavailable { reason } => {
                self.registry_unavailable(&pending, reason, &failure);
                Ok(())
            }
            registry::Failure::Refused { .. } => self.schema_refused(&failure).await,
            registry::Failure::Unauthorized { .. } => {
                self.observer.schema_registry_answered("unauthorized", None);
                let lsn = (self.registering.queue.front())
                    .and_then(|w| self.tracker.origin(w.ticket))
                    .map(|(lsn, _)| lsn)
                    .unwrap_or_default();
                Err(RelayError::SchemaRegistry {
                    lsn,
                    source: failure,
                })
            }
        }
    }

    /// The registry did not answer: the lookup is retried later, the events wait.
    fn registry_unavailable(
        &mut self,
        pending: &Pending,
        reason: &str,
        failure: &registry::Failure,
    ) {
        let attempts = self.registering.retry_later();
        let why = format!(
            "events wait for the Schema Registry (subject {:?}): {reason}",
            pending.subject
        );
        self.observer
            .schema_registry_answered("unavailable", Some(&why));
        // The first failure, then every 10th: a long outage does not flood the log.
        if attempts == 1 || attempts.is_multiple_of(10) {
            tracing::warn!(
                subject = %pending.subject,
                attempts,
                waiting = self.registering.len(),
                error = %failure,
                "the Schema Registry is unavailable; events wait (nothing after them is \
                 acknowledged) and the request is retried"
            );
        }
    }

    /// The registry refused the first waiting record's schema: that record is poison.
    async fn schema_refused(&mut self, failure: &registry::Failure) -> Result<(), RelayError> {
        self.observer.schema_registry_answered("refused", None);
        self.registering.answered();
        let Some(waiting) = self.registering.queue.pop_front() else {
            return self.release().await;
        };
        let raw = waiting.record.schemas.map(|p| p.raw).unwrap_or_default();
        let error = EventError::SchemaRefused {
            reason: failure.to_string(),
        };
        let failed = Failure::Unmapped(error, raw, waiting.commit_time_ms);
        self.failed(waiting.ticket, failed).await?;
        self.release().await
    }

    /// A record with an unknown schema id and no registry: a configuration error.
    fn registry_stop(&self, reason: String) -> RelayError {
        RelayError::SchemaRegistry {
            lsn: self.tx.commit_lsn,
            source: registry::Failure::Unavailable { reason },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use bytes::Bytes;

    use super::*;
    use crate::lsn::Lsn;
    use crate::outbox::RawParts;
    use crate::outbox::connect::registry::{Lookup, RegistrySchema, SchemaType};

    /// A registry answering from a script, counting the requests.
    struct Scripted(Mutex<Vec<Result<u32, registry::Failure>>>);

    impl SchemaRegistry for Scripted {
        fn resolve(&self, _: Pending) -> Resolving {
            let next = match self.0.lock() {
                Ok(mut script) => script.remove(0),
                Err(_) => Ok(0),
            };
            Box::pin(async move { next })
        }
    }

    fn pending(subject: &str) -> Pending {
        Pending {
            subject: subject.into(),
            schema: Arc::new(RegistrySchema::new(SchemaType::Avro, "\"string\"".into())),
            lookup: Lookup::Register,
        }
    }

    fn waiting(n: u64, value: Option<Pending>) -> Waiting {
        let mut body = crate::outbox::connect::registry::framed();
        body.push(n as u8);
        let schemas = value.map(|value| {
            Box::new(PendingSchemas {
                key: None,
                value: Some(value),
                raw: RawParts::default(),
            })
        });
        Waiting {
            ticket: Ticket(n),
            record: OutboxRecord {
                topic: "t".into(),
                key: None,
                payload: Some(Bytes::from(body)),
                id: Bytes::new(),
                headers: Vec::new(),
                id_header_at: Some(0),
                timestamp_ms: 0,
                partition: None,
                schemas,
            },
            table: Arc::from("public.outbox"),
            position: Position {
                lsn: Lsn(1),
                change: Lsn(1),
                index: 0,
            },
            commit_time_ms: 0,
        }
    }

    fn unavailable() -> Result<u32, registry::Failure> {
        Err(registry::Failure::Unavailable {
            reason: "down".into(),
        })
    }

    /// Records leave in their order, each once its ids are known; an unavailable registry
    /// is asked again after the backoff; a record without schemas waits behind the others.
    #[tokio::test(start_paused = true)]
    async fn records_wait_in_order_until_their_ids_are_known() {
        let ids = SchemaIds::default();
        let script = Scripted(Mutex::new(vec![unavailable(), Ok(7)]));
        let mut registering = Registering::new(ids.clone()).with_registry(Arc::new(script));
        let first = pending("t-value");
        assert!(!registering.holds(&waiting(0, None).record));
        registering.wait(waiting(0, Some(first.clone())));
        assert!(registering.holds(&waiting(1, None).record));
        registering.wait(waiting(1, None));
        assert!(registering.ready().is_none());
        assert_eq!(registering.start(), Ok(()));
        assert!(registering.active());

        let (asked, result) = registering.next().await;
        assert_eq!((asked.subject.as_ref(), result.is_err()), ("t-value", true));
        assert_eq!(registering.retry_later(), 1);
        let before = Instant::now();
        let (asked, result) = registering.next().await;
        assert!(Instant::now() >= before + MIN_BACKOFF);
        assert_eq!((asked, result), (first.clone(), Ok(7)));
        registering.answered();
        ids.insert(&first.subject, &first.schema, 7);

        let ready = registering.ready().map(|w| (w.ticket, w.record.payload));
        let expected = Some(Bytes::from_static(&[0, 0, 0, 0, 7, 0]));
        assert_eq!(ready, Some((Ticket(0), expected)));
        assert_eq!(registering.ready().map(|w| w.ticket), Some(Ticket(1)));
        assert!(registering.ready().is_none());
        assert_eq!(registering.len(), 0);
        assert!(!registering.active());
    }

    #[test]
    fn the_backoff_doubles_up_to_its_cap() {
        let mut registering = Registering::new(SchemaIds::default());
        let mut waits = Vec::new();
        for _ in 0..8 {
            waits.push(registering.backoff);
            registering.retry_later();
            registering.retry_at = None;
        }
        let ms: Vec<u128> = waits.iter().map(Duration::as_millis).collect();
        assert_eq!(ms, [200, 400, 800, 1600, 3200, 5000, 5000, 5000]);
        registering.answered();
        assert_eq!(registering.backoff, MIN_BACKOFF);
    }

    #[test]
    fn without_a_registry_a_record_lacking_an_id_is_a_clear_error() {
        let mut registering = Registering::new(SchemaIds::default());
        registering.wait(waiting(0, Some(pending("t-value"))));
        let err = registering.start().unwrap_err();
        assert!(err.contains("\"t-value\""), "{err}");
    }
}
