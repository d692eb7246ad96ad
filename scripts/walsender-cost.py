#!/usr/bin/env python3
"""What a walsender spends per outbox row, by row filter and by how its client reads.

The shard projection in docs/benchmark.md#shards rests on two per-row costs of the
walsender: a row its publication's filter rejects, and a row it sends. This measures both on
one WAL, with `pg_recvlogical` as the client: a throwaway PostgreSQL cluster, the bench's
outbox table and payload, N rows in transactions of 100, then one slot per case, each drained
to the end by `pg_recvlogical` while its walsender's CPU is read from /proc.

Cases (publication, client):
  all          no filter; pg_recvlogical writes to /dev/null, reading as fast as it can
  all-bursts   no filter; its output is read 64 KiB per millisecond, so the walsender's
               sends find the client asleep (as a relay that naps in a backlog)
  shard0/4     `--shard 0/4`'s filter (Shard::row_filter: hashtextextended of the key)
  shard0/4-bursts  the same, its output read 64 KiB per millisecond
  none-hash    the same hash, compared with a value it never takes: every row rejected
  none-isnull  `aggregate_id IS NULL`: every row rejected by the cheapest filter

Each case runs REPS times, interleaved; each line splits the walsender's CPU into user and
kernel (sys) time. Usage: scripts/walsender-cost.py [N] [REPS] (default 200000 3). With
PERF_DIR=DIR set, `perf record -e cpu-clock -g` samples each case's walsender into
DIR/CASE-REP.data (`perf report -i ... --no-children --sort dso,sym`); the software clock
event samples where the hardware counters are not available, as on a VM. Needs PostgreSQL's
server binaries and psql (`pg_config --bindir`, else Debian's PostgreSQL 15); run as root, it
starts PostgreSQL as the postgres user.
"""
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time


def bindir():
    try:
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True)
        if out.returncode == 0 and os.path.exists(os.path.join(out.stdout.strip(), "postgres")):
            return out.stdout.strip()
    except OSError:
        pass
    return "/usr/lib/postgresql/15/bin"


BIN = bindir()
ROOT = os.geteuid() == 0
HASH = ("(hashtextextended(COALESCE(aggregate_id, textin(uuid_out(id)), ''), 0) "
        "& 9223372036854775807) % 4")
PUBLICATIONS = {
    "all": "",
    "shard0/4": f" WHERE ({HASH} = 0)",
    "none-hash": f" WHERE ({HASH} = 7)",
    "none-isnull": " WHERE (aggregate_id IS NULL)",
}
CASES = [("all", "all", False), ("all-bursts", "all", True), ("shard0/4", "shard0/4", False),
         ("shard0/4-bursts", "shard0/4", True), ("none-hash", "none-hash", False),
         ("none-isnull", "none-isnull", False)]
# The bench's payload (benches/relay/workload.rs PAYLOAD_SQL): about 330 bytes of JSON.
PAYLOAD = ("jsonb_build_object('order_id', g, 'customer_id', 'cust-' || lpad((g % 5000)::text, 5, "
           "'0'), 'amount_cents', (g * 37) % 100000, 'currency', 'EUR', 'placed_at', "
           "'2024-01-02T03:04:05Z', 'lines', jsonb_build_array(jsonb_build_object('sku', 'SKU-' "
           "|| lpad((g % 977)::text, 4, '0'), 'qty', 1 + g % 5, 'unit_cents', 100 + g % 9000)), "
           "'shipping', jsonb_build_object('name', 'Customer ' || (g % 5000), 'street', "
           "(g % 200) || ' Main Street', 'city', 'Springfield', 'zip', lpad((g % 99999)::text, "
           "5, '0')), 'note', 'left at the front door')")
BURSTS = "import sys, time\nr = sys.stdin.buffer\nwhile r.read1(65536):\n    time.sleep(0.001)\n"


def as_postgres(args):
    return ["runuser", "-u", "postgres", "--"] + args if ROOT else args


