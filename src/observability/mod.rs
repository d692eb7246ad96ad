//! What the operator sees of a running relay: [`metrics`], [`health`]
//! (readiness), [`observer`] (the pipeline's hooks), [`http`] (`/metrics`,
//! `/healthz`, `/readyz`), [`progress`] (the periodic summary line), and here
//! the log subscriber ([`init`]); event lines carry `lsn`, `id`, `topic` as fields.

pub mod health;
pub mod http;
pub mod metrics;
pub mod observer;
pub mod progress;

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

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
