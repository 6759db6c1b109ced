-- A prototype, not annals' contract: the "commit chain", an ordering in
-- which positions are still commit order and known at commit, but an
-- append's rows are written outside any global lock (docs/benchmarks.md,
-- "The commit chain"). Needs the annals schema migrated in the same
-- database (annals dev does that): the input rules are annals' own.
--
-- annals today (append_batch): lock G (held to the end of the transaction)
-- → streams rows → positions → INSERT → COMMIT (its WAL flush under G).
--
-- The chain: streams rows (row locks, in stream order) → G as a session
-- lock, held only to draw a contiguous range of positions [f, l] and to
-- take the transaction lock X(l) → INSERT (in parallel with other appends)
-- → wait until the append that drew f - 1 has ended (a shared lock on
-- X(f - 1)) → COMMIT. A committing append has therefore seen every append
-- with lower positions end, and PostgreSQL makes a transaction visible
-- before it releases its locks: positions become visible in order, as
-- under G. Should the predecessor have rolled back (row f - 1 is not in the
-- table), its own predecessors may still be running: the append then waits
-- for every range lock X below f still held (pg_locks), which covers every
-- append that drew positions before it.
--
-- What stays serialized: drawing the range (a few µs) and the commits, one
-- WAL flush each (a successor cannot commit before its predecessor's locks
-- go, which is after its flush). What no longer is: the streams rows, the
-- INSERT and everything else an append does.
DROP SCHEMA IF EXISTS chain CASCADE;
CREATE SCHEMA chain;
CREATE TABLE chain.raw_events (
    global_sequence bigserial   PRIMARY KEY,
    event_id        uuid        NOT NULL UNIQUE,
    stream_id       text        NOT NULL,
    stream_version  bigint      NOT NULL,
    event_type      text        NOT NULL,
    data            json        NOT NULL,
    metadata        json,
    recorded_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    UNIQUE (stream_id, stream_version)
);
CREATE TABLE chain.events (LIKE annals.events INCLUDING ALL);
CREATE TABLE chain.streams (LIKE annals.streams INCLUDING ALL);
-- New streams' rows are inserted at version 0 before they are locked.
ALTER TABLE chain.streams DROP CONSTRAINT streams_version_check, ADD CHECK (version >= 0);
CREATE SEQUENCE chain.positions;
-- Observations of a tailing reader (see check.sql): at some moment it saw
-- head h and c events at or below it.
CREATE TABLE chain.seen (h bigint, c bigint);

-- The same work as annals.append_batch (migration 0020) with caller IDs not
-- checked (p_check_ids false: what the Go client sends for IDs it made):
-- input rules, streams rows, positions, INSERT, result rows, NOTIFY. Only
-- the ordering differs.
CREATE FUNCTION chain.append_batch(
    p_streams text[], p_expected bigint[], p_append int[], p_index int[], p_ids uuid[],
    p_types text[], p_data text[], p_metadata text[])
RETURNS TABLE (stream_id text, status smallint, event_id uuid, global_sequence bigint,
               stream_version bigint, actual_version bigint)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $fn$
#variable_conflict use_column
DECLARE
    v_appends  int := coalesce(cardinality(p_streams), 0);
    v_events   int := coalesce(cardinality(p_ids), 0);
    v_bad      boolean;
    v_count    int[];
    v_current  bigint[];
    v_state    smallint[];
    v_status   smallint[];
    v_first    bigint;
    v_last     bigint;
    v_now      timestamptz;
    v_data     json[];
    v_void     text;
    v_k        int;
    i          int;
