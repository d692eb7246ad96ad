//! The relay as a subprocess, run as users run it, with its log tail kept for errors.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use outbox_relay::outbox::Shard;

use crate::figures::histogram::AckHistogram;
use crate::flags::Args;
use crate::http;
use crate::pg::{PUBLICATION, SLOT_RELAY};
use crate::postgres::PgCluster;

/// Most the relay may take from spawn to "streaming".
const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);
/// Grace for the relay's shutdown (its --shutdown-timeout plus margin).
const RELAY_SHUTDOWN: Duration = Duration::from_secs(15);

pub(crate) struct RelayProcess {
    child: Child,
    /// Its `--http-addr` port: the relay runs as deployed, with /metrics on.
    http_port: u16,
    pub(crate) spawned: Instant,
    /// Spawn to the "streaming" line, from the line's own timestamp (so the
    /// bench's reader thread being scheduled late does not count).
    streaming: Arc<Mutex<Option<Duration>>>,
    tail: Arc<Mutex<VecDeque<String>>>,
}

impl RelayProcess {
    /// The relay on `bench_relay`, or on `shard`'s slot and publication (derived from it).
    pub(crate) fn spawn(
        bin: &Path,
        pg: &PgCluster,
        bootstrap: &str,
        args: &Args,
        shard: Option<Shard>,
    ) -> Result<Self> {
        let http_port = http::free_port();
        let mut child = Command::new(bin)
            .arg("--postgres-url")
            .arg(pg.url())
            .args(["--kafka-brokers", bootstrap])
            .args(["--slot", SLOT_RELAY, "--publication", PUBLICATION])
            .args(
                shard
                    .iter()
                    .flat_map(|s| ["--shard".to_owned(), s.to_string()]),
            )
            .args(["--status-interval", &args.status_interval])
            .args(["--delivery", &args.delivery])
            .args(["--cleanup", &args.cleanup])
            .args(
                args.kafka_properties
                    .iter()
                    .flat_map(|p| ["-X", p.as_str()]),
            )
            .args(["--shutdown-timeout", "10s", "--log-level", "info"])
            .args(["--http-addr", &format!("127.0.0.1:{http_port}")])
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("spawn {}", bin.display()))?;
        let spawned = Instant::now();
        let spawned_wall = std::time::SystemTime::now();
        let streaming = Arc::new(Mutex::new(None));
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        let stderr = child.stderr.take().ok_or_else(|| anyhow!("relay stderr"))?;
        let (streaming2, tail2) = (Arc::clone(&streaming), Arc::clone(&tail));
        // Ends at EOF, when the relay exits.
        thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains("streaming from the slot") {
                    let logged = line
                        .split_whitespace()
                        .next()
                        .and_then(|t| humantime::parse_rfc3339(t).ok())
                        .and_then(|t| t.duration_since(spawned_wall).ok());
                    let mut at = streaming2.lock().unwrap_or_else(|p| p.into_inner());
                    at.get_or_insert_with(|| logged.unwrap_or_else(|| spawned.elapsed()));
                }
                let mut tail = tail2.lock().unwrap_or_else(|p| p.into_inner());
                if tail.len() >= 40 {
                    tail.pop_front();
                }
                tail.push_back(line);
            }
        });
        Ok(RelayProcess {
            child,
            http_port,
            spawned,
            streaming,
            tail,
        })
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(crate) fn log_tail(&self) -> String {
        let tail = self.tail.lock().unwrap_or_else(|p| p.into_inner());
        tail.iter().cloned().collect::<Vec<_>>().join("\n")
    }

    pub(crate) fn exited(&mut self) -> Result<()> {
        if let Ok(Some(status)) = self.child.try_wait() {
            bail!("the relay exited ({status}); its log:\n{}", self.log_tail());
        }
        Ok(())
    }

    /// Time from spawn to the "streaming from the slot" log line.
    pub(crate) async fn wait_streaming(&mut self) -> Result<Duration> {
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        for _ in 0..(STARTUP_TIMEOUT.as_millis() + 1) {
            let at = *self.streaming.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(at) = at {
                return Ok(at);
            }
            self.exited()?;
            if Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        bail!(
            "the relay did not start streaming within {STARTUP_TIMEOUT:?}; its log:\n{}",
            self.log_tail()
        )
    }

    /// Its `outbox_relay_commit_to_ack_seconds` histogram, from /metrics.
    pub(crate) fn commit_to_ack(&self) -> Result<AckHistogram> {
        let (status, body) = http::get(self.http_port, "/metrics")
            .ok_or_else(|| anyhow!("the relay's /metrics did not answer"))?;
        if status != 200 {
            bail!("the relay's /metrics answered {status}");
        }
        AckHistogram::parse(&body)
    }

    /// SIGTERM, then wait (SIGKILL after `RELAY_SHUTDOWN`).
    pub(crate) fn stop(mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + RELAY_SHUTDOWN;
        for _ in 0..(RELAY_SHUTDOWN.as_millis() / 20 + 1) {
            if matches!(self.child.try_wait(), Ok(Some(_))) || Instant::now() >= deadline {
                break;
            }
            thread::sleep(Duration::from_millis(20));
        }
        // Drop kills it if it is still running.
    }
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