def run(args, **kw):
    return subprocess.run(as_postgres(args), check=True, capture_output=True, text=True, **kw)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200000
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    if not os.path.exists(os.path.join(BIN, "pg_recvlogical")):
        sys.exit(f"no pg_recvlogical in {BIN}: apt-get install postgresql-15")
    work = tempfile.mkdtemp(prefix="walsender-cost-")
    if ROOT:
        shutil.chown(work, "postgres")
    port = free_port()
    conn = ["-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "-d", "postgres"]

    def psql(sql):
        return run([f"{BIN}/psql", *conn, "-At", "-c", sql]).stdout.strip()

    run([f"{BIN}/initdb", "-D", f"{work}/data", "-A", "trust", "-U", "postgres"])
    options = (f"-p {port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={work} "
               "-c wal_level=logical -c max_wal_senders=40 -c max_replication_slots=40")
    run([f"{BIN}/pg_ctl", "-D", f"{work}/data", "-l", f"{work}/log", "-o", options, "-w", "start"])
    try:
        psql("CREATE TABLE public.outbox (id uuid PRIMARY KEY, aggregate_type text NOT NULL, "
             "aggregate_id text, event_type text, payload jsonb, "
             "created_at timestamptz NOT NULL DEFAULT now())")
        for name, where in PUBLICATIONS.items():
            psql(f"CREATE PUBLICATION \"{name}\" FOR TABLE public.outbox{where}")
        slots = []
        for rep in range(reps):
            for i, (case, publication, bursts) in enumerate(CASES):
                slot = f"s{rep}_{i}"
                psql(f"SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')")
                slots.append((rep, case, publication, bursts, slot))
        load = f"{work}/load.sql"
        with open(load, "w") as f:
            for t in range(n // 100):
                f.write("INSERT INTO public.outbox (id, aggregate_type, aggregate_id, event_type, "
                        "payload) SELECT ('00000000-0000-0000-0000-' || lpad(to_hex(g), 12, "
                        "'0'))::uuid, 'order', 'order-' || lpad(((g * 7919) % 1000)::text, 4, "
                        f"'0'), 'OrderCreated', {PAYLOAD} "
                        f"FROM generate_series({t * 100 + 1}, {t * 100 + 100}) g;\n")
            f.write("CHECKPOINT;\n")
        os.chmod(load, 0o644)
        run([f"{BIN}/psql", *conn, "-q", "-f", load])
        end = psql("SELECT pg_current_wal_lsn()")
        with open(f"{work}/bursts.py", "w") as f:
            f.write(BURSTS)
        tick = os.sysconf("SC_CLK_TCK")
        print(f"PostgreSQL {psql('SHOW server_version')}, {n} rows of the outbox, 100 per "
              f"transaction; walsender CPU per row of the outbox (/proc, {tick} ticks/s)")
        for rep, case, publication, bursts, slot in slots:
            recv = [f"{BIN}/pg_recvlogical", *conn, f"--slot={slot}", "--start", "--no-loop",
                    "-o", "proto_version=1", "-o", f"publication_names={publication}",
                    "-o", "messages=true", f"--endpos={end}",
                    "-f", "-" if bursts else "/dev/null"]
            env = {**os.environ, "PGAPPNAME": slot}
            client = subprocess.Popen(as_postgres(recv), env=env,
                                      stdout=subprocess.PIPE if bursts else subprocess.DEVNULL)
            reader = None
            if bursts:
                reader = subprocess.Popen([sys.executable, f"{work}/bursts.py"],
                                          stdin=client.stdout)
                client.stdout.close()
            pid, started = None, time.monotonic()
            user = system = 0
            perf = None
            # Bounded: a drain takes seconds; give up after 10 minutes.
            while client.poll() is None and time.monotonic() - started < 600:
                if pid is None:
                    found = psql(f"SELECT pid FROM pg_stat_activity WHERE application_name = "
                                 f"'{slot}' AND backend_type = 'walsender'")
                    pid = int(found) if found else None
                    if pid is not None and os.environ.get("PERF_DIR"):
                        data = f"{os.environ['PERF_DIR']}/{case.replace('/', '_')}-{rep}.data"
                        perf = subprocess.Popen(
                            ["perf", "record", "-q", "-e", "cpu-clock", "-F", "4999", "-g",
                             "-p", str(pid), "-o", data],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                if pid is not None:
                    try:
                        with open(f"/proc/{pid}/stat") as f:
                            fields = f.read().rsplit(")", 1)[1].split()
                        user, system = int(fields[11]), int(fields[12])
                    except OSError:
                        pass
                time.sleep(0.01)
            client.wait(timeout=30)
            if perf:
                perf.send_signal(signal.SIGINT)
                perf.wait(timeout=60)
            if reader:
                reader.wait(timeout=30)
            seconds = (user + system) / tick
            print(f"round {rep + 1} {case:15} {seconds * 1e6 / n:6.2f} µs per row "
                  f"({seconds:.2f} s: user {user / tick:.2f} s, sys {system / tick:.2f} s; wall "
                  f"{time.monotonic() - started:.2f} s)", flush=True)
    finally:
        run([f"{BIN}/pg_ctl", "-D", f"{work}/data", "-m", "fast", "-w", "stop"])
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
