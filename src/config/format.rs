//! The flags that make records as Debezium's Outbox Event Router and Kafka Connect's converters
//! did (`debezium-config` sets them from a connector config); without them the relay's own
//! format is used, unchanged.

use clap::{ArgAction, Args, ValueEnum};

use super::{ConfigError, columns, invalid};
use crate::outbox::connect::columns::{
    BinaryHandling, ColumnModes, DecimalHandling, SourceTypes, TimePrecision,
};
use crate::outbox::connect::transforms::Chain;
use crate::outbox::connect::{
    ConnectConfig, Converter, DecimalFormat, Delegates, HeaderConverter, SchemaCache,
};

/// Debezium record-format flags.
#[derive(Debug, Clone, Args)]
pub struct FormatArgs {
    /// Record keys as this Kafka Connect converter wrote them (Debezium: key.converter).
    #[arg(long, env = "OUTBOX_RELAY_KEY_CONVERTER", value_enum, default_value_t)]
    pub key_converter: Converter,
    /// Record values as this Kafka Connect converter wrote them (Debezium: value.converter).
    #[arg(
        long,
        env = "OUTBOX_RELAY_VALUE_CONVERTER",
        value_enum,
        default_value_t
    )]
    pub value_converter: Converter,
    /// The converter a binary-data key converter hands anything but bytea to (Debezium:
    /// key.converter.delegate.converter.type).
    #[arg(long, env = "OUTBOX_RELAY_KEY_DELEGATE_CONVERTER", value_enum)]
    pub key_delegate_converter: Option<Converter>,
    /// The converter a binary-data value converter hands anything but bytea to (Debezium:
    /// value.converter.delegate.converter.type).
    #[arg(long, env = "OUTBOX_RELAY_VALUE_DELEGATE_CONVERTER", value_enum)]
    pub value_delegate_converter: Option<Converter>,
    /// Header values as this Kafka Connect converter wrote them (Debezium: header.converter).
    #[arg(
        long,
        env = "OUTBOX_RELAY_HEADER_CONVERTER",
        value_enum,
        default_value_t
    )]
    pub header_converter: HeaderConverter,
    /// JsonConverter keys' decimal.format (key.converter.decimal.format).
    #[arg(
        long,
        env = "OUTBOX_RELAY_KEY_CONVERTER_DECIMAL_FORMAT",
        value_enum,
        default_value_t
    )]
    pub key_converter_decimal_format: DecimalFormat,
    /// JsonConverter values' decimal.format (value.converter.decimal.format).
    #[arg(
        long,
        env = "OUTBOX_RELAY_VALUE_CONVERTER_DECIMAL_FORMAT",
        value_enum,
        default_value_t
    )]
    pub value_converter_decimal_format: DecimalFormat,
    /// JsonConverter headers' decimal.format (header.converter.decimal.format).
    #[arg(
        long,
        env = "OUTBOX_RELAY_HEADER_CONVERTER_DECIMAL_FORMAT",
        value_enum,
        default_value_t
    )]
    pub header_converter_decimal_format: DecimalFormat,
    /// How date, time and timestamp columns are written (Debezium: time.precision.mode).
    #[arg(
        long,
        env = "OUTBOX_RELAY_TIME_PRECISION_MODE",
        value_enum,
        default_value_t
    )]
    pub time_precision_mode: TimePrecision,
    /// How numeric columns are written (Debezium: decimal.handling.mode).
    #[arg(
        long,
        env = "OUTBOX_RELAY_DECIMAL_HANDLING_MODE",
        value_enum,
        default_value_t
    )]
    pub decimal_handling_mode: DecimalHandling,
    /// How bytea columns are written (Debezium: binary.handling.mode).
    #[arg(
        long,
        env = "OUTBOX_RELAY_BINARY_HANDLING_MODE",
        value_enum,
        default_value_t
    )]
    pub binary_handling_mode: BinaryHandling,
    /// Regular expressions (comma-separated) of schema.table.column names whose schemas carry
    /// their source type (Debezium: column.propagate.source.type).
    #[arg(long, env = "OUTBOX_RELAY_COLUMN_PROPAGATE_SOURCE_TYPE")]
    pub column_propagate_source_type: Option<String>,
    /// Regular expressions (comma-separated) of schema.table.type names whose columns' schemas
    /// carry their source type (Debezium: datatype.propagate.source.type).
    #[arg(long, env = "OUTBOX_RELAY_DATATYPE_PROPAGATE_SOURCE_TYPE")]
    pub datatype_propagate_source_type: Option<String>,
    /// A Kafka Connect transform setting after the Outbox Event Router, KEY=VALUE with Connect's
    /// keys: transforms=NAME,..., transforms.NAME.type=..., transforms.NAME.OPTION=...,
    /// predicates=..., predicates.NAME.*. Repeatable (one per line in the variable).
    #[arg(
        long = "transform",
        env = "OUTBOX_RELAY_TRANSFORM",
        value_name = "KEY=VALUE",
        value_delimiter = '\n'
    )]
    pub transforms: Vec<String>,
    /// Debezium's topic.prefix: the context headers' logical name and envelope schema names.
    #[arg(long, env = "OUTBOX_RELAY_DEBEZIUM_TOPIC_PREFIX")]
    pub debezium_topic_prefix: Option<String>,
    /// Add Debezium's __debezium.context.* headers (extended.headers.enabled) before `id`.
    #[arg(long, env = "OUTBOX_RELAY_DEBEZIUM_CONTEXT_HEADERS", num_args = 0..=1, default_missing_value = "true", action = ArgAction::Set, default_value_t = false)]
    pub debezium_context_headers: bool,
    /// Send JSON payload text as a JSON document (Debezium: table.expand.json.payload).
    #[arg(long, env = "OUTBOX_RELAY_EXPAND_JSON_PAYLOAD", num_args = 0..=1, default_missing_value = "true", action = ArgAction::Set, default_value_t = false)]
    pub expand_json_payload: bool,
    /// Keep JSON nulls when expanding (table.json.payload.null.behavior=optional_bytes).
    #[arg(long, env = "OUTBOX_RELAY_KEEP_JSON_PAYLOAD_NULLS", num_args = 0..=1, default_missing_value = "true", action = ArgAction::Set, default_value_t = false)]
    pub keep_json_payload_nulls: bool,
    /// Column added to the value's envelope, as COLUMN or COLUMN:FIELD (placement envelope).
    #[arg(
        long = "envelope-column",
        env = "OUTBOX_RELAY_ENVELOPE_COLUMN",
        value_delimiter = ','
    )]
    pub envelope_columns: Vec<String>,
    /// integer column whose value is the record's partition (placement partition).
    #[arg(long, env = "OUTBOX_RELAY_PARTITION_COLUMN")]
    pub partition_column: Option<String>,
    /// integer column whose value versions the envelope schema (table.field.event.schema.version).
    #[arg(long, env = "OUTBOX_RELAY_SCHEMA_VERSION_COLUMN")]
    pub schema_version_column: Option<String>,
    /// Send a tombstone for a NULL, empty or blank payload (route.tombstone.on.empty.payload).
    #[arg(long, env = "OUTBOX_RELAY_TOMBSTONE_ON_EMPTY_PAYLOAD", num_args = 0..=1, default_missing_value = "true", action = ArgAction::Set, default_value_t = false)]
    pub tombstone_on_empty_payload: bool,
    /// Column with a serialized OpenTelemetry context: write `traceparent` as Debezium's
    /// tracing did (tracing.span.context.field, with an OpenTelemetry agent in Connect).
    #[arg(long, env = "OUTBOX_RELAY_TRACE_CONTEXT_COLUMN")]
    pub trace_context_column: Option<String>,
}

