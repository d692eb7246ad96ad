#!/usr/bin/env bash
# DEMO ONLY (docker-compose.yml, service demo-writer): once a second, one transaction
# inserts an orders row and its outbox event, alternating OrderCreated / OrderPaid.
# Stops after DEMO_ITERATIONS (default 3600) transactions.
#
# Connection: the usual libpq variables (PGHOST, PGUSER, PGPASSWORD, PGDATABASE).
set -euo pipefail

iterations="${DEMO_ITERATIONS:-3600}"
slot="${DEMO_SLOT:-outbox_relay}"

# The relay creates its slot on first start, and only changes committed after that
# are relayed. Wait for it so the demo's first event is not missed.
slot_exists() {
    psql -XtAq -v slot="$slot" 2>/dev/null <<<"SELECT count(*) FROM pg_replication_slots WHERE slot_name = :'slot'"
}
until [[ "$(slot_exists || true)" == 1 ]]; do
    echo "demo-writer: waiting for the relay to create replication slot $slot"
    sleep 2
done

for ((i = 1; i <= iterations; i++)); do
    if ((i % 2)); then type=OrderCreated; else type=OrderPaid; fi
    psql -Xq -v ON_ERROR_STOP=1 -v n="$i" -v type="$type" <<'SQL'
BEGIN;
INSERT INTO orders (customer, total)
VALUES ('customer-' || (:n % 5), round((random() * 100)::numeric, 2))
RETURNING id AS order_id, customer, total \gset
INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
VALUES ('Order', :'order_id', :'type',
        jsonb_build_object('orderId', :order_id, 'customer', :'customer',
                           'total', :total, 'seq', :n));
COMMIT;
SQL
    echo "demo-writer: committed $type (transaction $i/$iterations)"
    sleep 1
done
echo "demo-writer: done after $iterations transactions"
