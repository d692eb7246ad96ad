//! Why the relay stops, and the process exit code for each class of failure.

use super::ack::AckError;
use crate::lsn::Lsn;
use crate::outbox::{BindError, DeadLetterInfo};
use crate::pgoutput::DecodeError;
use crate::postgres::PostgresError;
use crate::sink::exactly_once::TailError;
use crate::sink::{Refusal, SinkError};
use crate::source::SourceError;
use crate::source::deleter::DeleteFailure;
use crate::startup::{Refused, StartupError};

/// Process exit codes, one per failure class (docs/operations.md's Exit codes table).
pub mod exit_code {
    /// A flag, the environment or the producer configuration is invalid.
    pub const CONFIG: u8 = 2;
    /// Postgres refused in a way a retry will not fix.
    pub const POSTGRES: u8 = 3;
    /// Kafka failed permanently.
    pub const KAFKA: u8 = 4;
    /// An event cannot be delivered under `--on-poison fail`, or no longer fits the mapping.
    pub const POISON: u8 = 5;
    /// The dead-letter topic refused a dead-letter record: retrying would loop.
    pub const DEAD_LETTER: u8 = 6;
    /// The slot is missing where this relay streamed before: events may have been skipped.
    pub const SLOT_LOST: u8 = 7;
    /// The replication stream broke protocol rules (a bug: please report).
    pub const INTERNAL: u8 = 70;

    /// Start-up's failure: a refusal is Postgres's (a lost slot has its own), a failed read
    /// or write of the lineage topic Kafka's.
    pub fn startup(error: &super::StartupError) -> u8 {
        use super::{Refused, StartupError as E};
        match error {
            E::Refused(Refused::SlotLost { .. }) => SLOT_LOST,
            E::Refused(Refused::Misconfigured(_)) => POSTGRES,
            E::Postgres(e) => postgres(e),
            E::Lineage(_) | E::Refused(Refused::Lineage(_)) => KAFKA,
        }
    }

    /// A failed connection or query: TLS settings, a refused replication connection and a
    /// refused login (SQLSTATE class 28) are configuration; the rest is Postgres.
    pub fn postgres(error: &super::PostgresError) -> u8 {
        use super::PostgresError as E;
        match error {
            E::Tls(_)
            | E::TlsHandshake { .. }
            | E::ReplicationConnect { .. }
            | E::Credentials(_)
            | E::IamRefused { .. } => CONFIG,
            E::Connect { .. } if error.sqlstate_class("28") => CONFIG,
            _ => POSTGRES,
        }
    }
}

