//! Part 2, the steady rate: a writer commits on a fixed schedule; commit → broker ack
//! and commit → slot confirmed.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use outbox_relay::lsn::Lsn;

use super::Bench;
use crate::figures::report::percentile_ms;
use crate::pg::{CONFIRMED_POLL, SLOT_RELAY, advance_reference, confirmed_flush, current_lsn};
use crate::procfs::vm_hwm_mib;
use crate::relay_process::RelayProcess;
use crate::workload::{EVENT_TYPES, ID_STEADY, insert_sql};

/// Most transactions per second the steady writer commits (one every 10 ms).
const MAX_STEADY_TX_PER_S: u64 = 100;

impl Bench {
    pub(super) async fn steady(&mut self) -> Result<()> {
        let rate = self.args.rate;
        let tx_per_s = rate.clamp(1, MAX_STEADY_TX_PER_S);
        let batch = (rate / tx_per_s).max(1);
        let interval = Duration::from_secs(1) / u32::try_from(tx_per_s).unwrap_or(1);
        let txs = tx_per_s * self.args.duration.as_secs();
        let events = txs * batch;
        println!(
            "\n== 2. Steady rate: {} events/s ({tx_per_s} transactions/s of {batch}) for {} s, \
             --status-interval {} ==",
            batch * tx_per_s,
            self.args.duration.as_secs(),
            self.args.status_interval
        );
        // Move the reference slot along too, so it does not hold the WAL.
        advance_reference(&self.control).await?;

        let mut relay = RelayProcess::spawn(
            &self.relay_bin,
            &self.pg,
            &self.broker.bootstrap_servers(),
            &self.args,
            None,
        )?;
        let startup = relay.wait_streaming().await?;
        self.startups.push(startup);

        // Warm-up, not measured: one row per event type, waited for until the
        // slot is confirmed past it. A fresh relay first fetches each topic's
        // metadata, and its walsender first re-reads WAL from the slot's
        // restart_lsn; neither is steady state (start-up is measured apart).
        let writer = self.pg.client().await;
        let stmt = writer.prepare(&insert_sql(ID_STEADY)).await?;
        let warm_first = (txs * batch) as i64;
        let warm_last = warm_first + EVENT_TYPES.len() as i64 - 1;
        writer.execute(&stmt, &[&warm_first, &warm_last]).await?;
        let warm_lsn = current_lsn(&writer).await?;
        if !self
            .wait_confirmed(&mut relay, warm_lsn, Duration::from_secs(60))
            .await?
        {
            bail!("the warm-up transaction was not confirmed within 60 s");
        }
        let warm_acks = relay.commit_to_ack()?;

        let limit = self.args.duration + Duration::from_secs(30);

        // The confirmed-position poller, on its own connection.
        let poll_client = self.pg.client().await;
        let stop = Arc::new(AtomicBool::new(false));
        let poll_stop = Arc::clone(&stop);
        let poller = tokio::spawn(async move {
            let mut seen: Vec<(Instant, Lsn)> = Vec::new();
            let deadline = Instant::now() + limit;
            for _ in 0..(limit.as_millis() / CONFIRMED_POLL.as_millis() + 1) {
                let lsn = confirmed_flush(&poll_client, SLOT_RELAY).await?;
                if seen.last().is_none_or(|(_, last)| lsn > *last) {
                    seen.push((Instant::now(), lsn));
                }
                if poll_stop.load(Ordering::Relaxed) || Instant::now() >= deadline {
                    break;
                }
                tokio::time::sleep(CONFIRMED_POLL).await;
            }
            Ok::<_, anyhow::Error>(seen)
        });

        // The writer: one transaction of `batch` rows every `interval`, on a fixed schedule.
        let start = tokio::time::Instant::now();
        let mut commits: Vec<(Instant, Lsn)> = Vec::with_capacity(txs as usize);
        let mut behind = 0u64;
        for i in 0..txs {
            let due = start + interval * u32::try_from(i).unwrap_or(u32::MAX);
            if tokio::time::Instant::now() > due + interval {
                behind += 1;
            }
            tokio::time::sleep_until(due).await;
            let first = (i * batch) as i64;
            let last = first + batch as i64 - 1;
            writer.batch_execute("BEGIN").await?;
            writer.execute(&stmt, &[&first, &last]).await?;
            // Commit time: just before COMMIT is sent (so latencies err high, by the round trip).
            let committing = Instant::now();
            writer.batch_execute("COMMIT").await?;
            commits.push((committing, current_lsn(&writer).await?));
        }
        let wrote = start.elapsed();
        let last_lsn = commits.last().map_or(Lsn::ZERO, |c| c.1);
        println!(
            "wrote {events} events in {:.2} s ({behind} transactions started late)",
            wrote.as_secs_f64()
        );

        // Wait for the slot to pass the last commit (what is still unconfirmed
        // after that is reported), then stop the pollers.
        self.wait_confirmed(&mut relay, last_lsn, Duration::from_secs(20))
            .await?;
        tokio::time::sleep(CONFIRMED_POLL * 5).await;
        stop.store(true, Ordering::Relaxed);
        let confirmed = poller.await.context("poller task")??;
        let rss_mib = vm_hwm_mib(relay.pid()).unwrap_or(f64::NAN);
        let acks = relay.commit_to_ack()?.minus(&warm_acks);
        relay.stop();

        // commit → slot confirmed, per transaction.
        let mut to_confirm: Vec<Duration> = Vec::with_capacity(commits.len());
        let mut unconfirmed = 0;
        for (at, lsn) in &commits {
            let i = confirmed.partition_point(|(_, c)| c < lsn);
            match confirmed.get(i) {
                Some((when, _)) => to_confirm.push(when.saturating_duration_since(*at)),
                None => unconfirmed += 1,
            }
        }
        to_confirm.sort();
        let unacked = events.saturating_sub(acks.count);
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
        println!(
            "commit → slot confirmed_flush_lsn passed it, {} transactions: \
             p50 {:.1} ms, p99 {:.1} ms, p99.9 {:.1} ms, max {:.1} ms{}",
            to_confirm.len(),
            percentile_ms(&to_confirm, 0.5),
            percentile_ms(&to_confirm, 0.99),
            percentile_ms(&to_confirm, 0.999),
            percentile_ms(&to_confirm, 1.0),
            if unconfirmed > 0 {
                format!(" ({unconfirmed} never confirmed)")
            } else {
                String::new()
            }
        );
        println!(
            "relay: start-up {:.1} ms, peak RSS {rss_mib:.1} MiB",
            startup.as_secs_f64() * 1e3
        );

        let r = &mut self.report;
        r.add("steady_rate", batch * tx_per_s);
        r.add("steady_events", events);
        r.add("steady_late_tx", behind);
        r.add("steady_status_interval", &self.args.status_interval);
        r.add("steady_acked", acks.count);
        r.add_f("steady_ack_p50_ms", acks.quantile_ms(0.5), 2);
        r.add_f("steady_ack_p99_ms", acks.quantile_ms(0.99), 2);
        r.add_f("steady_ack_p999_ms", acks.quantile_ms(0.999), 2);
        r.add_f("steady_ack_mean_ms", acks.mean_ms(), 2);
        r.add("steady_ack_max_bound_ms", acks.max_bound_ms());
        r.add("steady_unacked", unacked);
        r.add_f("steady_confirm_p50_ms", percentile_ms(&to_confirm, 0.5), 1);
        r.add_f("steady_confirm_p99_ms", percentile_ms(&to_confirm, 0.99), 1);
        r.add_f(
            "steady_confirm_p999_ms",
            percentile_ms(&to_confirm, 0.999),
            1,
        );
        r.add_f("steady_confirm_max_ms", percentile_ms(&to_confirm, 1.0), 1);
        r.add("steady_unconfirmed_tx", unconfirmed);
        r.add_f("steady_relay_rss_mib", rss_mib, 1);
        Ok(())
    }
}
