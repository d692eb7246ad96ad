//! What the operator sees of a running relay: [`metrics`], [`health`]
//! (readiness), [`observer`] (the pipeline's hooks), [`http`] (`/metrics`,
//! `/healthz`, `/readyz`), [`progress`] (the periodic summary line), and here
//! the log subscriber ([`init`]); event lines carry `lsn`, `id`, `topic` as fields.

pub mod health;
pub mod http;
pub mod metrics;
pub mod observer;
pub mod progress;

use std::error::Error;
use std::fmt;

use tracing_subscriber::EnvFilter;

/// Log line format (`--log-format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Installs the global tracing subscriber (stderr, text or JSON); `level` is a
/// level (`info`) or a full filter (`outbox_relay=debug,librdkafka=warn`).
pub fn init(format: LogFormat, level: &str) -> Result<(), String> {
    let filter = EnvFilter::try_new(level)
        .map_err(|e| format!("--log-level {level:?} is not a valid level or filter: {e}"))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let result = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    result.map_err(|e| format!("cannot install the logger: {e}"))
}

/// An error with its causes, `: `-separated, for logs and the last line: each error's own
/// message says what it was doing and leaves its cause to the chain, so every cause is
/// printed once.
pub struct Chain<'a>(pub &'a (dyn Error + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cause = self.0.source();
        while let Some(error) = cause {
            write!(f, ": {error}")?;
            cause = error.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::Chain;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot connect to Postgres at db")]
    struct Outer {
        #[source]
        source: std::io::Error,
    }

    #[test]
    fn a_chain_prints_each_cause_once() {
        let error = Outer {
            source: std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused"),
        };
        assert_eq!(
            Chain(&error).to_string(),
            "cannot connect to Postgres at db: refused"
        );
    }
}
