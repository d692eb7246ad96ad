//! The demo's throwaway PostgreSQL: `initdb` in a temporary directory, the
//! server on a free loopback port with `wal_level = logical`, stopped and
//! removed on drop. PostgreSQL refuses to run as root, so as root the server
//! runs as the `postgres` user (which the distribution packages create).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::DemoError;

/// The OS user that runs the server when the demo runs as root.
const SERVER_USER: &str = "postgres";

/// Where distributions put the server binaries, newest first within each pattern.
const USUAL_DIRS: &[&str] = &[
    "/usr/lib/postgresql",  // Debian, Ubuntu: <major>/bin
    "/usr/pgsql",           // RHEL (PGDG): /usr/pgsql-<major>/bin
    "/opt/homebrew/opt",    // macOS (Homebrew): postgresql@<major>/bin
    "/usr/local/opt",       // macOS (Intel Homebrew)
    "/usr/local/pgsql/bin", // built from source
    "/usr/bin",             // Fedora, Arch
    "/Applications/Postgres.app/Contents/Versions/latest/bin",
];

/// A running throwaway cluster.
pub(super) struct Cluster {
    dir: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
    password: String,
    as_root: bool,
}

impl Cluster {
    /// `initdb` and start a server from `pg_bin`, else `pg_config --bindir`,
    /// else the usual install directories.
    pub(super) fn start(pg_bin: Option<&Path>) -> Result<Cluster, DemoError> {
        let bin = match pg_bin {
            Some(dir) if has_server(dir) => dir.to_owned(),
            Some(dir) => return Err(DemoError::NoServer(format!("{} has none", dir.display()))),
            None => find_server().ok_or_else(|| {
                DemoError::NoServer("none on PATH, from pg_config or in the usual places".into())
            })?,
        };
        let as_root = is_root();
        let dir = tempfile::Builder::new()
            .prefix("outbox-relay-demo-")
            .tempdir_in("/tmp")
            .map_err(DemoError::Io)?;
        let password = format!("demo-{:x}", std::process::id() ^ now_nanos());
        let pwfile = dir.path().join("pwfile");
        std::fs::write(&pwfile, format!("{password}\n")).map_err(DemoError::Io)?;
        let port = free_port()?;
        let cluster = Cluster {
            dir,
            bin,
            port,
            password,
            as_root,
        };
        if as_root {
            cluster.run(
                "chown",
                &["-R", "postgres:postgres", &cluster.path("")],
                false,
            )?;
        }
        cluster.run(
            "initdb",
            &[
                "-D",
                &cluster.path("data"),
                "-U",
                "postgres",
                &format!("--pwfile={}", pwfile.display()),
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
            ],
            true,
        )?;
        let _ = std::fs::remove_file(&pwfile);
        let options = format!(
            "-c port={port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={} \
             -c wal_level=logical -c fsync=off -c max_wal_senders=4 -c max_replication_slots=4",
            cluster.path("")
        );
        cluster.run(
            "pg_ctl",
            &[
                "start",
                "-D",
                &cluster.path("data"),
                "-l",
                &cluster.path("server.log"),
                "-w",
                "-t",
                "60",
                "-o",
                &options,
            ],
            true,
        )?;
        Ok(cluster)
    }

    /// The superuser's URL over loopback TCP.
    pub(super) fn url(&self) -> String {
        format!(
            "postgres://postgres:{}@127.0.0.1:{}/postgres",
            self.password, self.port
        )
    }

