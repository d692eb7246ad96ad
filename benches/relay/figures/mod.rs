//! The arithmetic behind the figures the bench prints and docs/benchmark.md quotes, apart
//! from the processes and queries that measure them.

pub(crate) mod histogram;
pub(crate) mod projection;
pub(crate) mod report;
pub(crate) mod rounds;
pub(crate) mod schedule;
