-- annals schema v3: failure handling. Every failed attempt is a row in
-- failures (so attempt counts survive restarts); an event whose retry policy
-- is spent, or that belongs to a parked stream, is a row in dead_letters.

CREATE TABLE {{.Schema}}.failures (
    id              bigserial   PRIMARY KEY,
    subscriber_id   text        NOT NULL,
    partition       integer     NOT NULL DEFAULT 0,
    event_id        uuid        NOT NULL,
    global_sequence bigint      NOT NULL,
    attempt         integer     NOT NULL CHECK (attempt > 0),
    error           text        NOT NULL,
    failed_at       timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE INDEX failures_by_event ON {{.Schema}}.failures (subscriber_id, event_id);

COMMENT ON TABLE {{.Schema}}.failures IS
    'annals: one row per failed handler attempt; attempt counts survive restarts.';

-- status: open (needs an operator), retry (an operator asked for
-- re-delivery; the live subscriber picks it up), resolved (re-delivered),
-- skipped (resolved without delivery). reason: failed (the policy was spent
-- or the error permanent) or parked (a later event of a stream parked by an
-- earlier failure, kept in order).
CREATE TABLE {{.Schema}}.dead_letters (
    id               bigserial   PRIMARY KEY,
    subscriber_id    text        NOT NULL,
    partition        integer     NOT NULL DEFAULT 0,
    event_id         uuid        NOT NULL,
    global_sequence  bigint      NOT NULL,
    stream_id        text        NOT NULL,
    event_type       text        NOT NULL,
    reason           text        NOT NULL CHECK (reason IN ('failed', 'parked')),
    error            text        NOT NULL,
    error_detail     text        NOT NULL DEFAULT '',
    attempts         integer     NOT NULL DEFAULT 0,
    status           text        NOT NULL DEFAULT 'open'
                                 CHECK (status IN ('open', 'retry', 'resolved', 'skipped')),
    first_failed_at  timestamptz,
    last_failed_at   timestamptz,
    created_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    UNIQUE (subscriber_id, event_id)
);

CREATE INDEX dead_letters_newest ON {{.Schema}}.dead_letters (created_at DESC, id DESC);
CREATE INDEX dead_letters_unresolved ON {{.Schema}}.dead_letters (subscriber_id, partition, stream_id, global_sequence)
    WHERE status IN ('open', 'retry');

COMMENT ON TABLE {{.Schema}}.dead_letters IS
    'annals: events a subscriber could not process (reason failed) or held back behind one (reason parked). No foreign key to events.';

-- A subscriber under the Stop policy halts here until an operator acts.
ALTER TABLE {{.Schema}}.checkpoints
    ADD COLUMN stopped_reason text,
    ADD COLUMN stopped_at     timestamptz;
