//! One drain of a slot, by `pg_recvlogical` or by a fresh relay, with the CPU each
//! process used.

use std::fs;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use outbox_relay::lsn::Lsn;
use tempfile::NamedTempFile;

use super::Bench;
use crate::figures::rounds::{RefDrain, RelayDrain};
use crate::kafka::{WATERMARK_POLL, broker_total, watch_broker, watermark_client};
use crate::pg::{
    CONFIRMED_POLL, PUBLICATION, SLOT_REF, SLOT_RELAY, confirmed_flush, walsender_pid,
};
use crate::postgres::PgCluster;
use crate::procfs::{
    PROC_POLL, cpu_ticks, proc_stat, sample_cpu_until_exit, self_cpu_ticks, vm_hwm_mib,
};
use crate::relay_process::{RelayProcess, RelayRun};

impl Bench {
    /// `pg_recvlogical --start --endpos=<end>` on the reference slot, to /dev/null.
    pub(super) async fn drain_reference(&self, end: Lsn, limit: Duration) -> Result<RefDrain> {
        let stderr = NamedTempFile::new().context("temp file")?;
        let started = Instant::now();
        let mut child = self.spawn_recvlogical(end, &stderr)?;
        let ws_stop = Arc::new(AtomicBool::new(false));
        let walsender = walsender_pid(&self.control, SLOT_REF, Duration::from_secs(10))
            .await?
            .map(|ws_pid| {
                let stop = Arc::clone(&ws_stop);
                thread::spawn(move || sample_cpu_until_exit(ws_pid, stop, limit))
            });
        let client = sample_until_exit(child.id(), started, limit);
        let status = child.wait().context("wait for pg_recvlogical")?;
        ws_stop.store(true, Ordering::Relaxed);
        let ws_ticks = match walsender {
            Some(handle) => handle.join().ok().flatten().unwrap_or(0),
            None => 0,
        };
        let Some(wall) = client.wall else {
            bail!("pg_recvlogical did not reach {end} within {limit:?}");
        };
        if !status.success() {
            bail!(
                "pg_recvlogical failed ({status}): {}",
                fs::read_to_string(stderr.path()).unwrap_or_default()
            );
        }
        Ok(RefDrain {
            wall,
            client_cpu_s: self.cpu_s(client.ticks),
            walsender_cpu_s: self.cpu_s(ws_ticks),
        })
    }

