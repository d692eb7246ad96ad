-- A least-privilege login role for the relay.
--
-- What the relay needs:
--   * LOGIN and REPLICATION: it opens a logical replication connection, and on its
--     first start creates its slot with
--       SELECT pg_create_logical_replication_slot('outbox_relay', 'pgoutput');
--     which also requires REPLICATION (or superuser).
--     On Amazon RDS / Aurora the REPLICATION attribute cannot be granted; use
--       GRANT rds_replication TO outbox_relay;
--     instead (the relay's start-up check accepts that membership).
--   * CONNECT on the database, USAGE on the schema, SELECT on each outbox table.
--   * With --slot-failover (PostgreSQL 17+): EXECUTE on pg_log_standby_snapshot(), so a
--     standby's copy of a new failover slot is usable within seconds (below).
--   * Nothing else in Postgres. Which slots it created is recorded in Kafka (the
--     lineage topic, --lineage-topic): `outbox-relay setup --print` shows the topic and
--     its ACLs. It does not need to own the outbox table, which means it cannot
--     create the publication (CREATE PUBLICATION ... FOR TABLE needs ownership of
--     the tables): create it as the table owner with 02_publication.sql. The other
--     way round, a relay role that owns the tables (and has CREATE on the database)
--     creates the publication itself on first start.
--
-- CHANGE THE PASSWORD. 'relay-password' matches the docker-compose demo only.

CREATE ROLE outbox_relay WITH LOGIN REPLICATION PASSWORD 'relay-password';

-- The database this script runs in (the demo: app).
DO $$
BEGIN
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO outbox_relay', current_database());
END
$$;

GRANT USAGE ON SCHEMA public TO outbox_relay;
GRANT SELECT ON public.outbox TO outbox_relay;

-- PostgreSQL 16 and later (failover slots need 17): the standby snapshot that makes a
-- standby's synchronized copy of the slot persistent, logged right after the relay
-- creates or marks its failover slot instead of at the primary's next one.
DO $$
BEGIN
    IF to_regprocedure('pg_log_standby_snapshot()') IS NOT NULL THEN
        GRANT EXECUTE ON FUNCTION pg_log_standby_snapshot() TO outbox_relay;
    END IF;
END
$$;
