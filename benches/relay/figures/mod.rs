//! The arithmetic behind the figures the bench prints and docs/benchmark.md quotes, apart
//! from the processes and queries that measure them. Pure, so tests/bench.rs tests it from
//! known inputs; these modules use nothing of the bench outside `figures`.

pub(crate) mod histogram;
pub(crate) mod projection;
pub(crate) mod report;
pub(crate) mod rounds;
pub(crate) mod schedule;
