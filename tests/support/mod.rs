//! Test support: a throwaway Postgres cluster, a mock Kafka cluster, the relay
//! as a subprocess, and the outbox schema.
#![allow(dead_code)]

pub mod http;
pub mod kafka;
pub mod postgres;
pub mod proxy;
pub mod relay;
pub mod tansu;
pub mod world;