impl FormatArgs {
    /// The delegates of binary-data converters, refused where there is none to delegate for.
    fn delegates(&self) -> Result<Delegates, ConfigError> {
        for (flag, converter, delegate) in [
            (
                "--key-delegate-converter",
                self.key_converter,
                self.key_delegate_converter,
            ),
            (
                "--value-delegate-converter",
                self.value_converter,
                self.value_delegate_converter,
            ),
        ] {
            let Some(delegate) = delegate else { continue };
            let value = delegate
                .to_possible_value()
                .map(|v| v.get_name().to_owned());
            let value = value.unwrap_or_default();
            if converter != Converter::BinaryData {
                let reason = "only a binary-data converter has a delegate";
                return Err(invalid(flag, value, reason));
            }
            if !delegate.delegates() {
                let reason = "a delegate writes what BinaryDataConverter does not: use string, bytearray, json or json-with-schemas";
                return Err(invalid(flag, value, reason));
            }
        }
        Ok(Delegates {
            key: self.key_delegate_converter,
            value: self.value_delegate_converter,
        })
    }

    /// The Debezium format, or `None` when no flag asks for it.
    pub fn connect(&self, message_prefixes: bool) -> Result<Option<ConnectConfig>, ConfigError> {
        let relay = self.value_converter == Converter::Relay;
        let envelope = !self.envelope_columns.is_empty();
        self.check_value_flags(relay)?;
        let transforms = self.chain()?;
        let others = self.debezium_context_headers
            || self.partition_column.is_some()
            || self.trace_context_column.is_some()
            || self.header_converter != HeaderConverter::Simple
            || !transforms.is_empty();
        let modes = self.column_modes()?;
        if relay && self.key_converter == Converter::Relay && !others {
            if let Some(flag) = self.column_flag_given(&modes) {
                let reason =
                    "shapes Debezium's records: give --key-converter or --value-converter too";
                return Err(invalid(flag, "", reason));
            }
            return Ok(None);
        }
        if message_prefixes {
            let reason = "Debezium's record format applies to outbox tables only; relay messages with another relay";
            return Err(invalid("--message-prefix", "", reason));
        }
        let prefix = self.debezium_topic_prefix.as_deref().map_or("", str::trim);
        if prefix.is_empty() && (self.debezium_context_headers || envelope) {
            let reason = "required with --debezium-context-headers and --envelope-column (Debezium's topic.prefix)";
            return Err(invalid("--debezium-topic-prefix", "", reason));
        }
        let run_id = uuid::Uuid::now_v7().to_string();
        Ok(Some(ConnectConfig {
            key: self.key_converter,
            value: self.value_converter,
            delegates: self.delegates()?,
            header: self.header_converter,
            key_decimal_format: self.key_converter_decimal_format,
            value_decimal_format: self.value_converter_decimal_format,
            header_decimal_format: self.header_converter_decimal_format,
            columns: modes,
            topic_prefix: prefix.to_owned(),
            context_headers: self.debezium_context_headers.then(|| run_id.into()),
            expand_json_payload: self.expand_json_payload,
            json_nulls_as_bytes: self.keep_json_payload_nulls,
            envelope: columns("--envelope-column", &self.envelope_columns)?,
            partition_column: self.partition_column.clone(),
            schema_version_column: self.schema_version_column.clone(),
            tombstone_on_empty: self.tombstone_on_empty_payload,
            trace_column: self.trace_context_column.clone(),
            transforms,
            registry: Default::default(),
            schema_cache: SchemaCache::default(),
        }))
    }

