//! The relay benchmark's arithmetic and flags (`benches/relay/`): the figures
//! docs/benchmark.md quotes, computed from known inputs.
//!
//! They are tested here because cargo never runs a harness-less bench target's `#[test]`s:
//! it builds the target with `cfg(test)` but runs its `main`. So the bench's modules that
//! need neither Postgres nor a broker are compiled into this binary as well.

use std::time::{Duration, Instant};

use clap::{CommandFactory, Parser};
use outbox_relay::lsn::Lsn;
use outbox_relay::outbox::Shard;

// What only the bench calls is not dead.
#[allow(dead_code)]
#[path = "../benches/relay/figures/mod.rs"]
mod figures;
#[allow(dead_code)]
#[path = "../benches/relay/flags.rs"]
mod flags;
#[allow(dead_code)]
#[path = "../benches/relay/procfs.rs"]
mod procfs;

use figures::histogram::AckHistogram;
use figures::projection::{ShardDrain, ShardRound};
use figures::report::{Report, per_million, percentile_ms};
use figures::rounds::{RefDrain, RelayDrain, Round, each_round, events_per_s};
use figures::schedule::{Commit, Confirmation, SteadySchedule, commit_to_confirmed};
use flags::{Args, Flags};
use procfs::{ProcStat, parse_vm_hwm_mib};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

// --- The bench: line ------------------------------------------------------------------

#[test]
fn the_report_line_keeps_the_order_and_each_figures_decimals() {
    let mut report = Report::default();
    report.add("cpus", 2);
    report.add_f("ref_s", 3.29449, 3);
    report.add_f("ref_events_per_s", 60713.4, 0);
    report.add_f("relay_broker_s", f64::NAN, 3);
    report.add("drain_ratio_rounds", "0.845,1.670,1.151");
    assert_eq!(
        report.line(),
        "bench: cpus=2 ref_s=3.294 ref_events_per_s=60713 relay_broker_s=NaN \
         drain_ratio_rounds=0.845,1.670,1.151"
    );
}

#[test]
fn cpu_per_million_events_scales_the_seconds_to_a_million() {
    // docs/benchmark.md's latest run: 1.92 s of relay CPU for 200,000 events.
    assert_eq!(format!("{:.3}", per_million(1.92, 200_000)), "9.600");
    assert_eq!(format!("{:.3}", per_million(2.0, 1_000_000)), "2.000");
}

#[test]
fn events_per_second_divide_by_the_wall_time() {
    assert_eq!(events_per_s(200_000, secs(2.5)), 80_000.0);
}

// --- Percentiles of commit → slot confirmed ---------------------------------------------

#[test]
fn a_percentile_is_the_nearest_rank() {
    let sorted: Vec<Duration> = (1..=100).map(ms).collect();
    assert_eq!(percentile_ms(&sorted, 0.5), 50.0);
    assert_eq!(percentile_ms(&sorted, 0.99), 99.0);
    // Rank 99.9 rounds up to the largest: p99.9 of 100 values is the max.
    assert_eq!(percentile_ms(&sorted, 0.999), 100.0);
    assert_eq!(percentile_ms(&sorted, 1.0), 100.0);
    assert_eq!(percentile_ms(&sorted, 0.0), 1.0);
}

#[test]
fn a_percentile_of_one_or_no_value() {
    assert_eq!(percentile_ms(&[ms(7)], 0.99), 7.0);
    assert!(percentile_ms(&[], 0.5).is_nan());
}

// --- The relay's commit → ack histogram --------------------------------------------------