    /// `pg_recvlogical` on the reference slot up to `end`, over TCP with a password, its
    /// output to /dev/null and its errors to `stderr`.
    fn spawn_recvlogical(&self, end: Lsn, stderr: &NamedTempFile) -> Result<Child> {
        Command::new(&self.recvlogical)
            .arg("-d")
            .arg(format!(
                "host=127.0.0.1 port={} user=postgres dbname=postgres",
                self.pg.port()
            ))
            .args([
                "-S",
                SLOT_REF,
                "--start",
                "-f",
                "/dev/null",
                "-F",
                "0",
                "-n",
            ])
            .arg(format!("--endpos={end}"))
            .args(["--plugin=pgoutput", "-o", "proto_version=1"])
            .arg("-o")
            .arg(format!("publication_names={PUBLICATION}"))
            .env("PGPASSWORD", PgCluster::PASSWORD)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr.reopen().context("reopen")?)
            .spawn()
            .context("spawn pg_recvlogical")
    }

    /// Polls every 10 ms until the relay's slot is confirmed at or past `lsn`
    /// (true) or `within` has passed (false); an exited relay is an error.
    pub(super) async fn wait_confirmed(
        &self,
        relay: &mut RelayProcess,
        lsn: Lsn,
        within: Duration,
    ) -> Result<bool> {
        let poll = Duration::from_millis(10);
        let deadline = Instant::now() + within;
        for _ in 0..(within.as_millis() / poll.as_millis() + 1) {
            if confirmed_flush(&self.control, SLOT_RELAY).await? >= lsn {
                return Ok(true);
            }
            relay.exited()?;
            if Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(poll).await;
        }
        Ok(false)
    }

    pub(super) fn spawn_relay(&self, run: &RelayRun) -> Result<RelayProcess> {
        RelayProcess::spawn(
            &self.relay_bin,
            run,
            &self.args,
            &self.pg.url(),
            &self.broker.bootstrap_servers(),
        )
    }

    /// Spawns a relay for `run` and waits until its slot is confirmed at `end` and the
    /// broker holds `broker_target` records.
    pub(super) async fn drain_relay(
        &mut self,
        end: Lsn,
        broker_target: i64,
        limit: Duration,
        run: &RelayRun,
    ) -> Result<RelayDrain> {
        let slot = run.streamed_slot();
        let bench_cpu_before = self_cpu_ticks();
        let stop = Arc::new(AtomicBool::new(false));
        let mut relay = self.spawn_relay(run)?;
        let watcher = watch_broker(
            self.broker.bootstrap_servers(),
            self.args.partitions,
            broker_target,
            limit,
            Arc::clone(&stop),
        );
        let startup = relay.wait_streaming().await?;
        self.startups.push(startup);
        let ws_pid = walsender_pid(&self.control, &slot, Duration::from_secs(10)).await?;
        let done = self.confirmed_at(&mut relay, &slot, end, limit).await?;
        let relay_ticks = cpu_ticks(relay.pid()).unwrap_or(0);
        let ws_ticks = ws_pid.and_then(cpu_ticks).unwrap_or(0);
        let bench_ticks = self_cpu_ticks().saturating_sub(bench_cpu_before);
        let Some(done) = done else {
            stop.store(true, Ordering::Relaxed);
            bail!(
                "the slot was not confirmed at {end} within {limit:?}; relay log:\n{}",
                relay.log_tail()
            );
        };
        // The broker has everything before the slot can be confirmed; give the
        // watcher one more poll to notice.
        thread::sleep(WATERMARK_POLL * 3);
        stop.store(true, Ordering::Relaxed);
        let broker_done = watcher.join().ok().flatten();
        let rss_mib = vm_hwm_mib(relay.pid()).unwrap_or(f64::NAN);
        let spawned = relay.spawned;
        relay.stop();
        Ok(RelayDrain {
            wall: done - spawned,
            broker_wall: broker_done.map(|t| t.min(done) - spawned),
            startup,
            cpu_s: self.cpu_s(relay_ticks),
            walsender_cpu_s: self.cpu_s(ws_ticks),
            rss_mib,
            bench_cpu_s: self.cpu_s(bench_ticks),
        })
    }

    /// Polls `slot` every `CONFIRMED_POLL` until it is confirmed at `end`: when that was
    /// seen, or `None` once `limit` from the relay's spawn has passed.
    async fn confirmed_at(
        &self,
        relay: &mut RelayProcess,
        slot: &str,
        end: Lsn,
        limit: Duration,
    ) -> Result<Option<Instant>> {
        let deadline = relay.spawned + limit;
        for i in 0..(limit.as_millis() / CONFIRMED_POLL.as_millis() + 1) {
            if confirmed_flush(&self.control, slot).await? >= end {
                return Ok(Some(Instant::now()));
            }
            // An exited relay is an error; its /proc entry is not read every 2 ms.
            if i % 64 == 0 {
                relay.exited()?;
            }
            if Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(CONFIRMED_POLL).await;
        }
        Ok(None)
    }

    pub(super) async fn broker_records(&self) -> Result<i64> {
        let bootstrap = self.broker.bootstrap_servers();
        let partitions = self.args.partitions;
        tokio::task::spawn_blocking(move || {
            let consumer = watermark_client(&bootstrap)?;
            broker_total(&consumer, partitions)
                .ok_or_else(|| anyhow!("cannot read the broker's watermarks"))
        })
        .await
        .context("watermark task")?
    }
}

/// A client sampled until it exited.
struct ClientSample {
    /// Its CPU ticks at the last reading.
    ticks: u64,
    /// From `started` to when it was seen exited (`None`: still running at the limit).
    wall: Option<Duration>,
}

/// Samples a client until it is a zombie (exited, not yet reaped): its /proc entry still
/// holds the final CPU times.
fn sample_until_exit(pid: u32, started: Instant, limit: Duration) -> ClientSample {
    let deadline = started + limit;
    let mut sample = ClientSample {
        ticks: 0,
        wall: None,
    };
    for _ in 0..(limit.as_millis() / PROC_POLL.as_millis() + 1) {
        match proc_stat(&pid.to_string()) {
            Some(stat) => {
                sample.ticks = stat.cpu_ticks;
                if stat.exited() {
                    sample.wall = Some(started.elapsed());
                    break;
                }
            }
            None => {
                sample.wall = Some(started.elapsed());
                break;
            }
        }
        if Instant::now() >= deadline {
            break;
        }
        thread::sleep(PROC_POLL);
    }
    sample
}
