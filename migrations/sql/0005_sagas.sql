-- annals schema v5: saga instances. One row per (saga, correlation ID):
-- its JSON state, a version for optimistic concurrency (the number of events
-- the instance has handled), and whether it has completed. Timestamps come
-- from the saga's configured clock. Completed rows older than the saga's
-- retention are deleted by its leader.

CREATE TABLE {{.Schema}}.saga_states (
    saga           text        NOT NULL CHECK (saga <> ''),
    correlation_id text        NOT NULL CHECK (correlation_id <> ''),
    state          jsonb       NOT NULL,
    version        bigint      NOT NULL CHECK (version > 0),
    completed      boolean     NOT NULL DEFAULT false,
    created_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    completed_at   timestamptz,
    PRIMARY KEY (saga, correlation_id),
    CHECK (completed = (completed_at IS NOT NULL))
);

CREATE INDEX saga_states_completed ON {{.Schema}}.saga_states (saga, completed_at) WHERE completed;

COMMENT ON TABLE {{.Schema}}.saga_states IS
    'annals: saga instances: state (JSON), version (events handled; optimistic concurrency), completed. Written only in the saga''s batch transaction, with its checkpoint.';
