//! The relay binary as a subprocess, as users run it.

use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A running `outbox-relay` process whose stderr goes to a log file.
pub struct Relay {
    child: Child,
    log: PathBuf,
    /// Where the relay writes the address its /readyz answers on (`--http-addr-file`),
    /// unless the test turned the endpoint off.
    http_addr_file: Option<PathBuf>,
    /// The port read from that file, once it was there.
    http_port: OnceLock<u16>,
    _dir: tempfile::TempDir,
}

/// The binary under test.
pub fn binary() -> &'static str {
    env!("CARGO_BIN_EXE_outbox-relay")
}

impl Relay {
    /// Starts the relay with `--postgres-url`, `--kafka-brokers` and `args`.
    pub fn spawn(postgres_url: &str, brokers: &str, args: &[&str]) -> Relay {
        let mut all = vec!["--postgres-url", postgres_url, "--kafka-brokers", brokers];
        all.extend_from_slice(args);
        Relay::spawn_raw(&all)
    }

    /// [`Relay::spawn`], then waits until the relay streams.
    pub fn spawn_streaming(postgres_url: &str, brokers: &str, args: &[&str]) -> Relay {
        let mut relay = Relay::spawn(postgres_url, brokers, args);
        relay.wait_streaming();
        relay
    }

    /// Starts the relay with exactly `args` (plus test logging settings).
    pub fn spawn_raw(args: &[&str]) -> Relay {
        Relay::spawn_raw_env(args, &[])
    }

