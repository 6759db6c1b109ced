-- annals schema v4: the scheduler. timers holds delayed appends until they
-- are due; cron_tasks holds recurring task definitions and cron_ticks one
-- row per fired tick (the exactly-once guard). See the scheduler package.

-- A timer is an append rendered ahead of time (payload: an
-- eventstore.EncodedAppend) that a dispatcher runs when due_at has passed by
-- the scheduler's clock, in the transaction that deletes the row. A timer
-- whose append keeps failing gets attempts and last_error, and failed_at once
-- its attempts are spent: it is then kept (for operators) but not retried.
CREATE TABLE {{.Schema}}.timers (
    id          uuid        NOT NULL PRIMARY KEY,
    due_at      timestamptz NOT NULL,
    stream_id   text        NOT NULL CHECK (stream_id <> ''),
    payload     jsonb       NOT NULL,
    owner       text        CHECK (owner <> ''),
    attempts    integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    last_error  text,
    failed_at   timestamptz,
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE INDEX timers_due ON {{.Schema}}.timers (due_at, id) WHERE failed_at IS NULL;
CREATE INDEX timers_owner ON {{.Schema}}.timers (owner) WHERE owner IS NOT NULL;
CREATE INDEX timers_failed ON {{.Schema}}.timers (failed_at) WHERE failed_at IS NOT NULL;

COMMENT ON TABLE {{.Schema}}.timers IS
    'annals: delayed appends. A dispatcher appends payload (an encoded append) once due_at has passed and deletes the row in the same transaction; failed_at marks a timer whose attempts are spent.';

-- A recurring task: spec is a cron expression (robfig/cron syntax, optional
-- seconds field, descriptors) read in time_zone. Ticks after
-- greatest(last_tick, active_since) are due; active_since moves when the
-- definition changes or the task resumes, so no tick from before fires.
CREATE TABLE {{.Schema}}.cron_tasks (
    name          text        NOT NULL PRIMARY KEY CHECK (name <> ''),
    spec          text        NOT NULL CHECK (spec <> ''),
    time_zone     text        NOT NULL CHECK (time_zone <> ''),
    stream_id     text        NOT NULL CHECK (stream_id <> ''),
    missed        text        NOT NULL CHECK (missed IN ('fire_latest', 'skip_missed')),
    paused        boolean     NOT NULL DEFAULT false,
    active_since  timestamptz NOT NULL,
    last_tick     timestamptz,
    created_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at    timestamptz NOT NULL DEFAULT clock_timestamp()
);

COMMENT ON TABLE {{.Schema}}.cron_tasks IS
    'annals: cron task definitions. last_tick is the last tick fired (or skipped as missed); active_since bounds which ticks may fire.';

-- One row per fired tick, inserted in the transaction that appends the
-- tick's event: a second dispatcher can never fire the same tick again.
-- Old rows are pruned after the scheduler's tick retention.
CREATE TABLE {{.Schema}}.cron_ticks (
    task      text        NOT NULL,
    tick      timestamptz NOT NULL,
    event_id  uuid        NOT NULL,
    fired_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (task, tick)
);

CREATE INDEX cron_ticks_tick ON {{.Schema}}.cron_ticks (tick);

COMMENT ON TABLE {{.Schema}}.cron_ticks IS
    'annals: fired cron ticks, unique per (task, tick): the exactly-once guard of cron tasks.';
