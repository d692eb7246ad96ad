//! Part 3, the large transaction: one transaction of M rows, drained by `pg_recvlogical`
//! and by a fresh relay.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::Bench;
use crate::pg::{advance_reference, current_lsn};
use crate::relay_process::RelayRun;
use crate::workload::{ID_LARGE, insert_sql};

impl Bench {
    pub(super) async fn large(&mut self) -> Result<()> {
        let n = self.args.large_tx;
        println!("\n== 3. Large transaction: {n} events in one transaction ==");
        // Nothing streams now: move the reference slot up to here (outside any measurement).
        advance_reference(&self.control).await?;
        let t = Instant::now();
        let stmt = self.control.prepare(&insert_sql(ID_LARGE)).await?;
        self.control
            .execute(&stmt, &[&1i64, &(n as i64)])
            .await
            .context("insert the large transaction")?;
        let end = current_lsn(&self.control).await?;
        let load = t.elapsed();
        println!("inserted in {:.1} s, end LSN {end}", load.as_secs_f64());
        let limit = Duration::from_secs(180 + n / 2_000);

        let reference = self.drain_reference(end, limit).await?;
        println!(
            "pg_recvlogical: {:.2} s ({:.0} events/s); CPU pg_recvlogical {:.2} s, walsender {:.2} s",
            reference.wall.as_secs_f64(),
            reference.events_per_s(n),
            reference.client_cpu_s,
            reference.walsender_cpu_s
        );
        let before = self.broker_records().await?;
        let relay = self
            .drain_relay(end, before + n as i64, limit, &RelayRun::plain(None))
            .await?;
        println!(
            "relay: {:.2} s from spawn to slot confirmed ({:.0} events/s; broker had all after {:.2} s); \
             CPU relay {:.2} s, walsender {:.2} s; peak RSS (VmHWM) {:.1} MiB",
            relay.wall.as_secs_f64(),
            relay.events_per_s(n),
            relay.broker_s(),
            relay.cpu_s,
            relay.walsender_cpu_s,
            relay.rss_mib
        );

        let r = &mut self.report;
        r.add("large_events", n);
        r.add_f("large_load_s", load.as_secs_f64(), 2);
        r.add_f("large_ref_s", reference.wall.as_secs_f64(), 2);
        r.add_f("large_ref_walsender_cpu_s", reference.walsender_cpu_s, 2);
        r.add_f("large_relay_s", relay.wall.as_secs_f64(), 2);
        r.add_f("large_relay_broker_s", relay.broker_s(), 2);
        r.add_f("large_relay_cpu_s", relay.cpu_s, 2);
        r.add_f("large_relay_walsender_cpu_s", relay.walsender_cpu_s, 2);
        r.add_f("large_relay_rss_mib", relay.rss_mib, 1);
        Ok(())
    }
}