/// Why the relay stopped. Events are named by commit LSN, id and topic.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// Postgres side.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// Start-up did not get the relay to its slot.
    #[error(transparent)]
    Startup(#[from] StartupError),
    /// The slot was dropped while the relay was using it.
    #[error(
        "replication slot {slot:?} is missing on the server the relay (re)connected to: it was \
         dropped, or this server was promoted from a standby that did not have it (PostgreSQL 16 \
         or older, or a slot not synchronized with --slot-failover). The last acknowledged \
         position was {frontier}; events committed after it on the old server and before the \
         promotion were never relayed. {}",
        crate::remedy::LOST_SLOT
    )]
    SlotDropped {
        /// The slot (`--slot`).
        slot: String,
        /// The last position the relay confirmed.
        frontier: Lsn,
    },
    /// librdkafka refused a record at enqueue time, not for the record's fault.
    #[error(
        "Kafka refused an event (commit LSN {lsn}, table {table}); the slot was not moved past \
         it. Check the -X producer properties and the brokers, then restart: the relay resumes \
         from the last acknowledged transaction"
    )]
    Sink {
        /// Commit LSN of the event's transaction.
        lsn: Lsn,
        /// The outbox table, as `schema.name`.
        table: String,
        /// What the producer said.
        #[source]
        source: SinkError,
    },
    /// The producer could not be created.
    #[error(transparent)]
    Producer(SinkError),
    /// The AWS identity has no credentials or region at start-up, or the brokers refused
    /// its MSK IAM token.
    #[error(transparent)]
    Cloud(#[from] crate::cloud::CloudError),
    /// The broker did not accept an event, not for the event's fault.
    #[error(
        "delivery of event id {id} (commit LSN {lsn}) to topic {topic:?} failed; the slot was \
         not moved past it. Fix the cause (brokers, ACLs, topic creation) and restart: the \
         relay resumes from the last acknowledged transaction"
    )]
    Delivery {
        /// Commit LSN of the event's transaction.
        lsn: Lsn,
        /// The event's id.
        id: String,
        /// The topic it was routed to.
        topic: String,
        /// The final delivery error.
        #[source]
        error: Refusal,
    },
    /// The outbox table's columns no longer fit the mapping.
    #[error(
        "the outbox table no longer fits the mapping at commit LSN {lsn}; nothing at or after \
         this transaction was acknowledged"
    )]
    Bind {
        /// Commit LSN of the transaction whose row did not fit.
        lsn: Lsn,
        /// Which column or type no longer fits.
        #[source]
        source: BindError,
    },
    /// An event that can never be delivered, under `--on-poison fail`.
    #[error(
        "event id {id:?} from {} (commit LSN {}, topic {:?}) cannot be delivered: {}. The slot \
         was not moved past it, and a restart replays it: fix the cause (the mapping flags, the \
         producer's message.max.bytes, the topic), or divert such events with --on-poison \
         dead-letter --dead-letter-topic TOPIC; as a last resort, with the relay stopped, \
         advance the slot past this transaction with pg_replication_slot_advance (its events \
         are then lost)",
        .info.table, .info.lsn, .info.intended_topic.as_deref().unwrap_or(""), .info.error
    )]
    Poison {
        /// Empty when NULL.
        id: String,
        /// Where the event came from and why it failed.
        info: DeadLetterInfo,
    },
    /// The dead-letter topic refused a dead-letter record for a reason about the record.
    #[error(
        "the dead-letter record for event id {id:?} (commit LSN {lsn}) was refused by topic \
         {topic:?}. It is not dead-lettered again (that would loop), and the slot was not moved \
         past it: fix the dead-letter topic (its max.message.bytes, its policy) or the \
         producer's -X properties, then restart"
    )]
    DeadLetter {
        /// Commit LSN of the event's transaction.
        lsn: Lsn,
        /// The event's id.
        id: String,
        /// The dead-letter topic.
        topic: String,
        /// What the dead-letter topic said.
        #[source]
        error: Refusal,
    },
    /// Exactly-once delivery cannot be guaranteed.
    #[error(
        "exactly-once delivery cannot be guaranteed at commit LSN {lsn}; nothing past it was \
         acknowledged. Fix the topic, or restart with --exactly-once-fallback at-least-once to \
         accept possible duplicates"
    )]
    ExactlyOnce {
        /// Commit LSN of the first transaction that cannot be deduplicated.
        lsn: Lsn,
        /// Which partition, and why.
        #[source]
        source: TailError,
    },
    /// A WAL message did not decode.
    #[error("cannot decode the pgoutput message at WAL {lsn}")]
    Decode {
        /// WAL position of the message.
        lsn: Lsn,
        /// What was malformed.
        #[source]
        source: DecodeError,
    },
    /// `--cleanup delete` failed in a way retrying cannot fix.
    #[error(
        "--cleanup delete cannot delete relayed rows, and retrying will not help. Fix the \
         cause given at the end of this message (GRANT DELETE on the table to the relay's role; \
         a trigger, rule or foreign key refusing the delete), then restart; or restart with \
         --cleanup none and delete relayed rows yourself. The slot was not moved past the rows \
         (it stays at {frontier}), so after a restart their events are sent again and the rows \
         deleted"
    )]
    Cleanup {
        /// The position reported to Postgres.
        frontier: Lsn,
        /// Which table, and what Postgres said.
        #[source]
        source: DeleteFailure,
    },
    /// The Schema Registry refused the relay (401, 403), or there is none to ask.
    #[error(
        "the Schema Registry stopped the relay at commit LSN {lsn}; nothing at or after it was \
         acknowledged. Fix the registry settings (--schema-registry-url, \
         --schema-registry-user-info) and restart"
    )]
    SchemaRegistry {
        /// Commit LSN of the first event waiting for a schema id.
        lsn: Lsn,
        /// What the registry said.
        #[source]
        source: crate::sink::registry::Failure,
    },
    /// The Schema Registry client cannot be set up.
    #[error(transparent)]
    RegistrySetup(#[from] crate::sink::registry::SetupError),
    /// The stream violated transaction framing.
    #[error("replication stream out of order")]
    Protocol(#[from] AckError),
    /// The relay's publication sent an insert into a table it cannot map.
    #[error(
        "publication {publication:?} sent an insert into {table} (commit LSN {lsn}), which is \
         neither an outbox table (--table) nor a partition of one; nothing at or after this \
         transaction was acknowledged. Add the table with --table, or remove it with ALTER \
         PUBLICATION {publication} DROP TABLE {table};"
    )]
    UnmappedRelation {
        /// Commit LSN of the transaction holding the insert.
        lsn: Lsn,
        /// The relay's publication (`--publication`).
        publication: String,
        /// As `schema.name`.
        table: String,
    },
}

impl RelayError {
    /// This failure as the refusal it comes from: a lineage read or write at start-up that
    /// failed because the brokers refused the MSK IAM token is that configuration problem,
    /// not a Kafka outage.
    pub fn blaming(self, auth: &crate::cloud::KafkaAuth) -> RelayError {
        match (&self, auth.refusal()) {
            (RelayError::Startup(StartupError::Lineage(_)), Some(reason)) => {
                RelayError::Cloud(crate::cloud::CloudError::KafkaRefused { reason })
            }
            _ => self,
        }
    }

    /// The process exit code for this failure.
    pub fn exit_code(&self) -> u8 {
        use RelayError as E;
        match self {
            E::Producer(_)
            | E::Cloud(_)
            | E::SchemaRegistry { .. }
            | E::RegistrySetup(_)
            | E::UnmappedRelation { .. } => exit_code::CONFIG,
            E::Source(SourceError::Postgres(e)) => exit_code::postgres(e),
            E::Startup(e) => exit_code::startup(e),
            E::SlotDropped { .. } => exit_code::SLOT_LOST,
            E::Source(_) | E::Decode { .. } | E::Cleanup { .. } => exit_code::POSTGRES,
            E::Sink { .. } | E::Delivery { .. } | E::ExactlyOnce { .. } => exit_code::KAFKA,
            E::Bind { .. } | E::Poison { .. } => exit_code::POISON,
            E::DeadLetter { .. } => exit_code::DEAD_LETTER,
            E::Protocol(_) => exit_code::INTERNAL,
        }
    }
}
