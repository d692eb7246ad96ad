//! Integration tests: one binary (`autotests = false`) with real Postgres
//! clusters (initdb in a temp dir) and a real Kafka-protocol broker
//! (librdkafka's mock cluster, or tansu in its own process), driving the
//! `outbox-relay` binary.

// Test code: a failed expectation is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

mod backfill;
mod bench;
mod broker_process;
mod cleanup;
mod cloud;
mod cloudevents;
mod debezium_records;
mod demo;
mod deploy;
mod docs;
mod e2e;
mod exactly_once;
mod failover;
mod failures;
mod harness;
mod lineage;
mod ops;
mod outages;
mod partitions;
mod peek;
mod poison;
mod publication;
mod registry;
mod registry_client;
mod reliability;
mod shards;
mod simulation;
mod slot_hygiene;
mod startup;
mod stop;
mod tls;
