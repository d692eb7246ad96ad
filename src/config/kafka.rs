//! The `-X` librdkafka properties: as given, then validated, with their secret values never
//! printed.

use std::fmt;

use super::{ConfigError, invalid};

/// Whether a librdkafka property may hold a secret (`sasl.*`, `*.password`, `ssl.key.*`,
/// tokens...), misspelt keys included: its value is never printed.
pub fn is_sensitive_property(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    let words = "sasl password secret key jaas token credential";
    words.split(' ').any(|word| key.contains(word))
}

/// `value`, or `***` when `key` may hold a secret.
fn redacted<'a>(key: &str, value: &'a str) -> &'a str {
    let secret = is_sensitive_property(key);
    if secret { "***" } else { value }
}

/// One raw `-X KEY=VALUE`; `Debug` hides the value of a key that may hold a secret.
#[derive(Clone)]
pub struct KafkaProperty(String);

impl KafkaProperty {
    /// The key and value. The error never quotes the text: without '=', it may be a secret cut
    /// at a ';' (the delimiter).
    pub(super) fn pair(&self) -> Result<(String, String), ConfigError> {
        let reason = "expected KEY=VALUE, e.g. -X compression.type=zstd (values are split at ';')";
        let pair = self.0.split_once('=').filter(|(k, _)| !k.trim().is_empty());
        let (key, value) = pair.ok_or_else(|| invalid("--kafka-property", "", reason))?;
        Ok((key.trim().to_owned(), value.to_owned()))
    }
}

impl From<String> for KafkaProperty {
    fn from(s: String) -> Self {
        KafkaProperty(s)
    }
}

impl fmt::Debug for KafkaProperty {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.split_once('=') {
            Some((key, value)) => write!(f, "{key}={:?}", redacted(key, value)),
            None => write!(f, "{:?}", redacted(&self.0, &self.0)),
        }
    }
}

/// The validated `-X` properties, in order; `Debug` hides sensitive values.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct KafkaProperties(pub Vec<(String, String)>);

impl std::ops::Deref for KafkaProperties {
    type Target = [(String, String)];

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl fmt::Debug for KafkaProperties {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = self.0.iter().map(|(k, v)| (k, redacted(k, v)));
        f.debug_map().entries(shown).finish()
    }
}
