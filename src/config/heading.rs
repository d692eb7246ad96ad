//! `--help`'s groups of flags, as docs/configuration.md groups them (a test,
//! `docs::the_help_groups_the_flags_as_the_configuration_reference_does`, keeps the two in
//! step). A flag names its group with `help_heading`, a flattened struct with
//! `next_help_heading`.

/// Postgres, Kafka's address, the tables, the slot and the publication.
pub const SOURCE: &str = "Connections and source";
/// The mapping flags a `--table` may also set for its own table (the key is the flag's
/// name without its dashes).
pub const PER_TABLE: &str = "Mapping, also per table";
/// The mapping flags that apply to every table alike.
pub const EVERY_TABLE: &str = "Mapping, every table";
/// Debezium's record format.
pub const DEBEZIUM_FORMAT: &str = "Debezium's record format";
/// The Schema Registry of the avro and protobuf converters.
pub const SCHEMA_REGISTRY: &str = "Schema Registry";
/// The producer, delivery and poison events.
pub const KAFKA: &str = "Kafka and delivery";
/// AWS IAM.
pub const CLOUD: &str = "Cloud identities";
/// Metrics, health, logs.
pub const OBSERVABILITY: &str = "Observability";
