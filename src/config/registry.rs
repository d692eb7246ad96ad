//! The Schema Registry flags: where the registry is and how to reach it (the client's), and
//! the registry converters' settings that shape records (subject names, how ids are found,
//! `AvroData`'s options). `debezium-config` sets them from a converter's
//! `schema.registry.url`, `basic.auth.user.info`, `auto.register.schemas`, ... settings.

use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Args};
use secrecy::{ExposeSecret, SecretString};

use super::{ConfigError, invalid, parse_duration};
use crate::outbox::connect::avro;
use crate::outbox::connect::registry::{Lookup, RegistryFormat, RoleFormat, SubjectStrategy};

/// Schema Registry flags.
#[derive(Debug, Clone, Args)]
pub struct RegistryArgs {
    /// Schema Registry URL for the avro and protobuf converters (schema.registry.url); comma-separated URLs
    /// are tried in turn. USER:PASSWORD@ in a URL is its basic auth.
    #[arg(
        long,
        env = "OUTBOX_RELAY_SCHEMA_REGISTRY_URL",
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub schema_registry_url: Vec<SecretString>,
    /// USER:PASSWORD for the registry's HTTP basic auth (basic.auth.credentials.source=USER_INFO,
    /// basic.auth.user.info; Confluent Cloud's API key and secret). Prefer the env var.
    #[arg(
        long,
        env = "OUTBOX_RELAY_SCHEMA_REGISTRY_USER_INFO",
        hide_env_values = true
    )]
    pub schema_registry_user_info: Option<SecretString>,
    /// PEM file of the CA that signed an https registry's certificate (else the public roots).
    #[arg(long, env = "OUTBOX_RELAY_SCHEMA_REGISTRY_CA", value_name = "PATH")]
    pub schema_registry_ca: Option<PathBuf>,
    /// How long one registry request may take before it is retried.
    #[arg(long, env = "OUTBOX_RELAY_SCHEMA_REGISTRY_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub schema_registry_timeout: Duration,
    /// Register a schema the registry does not have (auto.register.schemas); false: use the id
    /// it has for the schema under its subject.
    #[arg(long, env = "OUTBOX_RELAY_SCHEMA_REGISTRY_AUTO_REGISTER", num_args = 0..=1, default_missing_value = "true", action = ArgAction::Set, default_value_t = true)]
    pub schema_registry_auto_register: bool,
    /// Without auto-registration, use the subject's latest schema (use.latest.version), which
    /// must be the relay's but for documentation and properties.
    #[arg(long, env = "OUTBOX_RELAY_SCHEMA_REGISTRY_USE_LATEST_VERSION", num_args = 0..=1, default_missing_value = "true", action = ArgAction::Set, default_value_t = false)]
    pub schema_registry_use_latest_version: bool,
    /// Subject of a key schema (key.subject.name.strategy): topic (TOPIC-key), record, or
    /// topic-record (TOPIC-RECORD).
    #[arg(
        long,
        env = "OUTBOX_RELAY_KEY_SUBJECT_NAME_STRATEGY",
        value_enum,
        default_value_t
    )]
    pub key_subject_name_strategy: SubjectStrategy,
    /// Subject of a value schema (value.subject.name.strategy), likewise.
    #[arg(
        long,
        env = "OUTBOX_RELAY_VALUE_SUBJECT_NAME_STRATEGY",
        value_enum,
        default_value_t
    )]
    pub value_subject_name_strategy: SubjectStrategy,
    /// Write Connect's metadata into Avro schemas as connect.* properties (connect.meta.data).
    #[arg(long, env = "OUTBOX_RELAY_AVRO_CONNECT_META_DATA", num_args = 0..=1, default_missing_value = "true", action = ArgAction::Set, default_value_t = true)]
    pub avro_connect_meta_data: bool,
    /// Make names Avro refuses valid instead of stopping on them (scrub.invalid.names).
    #[arg(long, env = "OUTBOX_RELAY_AVRO_SCRUB_INVALID_NAMES", num_args = 0..=1, default_missing_value = "true", action = ArgAction::Set, default_value_t = false)]
    pub avro_scrub_invalid_names: bool,
}

/// Where the Schema Registry is and how to reach it.
#[derive(Clone, Debug)]
pub struct SchemaRegistryConfig {
    /// The registry's URLs, tried in turn; never shown whole (they may hold a password).
    pub urls: Vec<url::Url>,
    /// `USER:PASSWORD` for basic auth, overriding a URL's.
    pub user_info: Option<SecretString>,
    /// A PEM CA for https.
    pub ca: Option<PathBuf>,
    /// One request's timeout.
    pub timeout: Duration,
}

impl SchemaRegistryConfig {
    /// The URLs as they may be shown: without user info.
    pub fn shown_urls(&self) -> String {
        let shown = self.urls.iter().map(|url| {
            let mut url = url.clone();
            // Only a URL that cannot have them refuses these.
            let _ = url.set_username("");
            let _ = url.set_password(None);
            url.to_string()
        });
        shown.collect::<Vec<_>>().join(",")
    }
}

impl RegistryArgs {
    /// The converters' settings that shape records.
    pub fn format(&self) -> RegistryFormat {
        let lookup = match (
            self.schema_registry_auto_register,
            self.schema_registry_use_latest_version,
        ) {
            (true, _) => Lookup::Register,
            (false, true) => Lookup::Latest,
            (false, false) => Lookup::Existing,
        };
        let avro = avro::Options {
            connect_meta_data: self.avro_connect_meta_data,
            scrub_invalid_names: self.avro_scrub_invalid_names,
        };
        let role = |subjects| RoleFormat {
            subjects,
            lookup,
            avro,
        };
        RegistryFormat {
            key: role(self.key_subject_name_strategy),
            value: role(self.value_subject_name_strategy),
            ids: Default::default(),
        }
    }

    /// The registry client's settings: `None` without a URL. `needed`: a converter writes
    /// through the registry, so a URL is required.
    pub fn client(&self, needed: bool) -> Result<Option<SchemaRegistryConfig>, ConfigError> {
        let flag = "--schema-registry-url";
        if self.schema_registry_url.is_empty() {
            if needed {
                let reason = "required with an avro or protobuf converter: the registry that holds its schemas (schema.registry.url)";
                return Err(invalid(flag, "", reason));
            }
            return Ok(None);
        }
        if !needed {
            let reason =
                "used only by an avro or protobuf key or value converter (--key-converter avro)";
            return Err(invalid(flag, "", reason));
        }
        let mut urls = Vec::new();
        for raw in &self.schema_registry_url {
            let raw = raw.expose_secret().trim();
            let bad = |reason: &str| invalid(flag, "(not shown: it may hold a password)", reason);
            let url = url::Url::parse(raw).map_err(|e| bad(&format!("not a URL: {e}")))?;
            if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
                return Err(bad("expected http://HOST:PORT or https://HOST:PORT"));
            }
            urls.push(url);
        }
        if let Some(info) = &self.schema_registry_user_info
            && !info.expose_secret().contains(':')
        {
            let reason = "expected USER:PASSWORD (for Confluent Cloud, API_KEY:API_SECRET)";
            return Err(invalid("--schema-registry-user-info", "***", reason));
        }
        Ok(Some(SchemaRegistryConfig {
            urls,
            user_info: self.schema_registry_user_info.clone(),
            ca: self.schema_registry_ca.clone(),
            timeout: self.schema_registry_timeout,
        }))
    }
}
