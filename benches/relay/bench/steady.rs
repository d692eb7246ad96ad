//! Part 2, the steady rate: a writer commits on a fixed schedule; commit → broker ack
//! and commit → slot confirmed.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use outbox_relay::lsn::Lsn;
use tokio::task::JoinHandle;
use tokio_postgres::{Client, Statement};

use super::Bench;
use crate::figures::histogram::AckHistogram;
use crate::figures::report::{Report, percentile_ms};
use crate::figures::schedule::{
    Commit, ConfirmLatencies, Confirmation, SteadySchedule, commit_to_confirmed,
};
use crate::pg::{CONFIRMED_POLL, SLOT_RELAY, advance_reference, confirmed_flush, current_lsn};
use crate::procfs::vm_hwm_mib;
use crate::relay_process::{RelayProcess, RelayRun};
use crate::workload::{EVENT_TYPES, ID_STEADY, insert_sql};

/// What the writer did.
struct Written {
    commits: Vec<Commit>,
    /// Transactions that started more than an interval after they were due.
    late: u64,
    wall: Duration,
}

/// Everything the steady phase measured.
struct Steady {
    schedule: SteadySchedule,
    late: u64,
    /// commit → broker ack, the warm-up left out.
    acks: AckHistogram,
    confirm: ConfirmLatencies,
    startup: Duration,
    rss_mib: f64,
}

impl Bench {
    pub(super) async fn steady(&mut self) -> Result<()> {
        let schedule = SteadySchedule::new(self.args.rate, self.args.duration);
        println!(
            "\n== 2. Steady rate: {} events/s ({} transactions/s of {}) for {} s, \
             --status-interval {} ==",
            schedule.rate(),
            schedule.tx_per_s,
            schedule.batch,
            self.args.duration.as_secs(),
            self.args.status_interval
        );
        // Move the reference slot along too, so it does not hold the WAL.
        advance_reference(&self.control).await?;

        let mut relay = self.spawn_relay(&RelayRun::plain(None))?;
        let startup = relay.wait_streaming().await?;
        self.startups.push(startup);

        let writer = self.pg.client().await;
        let stmt = writer.prepare(&insert_sql(ID_STEADY)).await?;
        let warm_acks = self.warm_up(&mut relay, &writer, &stmt, &schedule).await?;

        let stop = Arc::new(AtomicBool::new(false));
        let limit = self.args.duration + Duration::from_secs(30);
        let poller = self.poll_confirmed(limit, Arc::clone(&stop)).await;
        let written = write(&writer, &stmt, &schedule).await?;
        println!(
            "wrote {} events in {:.2} s ({} transactions started late)",
            schedule.events(),
            written.wall.as_secs_f64(),
            written.late
        );

        // Wait for the slot to pass the last commit (what is still unconfirmed
        // after that is reported), then stop the pollers.
        let last_lsn = written.commits.last().map_or(Lsn::ZERO, |c| c.lsn);
        self.wait_confirmed(&mut relay, last_lsn, Duration::from_secs(20))
            .await?;
        tokio::time::sleep(CONFIRMED_POLL * 5).await;
        stop.store(true, Ordering::Relaxed);
        let confirmations = poller.await.context("poller task")??;
        let rss_mib = vm_hwm_mib(relay.pid()).unwrap_or(f64::NAN);
        let acks = relay.commit_to_ack()?.minus(&warm_acks);
        relay.stop();

        let steady = Steady {
            confirm: commit_to_confirmed(&written.commits, &confirmations),
            schedule,
            late: written.late,
            acks,
            startup,
            rss_mib,
        };
        print_steady(&steady);
        report_steady(&mut self.report, &steady, &self.args.status_interval);
        Ok(())
    }

    /// Warm-up, not measured: one row per event type, waited for until the slot is
    /// confirmed past it. A fresh relay first fetches each topic's metadata, and its
    /// walsender first re-reads WAL from the slot's restart_lsn; neither is steady state
    /// (start-up is measured apart). Returns the relay's histogram after it.
    async fn warm_up(
        &self,
        relay: &mut RelayProcess,
        writer: &Client,
        stmt: &Statement,
        schedule: &SteadySchedule,
    ) -> Result<AckHistogram> {
        // After the rows the schedule writes.
        let warm_first = schedule.events() as i64;
        let warm_last = warm_first + EVENT_TYPES.len() as i64 - 1;
        writer.execute(stmt, &[&warm_first, &warm_last]).await?;
        let warm_lsn = current_lsn(writer).await?;
        if !self
            .wait_confirmed(relay, warm_lsn, Duration::from_secs(60))
            .await?
        {
            bail!("the warm-up transaction was not confirmed within 60 s");
        }
        relay.commit_to_ack()
    }