    /// [`Relay::spawn`] with these environment variables (`HOME`, `AWS_*`...).
    pub fn spawn_env(
        postgres_url: &str,
        brokers: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Relay {
        let mut all = vec!["--postgres-url", postgres_url, "--kafka-brokers", brokers];
        all.extend_from_slice(args);
        Relay::spawn_raw_env(&all, env)
    }

    /// [`Relay::spawn_raw`] with these environment variables. No `AWS_*` variable of the
    /// test's own environment reaches the relay: a test gives the ones it means.
    pub fn spawn_raw_env(args: &[&str], env: &[(&str, &str)]) -> Relay {
        let dir = tempfile::tempdir().expect("temp dir for the relay log");
        let log = dir.path().join("relay.log");
        let stderr = File::create(&log).expect("create relay log");
        // Every relay serves /readyz on loopback, on a port the system picks when it binds
        // (a port chosen beforehand may be taken by then), and writes down which, so tests
        // wait on its state rather than on log wording.
        let given = args
            .iter()
            .position(|a| *a == "--http-addr")
            .and_then(|i| args.get(i + 1));
        let addr_file = dir.path().join("http-addr");
        let http_addr_file = (given != Some(&"none")).then(|| addr_file.clone());
        let status_interval = match args.contains(&"--status-interval") {
            true => &[][..],
            false => &["--status-interval", "200ms"][..],
        };
        let mut command = Command::new(binary());
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("AWS_") {
                command.env_remove(name);
            }
        }
        let child = command
            .args(["--log-level", "info,outbox_relay=debug"])
            .args(status_interval)
            .args(args)
            .envs(env.iter().copied())
            .env_remove("RUST_LOG")
            .env("OUTBOX_RELAY_HTTP_ADDR", "127.0.0.1:0")
            .env("OUTBOX_RELAY_HTTP_ADDR_FILE", &addr_file)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawn outbox-relay");
        Relay {
            child,
            log,
            http_addr_file,
            http_port: OnceLock::new(),
            _dir: dir,
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything the relay logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// How many lines the relay logged so far.
    pub fn log_lines(&self) -> usize {
        self.log().lines().count()
    }

    /// The lines logged after the first `from` that the default level (info) shows: the
    /// tests log the relay's own debug lines too.
    pub fn shown_since(&self, from: usize) -> Vec<String> {
        let shown = |line: &&str| {
            [" INFO ", " WARN ", " ERROR "]
                .iter()
                .any(|l| line.contains(l))
        };
        let log = self.log();
        log.lines()
            .skip(from)
            .filter(shown)
            .map(str::to_owned)
            .collect()
    }

    /// `/readyz`'s `streaming` field: the replication stream is running.
    pub fn streaming(&self) -> bool {
        self.http_port()
            .and_then(|port| super::http::get(port, "/readyz"))
            .is_some_and(|(_, body)| body.contains("\"streaming\":true"))
    }

    /// The loopback port of `/metrics` and `/readyz`, once the relay listens (`None` before,
    /// and when it serves none).
    pub fn http_port(&self) -> Option<u16> {
        if let Some(port) = self.http_port.get() {
            return Some(*port);
        }
        let written = std::fs::read_to_string(self.http_addr_file.as_ref()?).ok()?;
        let addr: std::net::SocketAddr = written.trim().parse().ok()?;
        Some(*self.http_port.get_or_init(|| addr.port()))
    }

    /// Waits until the relay listens on its HTTP port, and returns it.
    pub fn wait_http_port(&mut self) -> u16 {
        let listening = self.wait_for(Duration::from_secs(30), |r| r.http_port().is_some());
        assert!(
            listening,
            "the relay serves no HTTP port; log:\n{}",
            self.log()
        );
        self.http_port().expect("the HTTP port")
    }

    /// `/readyz`'s answer, as JSON.
    pub fn readyz(&self) -> Option<serde_json::Value> {
        let (_, body) = super::http::get(self.http_port()?, "/readyz")?;
        serde_json::from_str(&body).ok()
    }

    /// A counter or gauge from `/metrics` (the sum over its label sets).
    pub fn metric(&self, name: &str) -> Option<f64> {
        let (_, body) = super::http::get(self.http_port()?, "/metrics")?;
        let values: Vec<f64> = body
            .lines()
            .filter(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
            .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
            .collect();
        (!values.is_empty()).then(|| values.iter().sum())
    }

    /// Each sample of a counter or gauge from `/metrics`: its labels (`{...}`, or empty) and value.
    pub fn metric_samples(&self, name: &str) -> Vec<(String, f64)> {
        let Some((_, body)) = self
            .http_port()
            .and_then(|p| super::http::get(p, "/metrics"))
        else {
            return Vec::new();
        };
        body.lines()
            .filter_map(|l| l.strip_prefix(name))
            .filter(|l| l.starts_with([' ', '{']))
            .filter_map(|l| {
                let (labels, value) = l.rsplit_once(' ')?;
                Some((labels.trim().to_owned(), value.parse().ok()?))
            })
            .collect()
    }

    /// Waits until `check` holds; false on timeout or once the relay exited.
    pub fn wait_for(&mut self, timeout: Duration, check: impl Fn(&Relay) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if check(self) {
                return true;
            }
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    /// Waits until `/readyz` says the relay is streaming; false on timeout or exit.
    pub fn wait_streaming_for(&mut self, timeout: Duration) -> bool {
        self.wait_for(timeout, Relay::streaming)
    }

    /// Waits until the relay is streaming.
    pub fn wait_streaming(&mut self) {
        assert!(
            self.wait_streaming_for(Duration::from_secs(30)),
            "relay did not start streaming; log:\n{}",
            self.log()
        );
    }

    /// Waits until a relay that cannot stream (another holds the slot) has
    /// done its start-up checks and connected its producer.
    pub fn wait_standing_by(&mut self) {
        let up = self.wait_for(Duration::from_secs(30), |r| {
            r.readyz().is_some_and(|j| {
                let reasons = j["reasons"].to_string();
                reasons.contains("not streaming") && !reasons.contains("producer is not connected")
            })
        });
        assert!(up, "{:?}\n{}", self.readyz(), self.log());
    }

    /// SIGTERM, then waits for the relay to exit.
    pub fn stop(&mut self) {
        self.signal("TERM");
        self.wait_exit(Duration::from_secs(30))
            .expect("relay stops");
    }

    /// Sends a signal by name (`TERM`, `KILL`, `INT`).
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{name} failed");
    }

    /// Waits for the process to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs the relay to completion (for start-up failures) and returns its exit code and log.
pub fn run_to_exit(postgres_url: &str, brokers: &str, args: &[&str]) -> (Option<i32>, String) {
    let mut relay = Relay::spawn(postgres_url, brokers, args);
    let status = relay.wait_exit(Duration::from_secs(60));
    let log = relay.log();
    (status.and_then(|s| s.code()), log)
}

/// Runs the binary with `args` to completion: its exit code, stdout and stderr.
pub fn run_command(args: &[&str]) -> (Option<i32>, String, String) {
    let output = Command::new(binary())
        .args(args)
        .env_remove("RUST_LOG")
        .env("OUTBOX_RELAY_HTTP_ADDR", "none")
        .stdin(Stdio::null())
        .output()
        .expect("run outbox-relay");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}
