//! outbox-relay: the transactional outbox pattern without Kafka Connect.
//!
//! Services write a business row and an outbox row in one Postgres
//! transaction. The relay tails the WAL through a logical replication slot
//! (pgoutput), turns each committed outbox insert into one Kafka record routed
//! by its event type, and moves the slot only past what the broker has
//! acknowledged.
//!
//! # Data flow
//! ```text
//! Postgres walsender ──pgoutput──▶ source (pgwire-replication)
//!        ▲                              │ raw messages
//!        │ flushed = ack frontier       ▼
//!        │                        pgoutput::decode (pure)
//!        │                              │ Relation / Insert / ...
//!        │                              ▼
//!   pipeline ◀── delivery reports ── outbox::TableMapping (pure) ──▶ sink (librdkafka)
//!   (AckTracker, pure)
//! ```
//!
//! # The ack invariant
//! Only the *ack frontier* is ever reported to Postgres as flushed: the end
//! LSN of the longest prefix of committed transactions whose every event the
//! broker has acknowledged. A crash at any point therefore replays from a
//! position before every unacknowledged event: delivery is at-least-once, and
//! consumers deduplicate on the `id` header.

pub mod commands;
pub mod config;
pub mod lsn;
pub mod observability;
pub mod outbox;
pub mod pgoutput;
pub mod pipeline;
pub mod sink;
pub mod source;