    /// The confirmed-position poller, on its own connection: every advance of the relay's
    /// slot and when it was seen, until `stop` or `limit`.
    async fn poll_confirmed(
        &self,
        limit: Duration,
        stop: Arc<AtomicBool>,
    ) -> JoinHandle<Result<Vec<Confirmation>>> {
        let client = self.pg.client().await;
        tokio::spawn(async move {
            let mut seen: Vec<Confirmation> = Vec::new();
            let deadline = Instant::now() + limit;
            for _ in 0..(limit.as_millis() / CONFIRMED_POLL.as_millis() + 1) {
                let lsn = confirmed_flush(&client, SLOT_RELAY).await?;
                if seen.last().is_none_or(|last| lsn > last.lsn) {
                    seen.push(Confirmation {
                        at: Instant::now(),
                        lsn,
                    });
                }
                if stop.load(Ordering::Relaxed) || Instant::now() >= deadline {
                    break;
                }
                tokio::time::sleep(CONFIRMED_POLL).await;
            }
            Ok(seen)
        })
    }
}

/// The writer: one transaction of `batch` rows every `interval`, on a fixed schedule.
async fn write(writer: &Client, stmt: &Statement, schedule: &SteadySchedule) -> Result<Written> {
    let start = tokio::time::Instant::now();
    let mut commits = Vec::with_capacity(schedule.txs as usize);
    let mut late = 0u64;
    for i in 0..schedule.txs {
        let due = start + schedule.due(i);
        if tokio::time::Instant::now() > due + schedule.interval {
            late += 1;
        }
        tokio::time::sleep_until(due).await;
        let first = schedule.first_row(i) as i64;
        let last = schedule.first_row(i + 1) as i64 - 1;
        writer.batch_execute("BEGIN").await?;
        writer.execute(stmt, &[&first, &last]).await?;
        // Commit time: just before COMMIT is sent (so latencies err high, by the round trip).
        let at = Instant::now();
        writer.batch_execute("COMMIT").await?;
        let lsn = current_lsn(writer).await?;
        commits.push(Commit { at, lsn });
    }
    Ok(Written {
        commits,
        late,
        wall: start.elapsed(),
    })
}

fn print_steady(steady: &Steady) {
    let acks = &steady.acks;
    let unacked = steady.schedule.events().saturating_sub(acks.count);
    println!(
        "commit → broker ack (the relay's histogram), {} events: p50 {:.2} ms, p99 {:.2} ms, \
         p99.9 {:.2} ms, mean {:.2} ms, max ≤ {} ms{}",
        acks.count,
        acks.quantile_ms(0.5),
        acks.quantile_ms(0.99),
        acks.quantile_ms(0.999),
        acks.mean_ms(),
        acks.max_bound_ms(),
        if unacked > 0 {
            format!(" ({unacked} not acknowledged)")
        } else {
            String::new()
        }
    );
    let confirm = &steady.confirm;
    println!(
        "commit → slot confirmed_flush_lsn passed it, {} transactions: \
         p50 {:.1} ms, p99 {:.1} ms, p99.9 {:.1} ms, max {:.1} ms{}",
        confirm.sorted.len(),
        percentile_ms(&confirm.sorted, 0.5),
        percentile_ms(&confirm.sorted, 0.99),
        percentile_ms(&confirm.sorted, 0.999),
        percentile_ms(&confirm.sorted, 1.0),
        if confirm.unconfirmed > 0 {
            format!(" ({} never confirmed)", confirm.unconfirmed)
        } else {
            String::new()
        }
    );
    println!(
        "relay: start-up {:.1} ms, peak RSS {:.1} MiB",
        steady.startup.as_secs_f64() * 1e3,
        steady.rss_mib
    );
}

fn report_steady(r: &mut Report, steady: &Steady, status_interval: &str) {
    let acks = &steady.acks;
    let confirmed = &steady.confirm.sorted;
    let events = steady.schedule.events();
    r.add("steady_rate", steady.schedule.rate());
    r.add("steady_events", events);
    r.add("steady_late_tx", steady.late);
    r.add("steady_status_interval", status_interval);
    r.add("steady_acked", acks.count);
    r.add_f("steady_ack_p50_ms", acks.quantile_ms(0.5), 2);
    r.add_f("steady_ack_p99_ms", acks.quantile_ms(0.99), 2);
    r.add_f("steady_ack_p999_ms", acks.quantile_ms(0.999), 2);
    r.add_f("steady_ack_mean_ms", acks.mean_ms(), 2);
    r.add("steady_ack_max_bound_ms", acks.max_bound_ms());
    r.add("steady_unacked", events.saturating_sub(acks.count));
    r.add_f("steady_confirm_p50_ms", percentile_ms(confirmed, 0.5), 1);
    r.add_f("steady_confirm_p99_ms", percentile_ms(confirmed, 0.99), 1);
    r.add_f("steady_confirm_p999_ms", percentile_ms(confirmed, 0.999), 1);
    r.add_f("steady_confirm_max_ms", percentile_ms(confirmed, 1.0), 1);
    r.add("steady_unconfirmed_tx", steady.confirm.unconfirmed);
    r.add_f("steady_relay_rss_mib", steady.rss_mib, 1);
}
