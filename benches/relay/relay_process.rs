//! The relay as a subprocess, run as users run it, with its log tail kept for errors.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, ChildStderr, Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, anyhow, bail};
use outbox_relay::outbox::Shard;

use crate::figures::histogram::AckHistogram;
use crate::flags::Args;
use crate::http;
use crate::pg::{PUBLICATION, SLOT_RELAY};

/// Most the relay may take from spawn to "streaming".
const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);
/// Grace for the relay's shutdown (its --shutdown-timeout plus margin).
const RELAY_SHUTDOWN: Duration = Duration::from_secs(15);
/// Log lines kept for an error message.
const TAIL_LINES: usize = 40;

/// One relay to run: on the bench's slot, or on a shard's (named after it), with flags of
/// its own after the bench's. A variant to compare with the default relay (a record format,
/// say) is one more run with its own slot, created with the others before any row.
#[derive(Clone, Debug)]
pub(crate) struct RelayRun {
    /// `--slot`: a shard's slot and publication are derived from it.
    pub(crate) slot: &'static str,
    pub(crate) shard: Option<Shard>,
    pub(crate) extra_args: Vec<String>,
}

impl RelayRun {
    /// The relay as the bench runs it by default, or shard `shard` of it.
    pub(crate) fn plain(shard: Option<Shard>) -> RelayRun {
        RelayRun {
            slot: SLOT_RELAY,
            shard,
            extra_args: Vec::new(),
        }
    }

    /// The slot the relay streams from.
    pub(crate) fn streamed_slot(&self) -> String {
        match self.shard {
            Some(shard) => shard.name(self.slot),
            None => self.slot.to_owned(),
        }
    }

    /// The relay's command line: the bench's slot, broker and `args`' relay flags, then the
    /// run's own.
    fn command_args(
        &self,
        args: &Args,
        postgres_url: &str,
        bootstrap: &str,
        http_port: u16,
    ) -> Vec<String> {
        let mut line: Vec<String> = Vec::new();
        let mut push = |flag: &str, value: &str| {
            line.push(flag.to_owned());
            line.push(value.to_owned());
        };
        push("--postgres-url", postgres_url);
        push("--kafka-brokers", bootstrap);
        push("--slot", self.slot);
        push("--publication", PUBLICATION);
        if let Some(shard) = self.shard {
            push("--shard", &shard.to_string());
        }
        push("--status-interval", &args.status_interval);
        push("--delivery", &args.delivery);
        push("--cleanup", &args.cleanup);
        for property in &args.kafka_properties {
            push("-X", property);
        }
        push("--shutdown-timeout", "10s");
        push("--log-level", "info");
        push("--http-addr", &format!("127.0.0.1:{http_port}"));
        line.extend(self.extra_args.iter().cloned());
        line
    }
}

/// What the relay's log has told so far.
#[derive(Default)]
struct Log {
    /// Spawn to the "streaming" line, from the line's own timestamp (so the
    /// bench's reader thread being scheduled late does not count).
    streaming: Option<Duration>,
    tail: VecDeque<String>,
}

pub(crate) struct RelayProcess {
    child: Child,
    /// Its `--http-addr` port: the relay runs as deployed, with /metrics on.
    http_port: u16,
    pub(crate) spawned: Instant,
    log: Arc<Mutex<Log>>,
}

impl RelayProcess {
    pub(crate) fn spawn(
        bin: &Path,
        run: &RelayRun,
        args: &Args,
        postgres_url: &str,
        bootstrap: &str,
    ) -> Result<Self> {
        let http_port = http::free_port();
        let mut child = Command::new(bin)
            .args(run.command_args(args, postgres_url, bootstrap, http_port))
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("spawn {}", bin.display()))?;
        let spawned = Instant::now();
        let spawned_wall = SystemTime::now();
        let log = Arc::new(Mutex::new(Log::default()));
        let stderr = child.stderr.take().ok_or_else(|| anyhow!("relay stderr"))?;
        let reader_log = Arc::clone(&log);
        // Ends at EOF, when the relay exits.
        thread::spawn(move || follow_log(stderr, &reader_log, spawned, spawned_wall));
        Ok(RelayProcess {
            child,
            http_port,
            spawned,
            log,
        })
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    fn log(&self) -> MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn log_tail(&self) -> String {
        let log = self.log();
        log.tail.iter().cloned().collect::<Vec<_>>().join("\n")
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
            let streaming = self.log().streaming;
            if let Some(at) = streaming {
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

/// Reads the relay's log until it exits: the first "streaming" line's time, the last lines.
fn follow_log(stderr: ChildStderr, log: &Mutex<Log>, spawned: Instant, spawned_wall: SystemTime) {
    for line in BufReader::new(stderr).lines().map_while(Result::ok) {
        let mut log = log.lock().unwrap_or_else(|p| p.into_inner());
        if line.contains("streaming from the slot") && log.streaming.is_none() {
            let logged = logged_since(&line, spawned_wall);
            log.streaming = Some(logged.unwrap_or_else(|| spawned.elapsed()));
        }
        if log.tail.len() >= TAIL_LINES {
            log.tail.pop_front();
        }
        log.tail.push_back(line);
    }
}

/// The time from `since` to a log line's own timestamp (its first word, RFC 3339).
fn logged_since(line: &str, since: SystemTime) -> Option<Duration> {
    let timestamp = line.split_whitespace().next()?;
    let logged = humantime::parse_rfc3339(timestamp).ok()?;
    logged.duration_since(since).ok()
}
