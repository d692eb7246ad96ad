//! End-to-end benchmark of the relay: `cargo bench --bench relay [-- FLAGS]`.
//!
//! It starts a throwaway Postgres (the integration tests' harness) and
//! librdkafka's in-process mock Kafka cluster, both on 127.0.0.1, and runs the
//! release `outbox-relay` binary as a subprocess, as users run it. Three parts:
//!
//! 1. **Backlog drain**, in rounds (median reported). Two slots see the same
//!    WAL: N outbox rows are loaded while neither is read. `pg_recvlogical` (pgoutput, to /dev/null)
//!    drains one: Postgres's own decode rate, the reference. The relay drains
//!    the other until the slot's `confirmed_flush_lsn` reaches the end, which it
//!    moves only after broker acks. CPU comes from `/proc/<pid>/stat` (relay,
//!    `pg_recvlogical`, and the walsender backend each drives), peak RSS from
//!    `VmHWM` in `/proc/<pid>/status`.
//! 2. **Steady rate.** A writer commits fixed-size transactions on a fixed
//!    schedule; latency is commit → broker ack from the relay's own
//!    `outbox_relay_commit_to_ack_seconds` histogram (read from its /metrics)
//!    and commit → slot confirmed (polled every 2 ms). No consumer reads the
//!    topics: the mock broker serves fetches by a linear scan of a partition's
//!    batches, which grows with the run and would take a core from the relay.
//! 3. **Large transaction.** One transaction of M rows, drained by
//!    `pg_recvlogical` and by a fresh relay: time and the relay's peak RSS.
//!
//! Output: human-readable lines, then one `bench: key=value ...` line with
//! every figure. The method and a sample run are in docs/benchmark.md.
//!
//! `--shards K` runs none of the three parts: K shard relays (`--shard I/K`; 1: one relay
//! without it) drain each round's backlog one after the other, and the bench reports each
//! relay's and walsender's CPU per event of the whole outbox and the drain K+1 cores would
//! reach (events / the larger of the busiest process's CPU seconds and all their CPU seconds
//! over K+1).
//!
//! `--formats` runs none of them either: each round drains N rows with the relay's own
//! format and N more with Avro keys and values (`--key-converter avro --value-converter avro`
//! through the tests' Schema Registry, in the bench process), alternating which goes first,
//! and the bench reports the relay's CPU per event of each, their ratio, and the registry
//! requests the Avro relays made (one per subject and relay start: never one per event).
//!
//! The modules: `flags` (the command line), `figures` (the arithmetic behind every figure,
//! pure and unit-tested in tests/bench.rs), `procfs` (CPU and memory from /proc),
//! `binaries`, `pg` (the slots and the queries that watch them), `workload` (the rows),
//! `kafka` (the mock cluster), `relay_process` (a relay run and its process), and `bench`
//! (the drains and the parts that run them).
//!
//! Flags: `cargo bench --bench relay -- --help` (flags.rs). cargo passes `--bench` to a
//! bench it runs as a benchmark; without it (`cargo test --benches` runs bench targets
//! too) the bench runs nothing.

// Test support: its `expect`s are on loopback set-up, not on relay output.
#[allow(clippy::expect_used)]
#[path = "../../tests/support/http.rs"]
mod http;
#[path = "../../tests/support/postgres.rs"]
mod postgres;
#[allow(dead_code, clippy::expect_used)]
#[path = "../../tests/support/registry.rs"]
mod registry;

mod bench;
mod binaries;
mod figures;
mod flags;
mod kafka;
mod pg;
mod procfs;
mod relay_process;
mod workload;

use std::process::ExitCode;

use clap::Parser;

use flags::Flags;

fn main() -> ExitCode {
    // Prints clap's refusal (or --help) and exits.
    let flags = Flags::parse();
    if !flags.is_bench_run() {
        println!(
            "outbox-relay benchmark: not run without cargo's --bench (`cargo test` runs bench \
             targets too); run it with `cargo bench --bench relay [-- FLAGS]`"
        );
        return ExitCode::SUCCESS;
    }
    let args = flags.into_args();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(bench::run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
