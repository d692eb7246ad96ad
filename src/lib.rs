//! outbox-relay: the transactional outbox pattern without Kafka Connect.
//!
//! Services write a business row and an outbox row in one Postgres transaction. The relay tails
//! the WAL through a logical replication slot (pgoutput), turns each committed outbox insert into
//! one Kafka record routed by its event type, and moves the slot only past what the broker has
//! acknowledged.
//!
//! # Data flow
//! ```text
//!             commands::relay  (startup::start, then the real source and sink, then the pipeline)
//!                   │
//! Postgres ──pgoutput──▶ source::PgSource / Stream ──SourceEvent───────▶ pipeline::Pipeline
//!    ▲   (pgwire-replication; publication checks,         │  pgoutput::decode (pure)
//!    │    slot monitor, cleanup's deletes)                │  outbox::EventMapper (pure):
//!    │                                                    │    row / message → OutboxRecord
//!    │ Stream::ack(frontier)                              ▼
//!    └──────────── pipeline::ack::AckTracker ◀── Delivery ── sink::KafkaSink (librdkafka;
//!                  (pure ledger: commit order,               exactly_once: tails, dedupe)
//!                   in-flight caps, frontier)  ──send(Ticket, record)──▶
//! ```
//! The pipeline reaches Postgres and Kafka only through the [`source::Source`],
//! [`sink::Sink`] and [`sink::exactly_once::ReadBack`] traits, in the relay's own
//! types (a [`source::SourceEvent`], a [`sink::Refusal`]), so its unit tests and
//! the `simulation` test run the real pipeline against in-memory worlds. Observability reads the
//! tracker's ledger; `Health` is created by the command and passed in.
//!
//! # Where things are
//! - [`pgoutput`]: the pure decoder (bytes → messages).
//! - [`outbox`]: the pure mapping (row or message → topic, key, headers, payload).
//! - [`pipeline::ack`]: the ack tracker, the one in-flight ledger.
//! - [`pipeline`]: the loop that joins them, over the traits; its decisions are pure.
//! - [`startup`]: the one start-up sequence: gather the facts (read-only), check them with
//!   pure rules, then apply the steps (publication, slot, lineage); nothing is written before
//!   every refusal has been decided.
//! - [`postgres`]: opening Postgres connections, the catalog queries, the statements.
//! - [`source`]: Postgres I/O at run time (replication sessions, the slot monitor, cleanup's
//!   deletes).
//! - [`sink`]: Kafka I/O (producer, delivery results, exactly-once tails, the lineage topic).
//! - [`config`], [`observability`], [`commands`]: flags, what operators see, subcommands.
//! - [`remedy`]: the way back from the failures that need an operator (lost or invalidated
//!   slot, changed publication), said the same everywhere.
//!
//! # The ack invariant
//! Only the *ack frontier* is ever reported to Postgres as flushed: the end LSN of the longest
//! prefix of committed transactions whose every event the broker has acknowledged. A crash
//! therefore replays from before every unacknowledged event: delivery is at-least-once, and
//! consumers deduplicate on the `id` header.

#![warn(missing_docs)]

pub mod cloud;
pub mod commands;
pub mod config;
pub mod lsn;
pub mod observability;
pub mod outbox;
pub mod pgoutput;
pub mod pipeline;
pub mod postgres;
pub mod remedy;
pub mod sink;
pub mod source;
pub mod startup;