    /// Refuses a flag that shapes Debezium's values without a value converter (`relay`), or
    /// `--keep-json-payload-nulls` without expansion.
    fn check_value_flags(&self, relay: bool) -> Result<(), ConfigError> {
        let value_only = [
            ("--expand-json-payload", self.expand_json_payload),
            (
                "--tombstone-on-empty-payload",
                self.tombstone_on_empty_payload,
            ),
            ("--envelope-column", !self.envelope_columns.is_empty()),
            (
                "--schema-version-column",
                self.schema_version_column.is_some(),
            ),
            ("--keep-json-payload-nulls", self.keep_json_payload_nulls),
        ];
        if self.keep_json_payload_nulls && !self.expand_json_payload {
            let reason = "applies to expanded payloads: give --expand-json-payload too";
            return Err(invalid("--keep-json-payload-nulls", "", reason));
        }
        if let Some((flag, _)) = value_only.iter().find(|(_, set)| *set && relay) {
            let reason = "shapes Debezium's record values: give --value-converter too";
            return Err(invalid(flag, "", reason));
        }
        Ok(())
    }

    /// The transforms after the router; they need Kafka Connect's key and value converters.
    fn chain(&self) -> Result<Chain, ConfigError> {
        let mut settings = Vec::new();
        for setting in self.transforms.iter().filter(|s| !s.trim().is_empty()) {
            let Some((key, value)) = setting.split_once('=') else {
                let reason = "expected KEY=VALUE with Kafka Connect's keys, e.g. transforms.h.type=InsertHeader";
                return Err(invalid("--transform", setting, reason));
            };
            settings.push((key.trim().to_owned(), value.to_owned()));
        }
        let chain = Chain::parse(&settings)
            .map_err(|e| invalid("--transform", format!("{}={}", e.key, e.value), &e.reason))?;
        let relay = [self.key_converter, self.value_converter].contains(&Converter::Relay);
        if !chain.is_empty() && relay {
            let reason = "transforms work on Kafka Connect records: give --key-converter and --value-converter too";
            return Err(invalid("--transform", "", reason));
        }
        Ok(chain)
    }

    /// The column modes the flags give.
    fn column_modes(&self) -> Result<ColumnModes, ConfigError> {
        let columns = self.column_propagate_source_type.as_deref();
        let datatypes = self.datatype_propagate_source_type.as_deref();
        let source_types = SourceTypes::parse(columns, datatypes).map_err(|reason| {
            let flag = "--column-propagate-source-type/--datatype-propagate-source-type";
            invalid(flag, "", &reason)
        })?;
        Ok(ColumnModes {
            time: self.time_precision_mode,
            decimal: self.decimal_handling_mode,
            binary: self.binary_handling_mode,
            source_types,
        })
    }

    /// A column or decimal flag given without Debezium's format, which it would not apply to.
    fn column_flag_given(&self, modes: &ColumnModes) -> Option<&'static str> {
        let defaults = ColumnModes::default();
        let decimal = DecimalFormat::Base64;
        [
            ("--time-precision-mode", modes.time != defaults.time),
            ("--decimal-handling-mode", modes.decimal != defaults.decimal),
            ("--binary-handling-mode", modes.binary != defaults.binary),
            (
                "--column-propagate-source-type",
                !modes.source_types.is_empty(),
            ),
            (
                "--key-converter-decimal-format",
                self.key_converter_decimal_format != decimal,
            ),
            (
                "--value-converter-decimal-format",
                self.value_converter_decimal_format != decimal,
            ),
            (
                "--header-converter-decimal-format",
                self.header_converter_decimal_format != decimal,
            ),
        ]
        .into_iter()
        .find_map(|(flag, given)| given.then_some(flag))
    }
}
