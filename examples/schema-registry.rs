//! The tests' Schema Registry (`tests/support/registry.rs`) as a process, for
//! `scripts/debezium-fixtures/generate.sh`: Confluent's Java converters run against it, which
//! proves it speaks their API. `cargo run --example schema-registry [PORT]` prints
//! `listening PORT` once it accepts connections, and serves until killed.

// A test tool: a failed start is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/support/registry.rs"]
#[allow(dead_code)]
mod registry;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let port = std::env::args()
        .nth(1)
        .map(|p| p.parse().expect("PORT is a number"))
        .unwrap_or(0);
    let registry = registry::Registry::start_on(port)
        .await
        .expect("bind 127.0.0.1:PORT");
    println!("listening {}", registry.port());
    std::future::pending::<()>().await;
}
