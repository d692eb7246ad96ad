//! The demo's throwaway PostgreSQL: `initdb` in a temporary directory, the
//! server on a free loopback port with `wal_level = logical`, stopped and
//! removed on drop. PostgreSQL refuses to run as root, so as root the server
//! runs as the `postgres` user (which the distribution packages create).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::DemoError;

/// Where distributions put the server binaries (versioned ones newest first).
const USUAL_DIRS: &[&str] = &[
    "/usr/lib/postgresql/*/bin",          // Debian, Ubuntu
    "/usr/pgsql-*/bin",                   // RHEL (PGDG)
    "/opt/homebrew/opt/postgresql@*/bin", // macOS (Homebrew)
    "/usr/local/opt/postgresql@*/bin",    // macOS (Intel Homebrew)
    "/usr/local/pgsql/bin",               // built from source
    "/usr/bin",                           // Fedora, Arch
    "/Applications/Postgres.app/Contents/Versions/latest/bin",
];

/// A running throwaway cluster.
pub(super) struct Cluster {
    /// The temporary directory (data, socket, server log).
    pub(super) dir: tempfile::TempDir,
    bin: PathBuf,
    /// The superuser's URL over loopback TCP.
    pub(super) url: String,
}

impl Cluster {
    /// `initdb` and start a server from `pg_bin`, else `pg_config --bindir`,
    /// else the usual install directories, else `PATH`.
    pub(super) fn start(pg_bin: Option<&Path>) -> Result<Cluster, DemoError> {
        let bin = match pg_bin {
            Some(dir) if has_server(dir) => dir.to_owned(),
            Some(dir) => return Err(DemoError::NoServer(format!("{} has none", dir.display()))),
            None => find_server().ok_or_else(|| {
                DemoError::NoServer("none on PATH, from pg_config or in the usual places".into())
            })?,
        };
        let dir = tempfile::Builder::new()
            .prefix("outbox-relay-demo-")
            .tempdir_in("/tmp")
            .map_err(DemoError::Io)?;
        // The directory's random suffix: alphanumeric, so it needs no URL escaping.
        let password = dir.path().display().to_string();
        let password = password.replace("/tmp/outbox-relay-demo-", "demo-");
        std::fs::write(dir.path().join("pwfile"), format!("{password}\n"))
            .map_err(DemoError::Io)?;
        let port = std::net::TcpListener::bind(("127.0.0.1", 0))
            .and_then(|l| l.local_addr())
            .map_err(DemoError::Io)?
            .port();
        let as_root = rustix::process::geteuid().is_root();
        let url = format!("postgres://postgres:{password}@127.0.0.1:{port}/postgres");
        let cluster = Cluster { dir, bin, url };
        let dir = cluster.dir.path().display().to_string();
        if as_root {
            cluster.run(Command::new("chown").args(["-R", "postgres:postgres", &dir]))?;
        }
        // Commands run in the directory: paths in it are relative.
        let initdb = "-D data -U postgres --pwfile=pwfile --auth-local=trust \
                      --auth-host=scram-sha-256 --encoding=UTF8 --locale=C --no-sync";
        cluster.run(cluster.pg("initdb").args(initdb.split_whitespace()))?;
        let options = format!(
            "-c port={port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={dir} \
             -c wal_level=logical -c fsync=off -c max_wal_senders=4 -c max_replication_slots=4",
        );
        let mut pg_ctl = cluster.pg("pg_ctl");
        let start = "start -w -t 60 -D data -l server.log -o";
        cluster.run(pg_ctl.args(start.split_whitespace()).arg(options))?;
        Ok(cluster)
    }

    /// A server tool from the bin dir, as `postgres` under root.
    fn pg(&self, program: &str) -> Command {
        let program = self.bin.join(program);
        if !rustix::process::geteuid().is_root() {
            return Command::new(program);
        }
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(program);
        command
    }

    /// Runs `command` in the directory, output to `commands.log` (the daemonised
    /// server could hold a pipe open); a failure shows that log's end and the server's.
    fn run(&self, command: &mut Command) -> Result<(), DemoError> {
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.dir.path().join("commands.log"))
            .map_err(DemoError::Io)?;
        for var in ["PGDATA", "PGPORT", "PGHOST", "PGUSER", "PGOPTIONS"] {
            command.env_remove(var);
        }
        let status = command
            .current_dir(self.dir.path())
            .env("LC_ALL", "C")
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(DemoError::Io)?)
            .stderr(log)
            .status();
        let why = match status {
            Ok(s) if s.success() => return Ok(()),
            Ok(s) => s.to_string(),
            Err(e) => e.to_string(),
        };
        let hint = match rustix::process::geteuid().is_root() {
            true => " (as root: is there a `postgres` user? The PostgreSQL packages create it)",
            false => "",
        };
        let mut message = format!("{:?} failed: {why}{hint}", command.get_program());
        for log in ["commands.log", "server.log"] {
            let text = std::fs::read_to_string(self.dir.path().join(log)).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = lines[lines.len().saturating_sub(15)..].iter();
            message.extend(tail.map(|line| format!("\n{line}")));
        }
        Err(DemoError::Cluster(message))
    }
}

impl Drop for Cluster {
    /// Stops the server; the `TempDir` then removes the directory.
    fn drop(&mut self) {
        if self.dir.path().join("data/postmaster.pid").exists() {
            let stop = "stop -D data -m fast -w -t 30".split_whitespace();
            let _ = self.run(self.pg("pg_ctl").args(stop));
        }
    }
}

fn has_server(dir: &Path) -> bool {
    ["initdb", "pg_ctl", "postgres"]
        .iter()
        .all(|b| dir.join(b).is_file())
}

/// `pg_config --bindir`, then the usual directories, then `PATH`.
fn find_server() -> Option<PathBuf> {
    let pg_config = Command::new("pg_config")
        .arg("--bindir")
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success());
    let bindir = pg_config.map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    let mut candidates: Vec<PathBuf> = bindir.into_iter().collect();
    for pattern in USUAL_DIRS {
        let found = glob::glob(pattern).into_iter().flatten();
        let mut found: Vec<PathBuf> = found.flatten().collect();
        // Newest major version first (17 before 9).
        found.sort_by_key(|p| std::cmp::Reverse(version(p)));
        candidates.extend(found);
    }
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path));
    }
    candidates.into_iter().find(|dir| has_server(dir))
}

/// The first number in `path` (`/usr/lib/postgresql/17/bin` → 17).
fn version(path: &Path) -> u32 {
    let text = path.to_string_lossy();
    let mut numbers = text.split(|c: char| !c.is_ascii_digit());
    numbers.find_map(|n| n.parse().ok()).unwrap_or(0)
}
