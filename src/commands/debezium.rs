//! `--debezium-config FILE` and `debezium-config --explain FILE`: a Debezium
//! connector configuration as the relay's command line.
//!
//! The imported flags come first and flags given explicitly (on the command
//! line or through their `OUTBOX_RELAY_*` variable) replace them, repeatable
//! ones included: an explicit `--table` replaces every imported table.

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::CommandError;
use crate::config::DebeziumConfigArgs;
use crate::config::debezium::{self, DebeziumError, Imported};

/// A connector configuration file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// The file cannot be read.
    #[error("cannot read the Debezium config {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file's content does not translate.
    #[error("Debezium config {path}: {source}")]
    Import {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: DebeziumError,
    },
}

/// Reads and translates a connector configuration.
pub fn import_file(path: &Path) -> Result<Imported, ImportError> {
    let text = std::fs::read_to_string(path).map_err(|source| ImportError::Read {
        path: path.to_owned(),
        source,
    })?;
    let format = debezium::detect_format(path, &text);
    let wrap = |source| ImportError::Import {
        path: path.to_owned(),
        source,
    };
    let config = debezium::parse(&text, format).map_err(wrap)?;
    debezium::import(&config).map_err(wrap)
}

/// The environment variable clap reads for a flag, e.g. `--slot` → `OUTBOX_RELAY_SLOT`.
fn env_name(flag: &str) -> String {
    let name = if flag == "-X" {
        "kafka-property"
    } else {
        flag.trim_start_matches('-')
    };
    format!("OUTBOX_RELAY_{}", name.replace('-', "_").to_uppercase())
}

fn given(args: &[OsString], flag: &str) -> bool {
    let forms: Vec<String> = if flag == "-X" {
        vec!["-X".into(), "--kafka-property".into()]
    } else {
        vec![flag.to_owned()]
    };
    args.iter().any(|a| {
        let a = a.to_string_lossy();
        forms.iter().any(|f| {
            a == f.as_str()
                || a.starts_with(&format!("{f}="))
                || (f == "-X" && a.starts_with("-X") && a.len() > 2)
        })
    }) || std::env::var_os(env_name(flag)).is_some()
}

/// Where `--debezium-config` points, from the arguments or the environment.
fn config_path(args: &[OsString]) -> Option<PathBuf> {
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        let text = arg.to_string_lossy();
        if text == "--debezium-config" {
            return iter.next().map(PathBuf::from);
        }
        if let Some(path) = text.strip_prefix("--debezium-config=") {
            return Some(PathBuf::from(path));
        }
    }
    std::env::var_os("OUTBOX_RELAY_DEBEZIUM_CONFIG").map(PathBuf::from)
}

/// The command line with the imported flags inserted before the user's own
/// (which win), and the import's warnings. Unchanged without `--debezium-config`,
/// and for the `debezium-config` subcommand itself.
pub fn expand_args(args: Vec<OsString>) -> Result<(Vec<OsString>, Vec<String>), ImportError> {
    if args.iter().any(|a| a == "debezium-config") {
        return Ok((args, Vec::new()));
    }
    let Some(path) = config_path(&args) else {
        return Ok((args, Vec::new()));
    };
    let imported = import_file(&path)?;
    let mut out = Vec::with_capacity(args.len() + imported.args.len() * 2);
    let mut rest = args.into_iter();
    if let Some(program) = rest.next() {
        out.push(program);
    }
    let rest: Vec<OsString> = rest.collect();
    for (flag, value) in &imported.args {
        if !given(&rest, flag) {
            out.push(OsString::from(flag));
            out.push(OsString::from(value));
        }
    }
    out.extend(rest);
    Ok((out, imported.warnings))
}

/// `debezium-config --explain FILE`.
pub(super) fn run(args: &DebeziumConfigArgs) -> Result<(), CommandError> {
    let imported = import_file(&args.explain).map_err(|e| CommandError::Refused(e.to_string()))?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", debezium::explain(&imported))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    #[test]
    fn explicit_flags_replace_imported_ones() {
        let fixture = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/debezium/custom-routing.json"
        );
        let (args, warnings) = expand_args(os(&[
            "outbox-relay",
            "--debezium-config",
            fixture,
            "--slot",
            "mine",
            "--kafka-brokers",
            "k:9092",
        ]))
        .unwrap();
        let text: Vec<String> = args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(text[0], "outbox-relay");
        assert_eq!(
            text.iter().filter(|a| *a == "--slot").count(),
            1,
            "{text:?}"
        );
        let slot = text.iter().position(|a| a == "--slot").unwrap();
        assert_eq!(text[slot + 1], "mine");
        assert!(text.contains(&"--route-by".to_owned()));
        assert!(text.contains(&"event_type".to_owned()));
        assert!(!warnings.is_empty());
    }

    #[test]
    fn without_the_flag_nothing_changes() {
        let args = os(&["outbox-relay", "--slot", "x"]);
        if std::env::var_os("OUTBOX_RELAY_DEBEZIUM_CONFIG").is_none() {
            assert_eq!(expand_args(args.clone()).unwrap().0, args);
        }
    }

    #[test]
    fn a_missing_file_names_its_path() {
        let err = expand_args(os(&[
            "outbox-relay",
            "--debezium-config",
            "/no/such/file.json",
        ]))
        .unwrap_err()
        .to_string();
        assert!(err.contains("/no/such/file.json"), "{err}");
    }
}
