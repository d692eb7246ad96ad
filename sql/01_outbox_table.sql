-- The outbox table, in the layout the relay's defaults expect:
--   --id-column id, --route-by event_type, --key-column aggregate_id,
--   --payload-column payload. (Debezium's defaults name the columns aggregatetype,
--   aggregateid and type; either rename here or set the flags.)
--
-- Write one row per event in the same transaction as the business change it
-- describes. The relay relays committed INSERTs only; UPDATEs and DELETEs of
-- outbox rows are never turned into records.
--
-- Cleanup: the relay reads the WAL, not the table, so a row is no longer needed
-- once its transaction has committed. Two common ways to keep the table small:
--
--   1. Delete the row in the same transaction, right after inserting it:
--        BEGIN;
--        INSERT INTO orders ...;
--        INSERT INTO outbox (...) VALUES (...) RETURNING id;   -- id into :event_id
--        DELETE FROM outbox WHERE id = :event_id;
--        COMMIT;
--      This is fine for WAL-based capture: the INSERT is still in the WAL and is
--      decoded and relayed; the table never grows. Debezium's outbox documentation
--      recommends the same. The DELETE is not published (publish = 'insert' in
--      02_publication.sql), and the relay would ignore it anyway.
--   2. Delete old rows periodically, e.g.
--        DELETE FROM outbox WHERE created_at < now() - interval '1 day';
--      Keeping rows for a while helps when you need to look at or re-send an event.
--
-- Either way, deleting a row never "un-sends" it: once committed, the event is in
-- the WAL and will be relayed.

CREATE TABLE IF NOT EXISTS public.outbox (
    id             uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    event_type     text        NOT NULL,
    payload        jsonb,
    created_at     timestamptz NOT NULL DEFAULT now()
);
