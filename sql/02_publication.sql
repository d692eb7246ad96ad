-- The publication the relay streams (--publication, default outbox_relay).
--
-- publish = 'insert': only inserts are sent, so UPDATEs/DELETEs of outbox rows
-- (cleanup) never travel to the relay. Run this as the owner of the outbox table
-- (or a superuser): CREATE PUBLICATION ... FOR TABLE needs ownership of every
-- listed table and CREATE on the database.
--
-- If the publication does not exist at start-up, the relay runs exactly this
-- statement itself (for every --table), which only works when its role owns the
-- tables. With a least-privilege role (03_relay_role.sql), create it here instead.
--
-- More outbox tables later:
--   ALTER PUBLICATION outbox_relay ADD TABLE billing.outbox;

CREATE PUBLICATION outbox_relay FOR TABLE public.outbox WITH (publish = 'insert', publish_via_partition_root = true);
