//! The programs the bench runs: the release relay and `pg_recvlogical`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, anyhow, bail};

/// The release relay binary: cargo sets `CARGO_BIN_EXE_outbox-relay` for
/// benches (and builds it in the bench profile); otherwise build it.
pub(crate) fn relay_binary() -> Result<PathBuf> {
    if let Some(path) = option_env!("CARGO_BIN_EXE_outbox-relay").map(PathBuf::from)
        && path.is_file()
    {
        return Ok(path);
    }
    let manifest = env!("CARGO_MANIFEST_DIR");
    println!("building the release relay: cargo build --release --bin outbox-relay");
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned()))
        .args(["build", "--release", "--bin", "outbox-relay"])
        .current_dir(manifest)
        .status()
        .context("run cargo build --release")?;
    if !status.success() {
        bail!("cargo build --release --bin outbox-relay failed: {status}");
    }
    let path = Path::new(manifest).join("target/release/outbox-relay");
    if !path.is_file() {
        bail!("{} not found after the build", path.display());
    }
    Ok(path)
}

/// `pg_recvlogical` from `pg_config --bindir`, else Debian's PostgreSQL 15 directory.
pub(crate) fn pg_recvlogical() -> Result<PathBuf> {
    let from_pg_config = Command::new("pg_config")
        .arg("--bindir")
        .output()
        .ok()
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()).join("pg_recvlogical"));
    from_pg_config
        .into_iter()
        .chain([PathBuf::from("/usr/lib/postgresql/15/bin/pg_recvlogical")])
        .find(|p| p.is_file())
        .ok_or_else(|| anyhow!("pg_recvlogical not found (apt-get install postgresql-15)"))
}