/// A /metrics scrape: 100 events, 50 by 5 ms, 80 by 7.5 ms, all by 10 ms; other series
/// around it, and the buckets out of order.
const METRICS: &str = "\
# HELP outbox_relay_commit_to_ack_seconds Commit to broker ack.
# TYPE outbox_relay_commit_to_ack_seconds histogram
outbox_relay_events_total 100
outbox_relay_commit_to_ack_seconds_bucket{le=\"0.0075\"} 80
outbox_relay_commit_to_ack_seconds_bucket{le=\"0.005\"} 50
outbox_relay_commit_to_ack_seconds_bucket{le=\"0.01\"} 100
outbox_relay_commit_to_ack_seconds_bucket{le=\"0.015\"} 100
outbox_relay_commit_to_ack_seconds_bucket{le=\"+Inf\"} 100
outbox_relay_commit_to_ack_seconds_sum 0.7
outbox_relay_commit_to_ack_seconds_count 100
outbox_relay_in_flight_events 0
";

fn histogram(metrics: &str) -> AckHistogram {
    AckHistogram::parse(metrics).unwrap()
}

#[test]
fn histogram_quantiles_interpolate_inside_their_bucket_as_prometheus_does() {
    let acks = histogram(METRICS);
    assert_eq!(acks.count, 100);
    // Rank 50: the top of the first bucket.
    assert_eq!(format!("{:.2}", acks.quantile_ms(0.5)), "5.00");
    // Rank 99: 19 of the 20 between 7.5 and 10 ms.
    assert_eq!(format!("{:.3}", acks.quantile_ms(0.99)), "9.875");
    assert_eq!(format!("{:.4}", acks.quantile_ms(0.999)), "9.9875");
    assert_eq!(format!("{:.2}", acks.mean_ms()), "7.00");
    // The highest non-empty bucket is 10 ms, not 15.
    assert_eq!(acks.max_bound_ms(), 10.0);
}

#[test]
fn a_histogram_quantile_skips_empty_buckets_and_stops_below_infinity() {
    let acks = histogram(
        "outbox_relay_commit_to_ack_seconds_bucket{le=\"0.001\"} 0
outbox_relay_commit_to_ack_seconds_bucket{le=\"0.0025\"} 0
outbox_relay_commit_to_ack_seconds_bucket{le=\"0.005\"} 10
outbox_relay_commit_to_ack_seconds_bucket{le=\"0.015\"} 18
outbox_relay_commit_to_ack_seconds_bucket{le=\"+Inf\"} 20
outbox_relay_commit_to_ack_seconds_sum 0.3
outbox_relay_commit_to_ack_seconds_count 20
",
    );
    // Rank 5 of the 10 between 2.5 and 5 ms.
    assert_eq!(format!("{:.2}", acks.quantile_ms(0.25)), "3.75");
    // Rank 19 is past the last finite bound: that bound is all that is known.
    assert_eq!(acks.quantile_ms(0.95), 15.0);
    assert_eq!(acks.max_bound_ms(), f64::INFINITY);
}

#[test]
fn the_warm_up_is_taken_out_of_the_histogram() {
    // The warm-up: 10 events between 10 and 15 ms.
    let warm_up = histogram(
        "outbox_relay_commit_to_ack_seconds_bucket{le=\"0.005\"} 0
outbox_relay_commit_to_ack_seconds_bucket{le=\"0.0075\"} 0
outbox_relay_commit_to_ack_seconds_bucket{le=\"0.01\"} 0
outbox_relay_commit_to_ack_seconds_bucket{le=\"0.015\"} 10
outbox_relay_commit_to_ack_seconds_bucket{le=\"+Inf\"} 10
outbox_relay_commit_to_ack_seconds_sum 0.12
outbox_relay_commit_to_ack_seconds_count 10
",
    );
    // The end: the warm-up and METRICS's 100.
    let end = histogram(
        "outbox_relay_commit_to_ack_seconds_bucket{le=\"0.005\"} 50
outbox_relay_commit_to_ack_seconds_bucket{le=\"0.0075\"} 80
outbox_relay_commit_to_ack_seconds_bucket{le=\"0.01\"} 100
outbox_relay_commit_to_ack_seconds_bucket{le=\"0.015\"} 110
outbox_relay_commit_to_ack_seconds_bucket{le=\"+Inf\"} 110
outbox_relay_commit_to_ack_seconds_sum 0.82
outbox_relay_commit_to_ack_seconds_count 110
",
    );
    assert_eq!(end.max_bound_ms(), 15.0);
    let measured = end.minus(&warm_up);
    assert_eq!(measured.count, 100);
    assert_eq!(format!("{:.3}", measured.quantile_ms(0.99)), "9.875");
    assert_eq!(format!("{:.2}", measured.mean_ms()), "7.00");
    assert_eq!(measured.max_bound_ms(), 10.0);
}

#[test]
fn a_scrape_without_the_histogram_is_refused() {
    assert!(AckHistogram::parse("outbox_relay_events_total 5\n").is_err());
}

// --- Backlog rounds: ratios against pg_recvlogical and its walsender ----------------------

/// A round whose reference took `reference_s` and relay `relay_s` seconds.
fn round(index: u64, reference_s: f64, relay_s: f64) -> Round {
    Round {
        index,
        load: secs(2.0),
        avg_payload: "330".to_owned(),
        reference: RefDrain {
            wall: secs(reference_s),
            client_cpu_s: 1.67,
            walsender_cpu_s: 3.27,
        },
        relay: RelayDrain {
            wall: secs(relay_s),
            broker_wall: None,
            startup: ms(33),
            cpu_s: 1.92,
            walsender_cpu_s: 1.79,
            rss_mib: 20.4,
            bench_cpu_s: 1.22,
        },
    }
}

#[test]
fn the_drain_ratio_is_the_relays_rate_over_pg_recvlogicals() {
    let mut r = round(0, 3.0, 2.0);
    assert_eq!(r.ratio(), 1.5);
    assert_eq!(r.reference.events_per_s(300_000), 100_000.0);
    assert_eq!(r.relay.events_per_s(300_000), 150_000.0);
    // Not seen by the broker watcher: no figure rather than a wrong one.
    assert!(r.broker_ratio().is_nan());
    assert!(r.relay.broker_s().is_nan());
    assert!(r.relay.broker_events_per_s(300_000).is_nan());
    r.relay.broker_wall = Some(secs(2.5));
    assert_eq!(r.broker_ratio(), 1.2);
    assert_eq!(r.relay.broker_s(), 2.5);
    assert_eq!(r.relay.broker_events_per_s(300_000), 120_000.0);
}

#[test]
fn the_relays_cpu_is_compared_with_the_walsender_pg_recvlogical_drove() {
    let mut r = round(0, 3.0, 2.0);
    r.relay.cpu_s = 0.94;
    r.reference.walsender_cpu_s = 2.0;
    assert_eq!(format!("{:.3}", r.relay_cpu_vs_ref_walsender()), "0.470");
}

#[test]
fn the_median_round_is_the_middle_one_by_ratio() {
    // docs/benchmark.md's latest run: rounds 0.845, 1.670, 1.151; round 3 is the median.
    let rounds = [
        round(0, 0.845, 1.0),
        round(1, 1.670, 1.0),
        round(2, 1.151, 1.0),
    ];
    let median = Round::median(&rounds).unwrap();
    assert_eq!(median.index + 1, 3);
    assert_eq!(each_round(&rounds, Round::ratio), "0.845,1.670,1.151");
}

#[test]
fn the_median_of_an_even_count_of_rounds_is_the_upper_middle_one() {
    let rounds = [round(0, 2.0, 1.0), round(1, 0.5, 1.0)];
    assert_eq!(Round::median(&rounds).unwrap().index, 0);
    assert!(Round::median(&[]).is_none());
}

#[test]
fn each_rounds_cpu_per_million_events_as_the_bench_line_lists_it() {
    // relay_cpu_per_m_s_rounds=10.850,5.550,9.600 of 200,000 events a round.
    let rounds: Vec<Round> = [2.17, 1.11, 1.92]
        .into_iter()
        .enumerate()
        .map(|(i, cpu_s)| {
            let mut r = round(i as u64, 1.0, 1.0);
            r.relay.cpu_s = cpu_s;
            r
        })
        .collect();
    let listed = each_round(&rounds, |r| per_million(r.relay.cpu_s, 200_000));
    assert_eq!(listed, "10.850,5.550,9.600");
}

#[test]
fn the_peak_rss_is_the_largest_of_the_rounds() {
    let mut rounds = [round(0, 1.0, 1.0), round(1, 1.0, 1.0), round(2, 1.0, 1.0)];
    rounds[0].relay.rss_mib = 19.2;
    rounds[1].relay.rss_mib = f64::NAN;
    rounds[2].relay.rss_mib = 20.4;
    assert_eq!(Round::peak_rss_mib(&rounds), 20.4);
}

// --- The steady phase ----------------------------------------------------------------------

#[test]
fn the_steady_rate_is_written_as_up_to_100_transactions_a_second() {
    // The default: 5,000 events/s for 30 s, 100 transactions/s of 50.
    let schedule = SteadySchedule::new(5_000, Duration::from_secs(30));
    assert_eq!(schedule.tx_per_s, 100);
    assert_eq!(schedule.batch, 50);
    assert_eq!(schedule.interval, ms(10));
    assert_eq!(schedule.txs, 3_000);
    assert_eq!(schedule.events(), 150_000);
    assert_eq!(schedule.rate(), 5_000);
    assert_eq!(schedule.due(3), ms(30));
    assert_eq!(schedule.first_row(3), 150);
}

#[test]
fn a_steady_rate_is_rounded_down_to_whole_rows_per_transaction() {
    let slow = SteadySchedule::new(50, Duration::from_secs(2));
    assert_eq!(slow.tx_per_s, 50);
    assert_eq!(slow.batch, 1);
    assert_eq!(slow.interval, ms(20));
    assert_eq!(slow.events(), 100);
    assert_eq!(SteadySchedule::new(150, Duration::from_secs(1)).rate(), 100);
    assert_eq!(
        SteadySchedule::new(10_050, Duration::from_secs(1)).rate(),
        10_000
    );
}

#[test]
fn a_commit_counts_until_the_first_poll_that_saw_the_slot_past_it() {
    let t0 = Instant::now();
    let lsn = |n: u64| Lsn(n);
    let commits = [
        Commit {
            at: t0,
            lsn: lsn(100),
        },
        Commit {
            at: t0 + ms(10),
            lsn: lsn(200),
        },
        Commit {
            at: t0 + ms(20),
            lsn: lsn(250),
        },
        Commit {
            at: t0 + ms(30),
            lsn: lsn(300),
        },
    ];
    let confirmations = [
        Confirmation {
            at: t0 + ms(50),
            lsn: lsn(150),
        },
        Confirmation {
            at: t0 + ms(64),
            lsn: lsn(250),
        },
    ];
    let latencies = commit_to_confirmed(&commits, &confirmations);
    // 50 ms; 54 ms; 44 ms (confirmed exactly at its position); the last never.
    assert_eq!(latencies.sorted, [ms(44), ms(50), ms(54)]);
    assert_eq!(latencies.unconfirmed, 1);
}

#[test]
fn a_poll_taken_before_the_commit_time_counts_as_no_wait() {
    let t0 = Instant::now();
    let commits = [Commit {
        at: t0 + ms(5),
        lsn: Lsn(100),
    }];
    let confirmations = [Confirmation {
        at: t0,
        lsn: Lsn(100),
    }];
    let latencies = commit_to_confirmed(&commits, &confirmations);
    assert_eq!(latencies.sorted, [Duration::ZERO]);
}

// --- Shards: the projection on K+1 cores --------------------------------------------------

/// One process's CPU seconds are its seconds per million events when the round has a
/// million events.
const MILLION: u64 = 1_000_000;

fn shard_round(relays: &[f64], walsenders: &[f64]) -> ShardRound {
    let count = relays.len() as u32;
    let drains =
        relays
            .iter()
            .zip(walsenders)
            .enumerate()
            .map(|(index, (&relay_s, &walsender_s))| ShardDrain {
                shard: (count > 1).then_some(Shard {
                    index: index as u32,
                    count,
                }),
                owned: MILLION / u64::from(count),
                relay_s,
                walsender_s,
                wall_s: 1.0,
            });
    ShardRound {
        drains: drains.collect(),
    }
}

#[test]
fn shards_project_by_the_busiest_process_when_it_is_the_bound() {
    // docs/benchmark.md, Shards, pair 1 of the five-round runs: K=1 relay 4.40 and
    // walsender 5.15 s per million; K=4 walsenders 2.55, 2.50, 2.75, 2.40, relays 1.30-1.35.
    let one = shard_round(&[4.40], &[5.15]);
    let four = shard_round(&[1.30, 1.35, 1.30, 1.35], &[2.55, 2.50, 2.75, 2.40]);
    assert_eq!(one.busiest_s(), 5.15);
    assert_eq!(four.busiest_s(), 2.75);
    assert_eq!(
        format!("{:.0}", one.projected_by_busiest(MILLION)),
        "194175"
    );
    assert_eq!(
        format!("{:.0}", four.projected_by_busiest(MILLION)),
        "363636"
    );
    let times = four.projected_by_busiest(MILLION) / one.projected_by_busiest(MILLION);
    assert_eq!(format!("{times:.2}"), "1.87");
    // On two cores K=1 is bound by its busiest process ...
    assert_eq!(one.projected(MILLION), one.projected_by_busiest(MILLION));
    // ... K=4 on five by all ten processes' 15.5 s: the table's 1.66 x.
    assert_eq!(format!("{:.2}", four.total_s()), "15.50");
    let times = four.projected(MILLION) / one.projected(MILLION);
    assert_eq!(format!("{times:.2}"), "1.66");
}

#[test]
fn shards_project_by_all_their_cpu_when_k_plus_1_cores_are_the_bound() {
    // docs/benchmark.md, Shards, the loaded machine's K=4 row: busiest 8.45 s, all 45.75 s
    // per million, 109,290 events/s on five cores.
    let four = shard_round(&[6.95, 7.00, 8.45, 6.55], &[4.55, 4.15, 4.10, 4.00]);
    assert_eq!(four.busiest_s(), 8.45);
    assert_eq!(format!("{:.2}", four.total_s()), "45.75");
    assert_eq!(format!("{:.0}", four.projected(MILLION)), "109290");
    // And its K=1 row, 56,657 events/s, bound by the relay's 17.65 s.
    let one = shard_round(&[17.65], &[7.50]);
    assert_eq!(format!("{:.0}", one.projected(MILLION)), "56657");
}

#[test]
fn the_typical_round_takes_each_processs_median_over_the_rounds() {
    let rounds = [
        shard_round(&[1.0, 2.0], &[3.0, 9.0]),
        shard_round(&[5.0, 2.5], &[3.5, 3.0]),
        shard_round(&[2.0, 7.0], &[4.0, 3.2]),
    ];
    let typical = ShardRound::typical(&rounds);
    let relays: Vec<f64> = typical.drains.iter().map(|d| d.relay_s).collect();
    let walsenders: Vec<f64> = typical.drains.iter().map(|d| d.walsender_s).collect();
    assert_eq!(relays, [2.0, 2.5]);
    assert_eq!(walsenders, [3.5, 3.2]);
    // One slow drain (shard 1's walsender at 9.0 in round 1) does not make it the busiest.
    assert_eq!(typical.busiest_s(), 3.5);
    let shards: Vec<Option<Shard>> = typical.drains.iter().map(|d| d.shard).collect();
    assert_eq!(
        shards,
        rounds[0].drains.iter().map(|d| d.shard).collect::<Vec<_>>()
    );
}

#[test]
fn the_typical_round_of_an_even_count_takes_the_upper_middle_value() {
    let rounds = [shard_round(&[1.0], &[4.0]), shard_round(&[3.0], &[2.0])];
    let typical = ShardRound::typical(&rounds);
    assert_eq!(typical.drains[0].relay_s, 3.0);
    assert_eq!(typical.drains[0].walsender_s, 4.0);
    assert!(ShardRound::typical(&[]).drains.is_empty());
}

// --- Flags ------------------------------------------------------------------------------------

fn args(argv: &[&str]) -> Args {
    let argv = std::iter::once("relay").chain(argv.iter().copied());
    Flags::try_parse_from(argv).unwrap().into_args()
}

fn refused(argv: &[&str]) -> bool {
    let argv = std::iter::once("relay").chain(argv.iter().copied());
    Flags::try_parse_from(argv).is_err()
}

#[test]
fn the_flags_are_a_valid_clap_command() {
    Flags::command().debug_assert();
}

#[test]
fn the_defaults_are_the_full_run() {
    let a = args(&["--bench"]);
    assert_eq!(a.events, 200_000);
    assert_eq!(a.rounds, 3);
    assert_eq!(a.rate, 5_000);
    assert_eq!(a.duration, Duration::from_secs(30));
    assert_eq!(a.large_tx, 1_000_000);
    assert!(!a.skip_large);
    assert_eq!(a.brokers, 1);
    assert_eq!(a.partitions, 4);
    assert_eq!(a.status_interval, "100ms");
    assert_eq!(a.delivery, "at-least-once");
    assert_eq!(a.cleanup, "none");
    assert!(a.kafka_properties.is_empty());
    assert!(!a.quick);
    assert_eq!(a.shards, None);
}

#[test]
fn quick_makes_the_sizes_small_unless_they_are_given() {
    let a = args(&["--quick", "--bench"]);
    assert_eq!(a.events, 20_000);
    assert_eq!(a.rounds, 1);
    assert_eq!(a.duration, Duration::from_secs(5));
    assert_eq!(a.large_tx, 100_000);
    assert!(a.quick);
    let a = args(&["--events", "50000", "--quick", "--rounds", "4"]);
    assert_eq!(a.events, 50_000);
    assert_eq!(a.rounds, 4);
}

#[test]
fn only_cargo_bench_runs_the_bench() {
    let flags = |argv: &[&str]| Flags::try_parse_from(argv.iter().copied()).unwrap();
    // `cargo bench --bench relay -- --quick` passes --bench after the flags.
    assert!(flags(&["relay", "--quick", "--bench"]).is_bench_run());
    // `cargo test --benches` passes nothing.
    assert!(!flags(&["relay"]).is_bench_run());
}

#[test]
fn every_flag_keeps_its_name_and_meaning() {
    let a = args(&[
        "--events",
        "200_000",
        "--rounds",
        "5",
        "--rate",
        "10000",
        "--duration",
        "15",
        "--large-tx",
        "0",
        "--brokers",
        "3",
        "--partitions",
        "1",
        "--status-interval",
        "1s",
        "--delivery",
        "exactly-once",
        "--cleanup",
        "delete",
        "-X",
        "linger.ms=0",
        "--kafka-property",
        "compression.type=lz4",
        "--shards",
        "4",
    ]);
    assert_eq!(a.events, 200_000);
    assert_eq!(a.rounds, 5);
    assert_eq!(a.rate, 10_000);
    assert_eq!(a.duration, Duration::from_secs(15));
    // No large transaction of 0 rows: skipped.
    assert!(a.skip_large);
    assert_eq!(a.brokers, 3);
    assert_eq!(a.partitions, 1);
    assert_eq!(a.status_interval, "1s");
    assert_eq!(a.delivery, "exactly-once");
    assert_eq!(a.cleanup, "delete");
    assert_eq!(a.kafka_properties, ["linger.ms=0", "compression.type=lz4"]);
    assert_eq!(a.shards, Some(4));
    assert!(args(&["--skip-large"]).skip_large);
}

#[test]
fn a_flag_given_twice_takes_the_last_value() {
    assert_eq!(args(&["--events", "5", "--events", "6"]).events, 6);
}

#[test]
fn sizes_out_of_range_and_unknown_flags_are_refused() {
    for argv in [
        ["--events", "0"],
        ["--rounds", "0"],
        ["--rate", "0"],
        ["--duration", "0"],
        ["--events", "many"],
        ["--brokers", "0"],
        ["--partitions", "1001"],
        ["--shards", "0"],
        ["--shards", "257"],
        ["--shards", "99999999999"],
        ["--nope", "1"],
    ] {
        assert!(refused(&argv), "{argv:?} accepted");
    }
    assert!(refused(&["stray"]));
    assert!(!refused(&["--brokers", "1000", "--shards", "256"]));
}

// --- /proc ----------------------------------------------------------------------------------

#[test]
fn a_stat_line_is_read_after_the_command_names_last_parenthesis() {
    // A command name may hold spaces and parentheses; utime 250 and stime 37 are fields
    // 14 and 15.
    let stat = "4242 (pg (rcv) x) Z 1 4242 4242 0 -1 4194304 100 0 0 0 250 37 0 0 20 0 1 0 \
                12345 0 0";
    let parsed = ProcStat::parse(stat).unwrap();
    assert_eq!(parsed.state, 'Z');
    assert_eq!(parsed.cpu_ticks, 287);
    assert!(parsed.exited());
    let running = ProcStat::parse(&stat.replace(") Z ", ") S ")).unwrap();
    assert!(!running.exited());
}

#[test]
fn a_truncated_stat_line_is_no_reading() {
    assert!(ProcStat::parse("4242 (relay) S 1 4242").is_none());
    assert!(ProcStat::parse("").is_none());
}

#[test]
fn the_peak_rss_is_vm_hwm_in_mib() {
    let status = "Name:\toutbox-relay\nVmPeak:\t  812345 kB\nVmHWM:\t   20889 kB\nVmRSS:\t 1 kB\n";
    assert_eq!(format!("{:.1}", parse_vm_hwm_mib(status).unwrap()), "20.4");
    assert!(parse_vm_hwm_mib("Name:\tzombie\n").is_none());
}
