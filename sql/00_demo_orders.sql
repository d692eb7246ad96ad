-- DEMO ONLY: the business table the docker-compose demo writer inserts into.
-- Your own schema replaces it; the relay never reads this table (it is not in the
-- publication), it only shows the business row and the outbox row committed together.

CREATE TABLE IF NOT EXISTS public.orders (
    id         bigserial PRIMARY KEY,
    customer   text,
    total      numeric,
    created_at timestamptz DEFAULT now()
);
