//! Test support: a throwaway Postgres cluster, a mock Kafka cluster, the relay
//! as a subprocess, and the outbox schema.
#![allow(dead_code)]

pub mod fake_http;
pub mod http;
pub mod kafka;
pub mod ldap;
pub mod loopback;
pub mod postgres;
pub mod proxy;
pub mod registry;
pub mod relay;
pub mod sasl;
pub mod tansu;
pub mod world;