BEGIN
    SELECT bool_or(e.a IS NULL OR e.i IS NULL OR e.id IS NULL
                   OR CASE WHEN e.ord = 1 THEN e.a <> 1 OR e.i <> 1
                           WHEN e.a = p_append[e.ord - 1] THEN e.i <> p_index[e.ord - 1] + 1
                           ELSE e.a <> p_append[e.ord - 1] + 1 OR e.i <> 1 END
                   OR annals.event_input_bad(e.t, e.d, e.m)
                   OR (e.i = 1 AND annals.stream_input_bad(p_streams[e.a], p_expected[e.a], v_events)))
           OR max(e.a) <> v_appends,
           array_agg(e.i ORDER BY e.ord) FILTER (WHERE e.ord = v_events OR p_append[e.ord + 1] <> e.a)
      INTO v_bad, v_count
      FROM unnest(p_append, p_index, p_ids, p_types, p_data, p_metadata) WITH ORDINALITY AS e(a, i, id, t, d, m, ord);
    IF v_bad IS FALSE AND v_events > 16 THEN
        SELECT (SELECT count(DISTINCT x.id) FROM unnest(p_ids) AS x(id)) <> v_events
               OR (SELECT count(DISTINCT a.s) FROM unnest(p_streams) AS a(s)) <> v_appends
          INTO v_bad;
    ELSIF v_bad IS FALSE THEN
        FOR i IN 2 .. v_events LOOP
            v_bad := v_bad OR p_ids[i] = ANY (p_ids[1:i - 1]);
        END LOOP;
        FOR i IN 2 .. v_appends LOOP
            v_bad := v_bad OR p_streams[i] = ANY (p_streams[1:i - 1]);
        END LOOP;
    END IF;
    IF v_bad IS NOT FALSE OR cardinality(v_count) IS DISTINCT FROM v_appends THEN
        RAISE EXCEPTION 'chain: bad input';
    END IF;
    v_status := array_fill(0::smallint, ARRAY[v_appends]);
    v_data := p_data::json[];
    v_now := clock_timestamp();

    -- The streams rows, locked in stream order: new ones inserted at
    -- version 0 (waiting on a concurrent creator), then every one locked.
    -- (A prototype: a refused append to a new stream leaves its row at 0.)
    INSERT INTO chain.streams AS s (stream_id, version, created_at, updated_at)
    SELECT a.id, 0, v_now, v_now FROM unnest(p_streams) AS a(id) ORDER BY a.id
    ON CONFLICT (stream_id) DO NOTHING;
    SELECT array_agg(s.version ORDER BY a.n), array_agg(s.state ORDER BY a.n)
      INTO v_current, v_state
      FROM unnest(p_streams) WITH ORDINALITY AS a(id, n)
      JOIN LATERAL (SELECT x.version, x.state FROM chain.streams x WHERE x.stream_id = a.id FOR UPDATE) s ON true;
    FOR i IN 1 .. v_appends LOOP
        IF v_state[i] <> 0 OR (p_expected[i] = -1 AND v_current[i] = 0)
           OR (p_expected[i] >= 0 AND p_expected[i] <> v_current[i]) THEN
            v_status[i] := 1;
        END IF;
    END LOOP;
    UPDATE chain.streams AS s SET version = v_current[a.n] + v_count[a.n], updated_at = v_now
      FROM unnest(p_streams) WITH ORDINALITY AS a(id, n)
     WHERE s.stream_id = a.id AND v_status[a.n] = 0;

    -- The range: drawn under G, held as a session lock for these three
    -- calls only (released on any error: the block).
    BEGIN
        v_void := pg_advisory_lock(hashtext('chain.G'), 0);
        v_first := nextval('chain.positions');
        v_last := v_first + v_events - 1;
        IF v_events > 1 THEN
            v_void := setval('chain.positions', v_last);
        END IF;
        v_void := pg_advisory_xact_lock(hashtext('chain.X'), (v_last % 2147483647)::int);
        v_void := pg_advisory_unlock(hashtext('chain.G'), 0);
    EXCEPTION WHEN OTHERS OR query_canceled THEN
        v_void := pg_advisory_unlock(hashtext('chain.G'), 0);
        RAISE;
    END;

    RETURN QUERY
        INSERT INTO chain.events AS ev
               (global_sequence, event_id, stream_id, stream_version, event_type, data, metadata, recorded_at)
        SELECT v_first + e.ord - 1, e.id, p_streams[e.a], v_current[e.a] + e.i, e.t, e.d, nullif(e.m, '')::json, v_now
          FROM unnest(p_append, p_index, p_ids, p_types, v_data, p_metadata) WITH ORDINALITY AS e(a, i, id, t, d, m, ord)
         WHERE v_status[e.a] = 0
        RETURNING ev.stream_id, 0::smallint, ev.event_id, ev.global_sequence, ev.stream_version, NULL::bigint;

    -- The chain: wait for the predecessor's end; if it rolled back, for
    -- every range below ours still held.
    IF v_first > 1 THEN
        v_void := pg_advisory_xact_lock_shared(hashtext('chain.X'), ((v_first - 1) % 2147483647)::int);
        IF NOT EXISTS (SELECT 1 FROM chain.events x WHERE x.global_sequence = v_first - 1) THEN
            FOR v_k IN
                SELECT l.objid::bigint::int FROM pg_locks l
                 WHERE l.locktype = 'advisory' AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
                   AND l.classid = hashtext('chain.X')::oid AND l.objsubid = 2 AND l.mode = 'ExclusiveLock'
                   AND l.objid::bigint < v_first % 2147483647 AND l.pid <> pg_backend_pid()
            LOOP
                v_void := pg_advisory_xact_lock_shared(hashtext('chain.X'), v_k);
            END LOOP;
        END IF;
    END IF;
    v_void := pg_notify('chain', v_last::text);
END
$fn$;