    /// The temporary directory (data, socket, server log).
    pub(super) fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    /// Runs a server tool (`pg` = from the bin dir, as `postgres` under root),
    /// its output going to `commands.log` (a pipe could be held open by the
    /// daemonised server).
    fn run(&self, program: &str, args: &[&str], pg: bool) -> Result<(), DemoError> {
        let program_path = if pg {
            self.bin.join(program)
        } else {
            PathBuf::from(program)
        };
        let mut cmd = if pg && self.as_root {
            let mut c = Command::new("runuser");
            c.args(["-u", SERVER_USER, "--"]).arg(&program_path);
            c
        } else {
            Command::new(&program_path)
        };
        let log_path = self.dir.path().join("commands.log");
        let log = File::options()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(DemoError::Io)?;
        let log_err = log.try_clone().map_err(DemoError::Io)?;
        for var in ["PGDATA", "PGPORT", "PGHOST", "PGUSER", "PGOPTIONS"] {
            cmd.env_remove(var);
        }
        let status = cmd
            .args(args)
            .current_dir(self.dir.path())
            .env("LC_ALL", "C")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .status();
        match status {
            Ok(s) if s.success() => Ok(()),
            outcome => {
                let output = std::fs::read_to_string(&log_path).unwrap_or_default();
                let server_log =
                    std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default();
                let why = match outcome {
                    Ok(s) => s.to_string(),
                    Err(e) => e.to_string(),
                };
                let hint = if self.as_root && pg {
                    " (running as root: is there a `postgres` user? The PostgreSQL packages create it)"
                } else {
                    ""
                };
                Err(DemoError::Cluster(format!(
                    "{} failed: {why}{hint}\n{}{}",
                    program_path.display(),
                    tail(&output),
                    tail(&server_log)
                )))
            }
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let data = self.path("data");
        if self.dir.path().join("data/postmaster.pid").exists() {
            let _ = self.run(
                "pg_ctl",
                &["stop", "-D", &data, "-m", "fast", "-w", "-t", "30"],
                true,
            );
        }
        // The TempDir removes the directory when it drops, after this.
    }
}

/// The last lines of a log, for error messages.
fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = lines[lines.len().saturating_sub(15)..].join("\n");
    if !out.is_empty() {
        out.push('\n');
    }
    out
}

fn has_server(dir: &Path) -> bool {
    ["initdb", "pg_ctl", "postgres"]
        .iter()
        .all(|b| dir.join(b).is_file())
}

/// `pg_config --bindir`, then the usual directories (newest version first), then `PATH`.
fn find_server() -> Option<PathBuf> {
    let from_pg_config = Command::new("pg_config")
        .arg("--bindir")
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    let mut candidates: Vec<PathBuf> = from_pg_config.into_iter().collect();
    for usual in USUAL_DIRS {
        let path = Path::new(usual);
        if path.ends_with("bin") {
            candidates.push(path.to_owned());
            continue;
        }
        // A parent of versioned directories: <parent>/<version>/bin, newest first;
        // /usr/pgsql-17 style siblings are matched by prefix.
        let (parent, prefix) = match path.file_name().and_then(|n| n.to_str()) {
            Some("pgsql") => (Path::new("/usr"), "pgsql-"),
            _ => (path, ""),
        };
        let Ok(entries) = std::fs::read_dir(parent) else {
            continue;
        };
        let mut versioned: Vec<(u32, PathBuf)> = entries
            .filter_map(Result::ok)
            .filter_map(|e| {
                let name = e.file_name().to_str()?.to_owned();
                let rest = name.strip_prefix(prefix)?;
                let rest = rest.strip_prefix("postgresql@").unwrap_or(rest);
                Some((rest.parse().ok()?, e.path().join("bin")))
            })
            .collect();
        versioned.sort();
        candidates.extend(versioned.into_iter().rev().map(|(_, bin)| bin));
    }
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path));
    }
    candidates.into_iter().find(|dir| has_server(dir))
}

/// Whether the effective user is root (PostgreSQL refuses to run as root).
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|status| {
        status
            .lines()
            .find(|l| l.starts_with("Uid:"))
            .and_then(|l| l.split_whitespace().nth(2))
            == Some("0")
    })
}

/// A loopback port that was free a moment ago.
fn free_port() -> Result<u16, DemoError> {
    std::net::TcpListener::bind(("127.0.0.1", 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(DemoError::Io)
}

fn now_nanos() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos())
}
