-- Statements of the catch-up engine.

-- name: ReadBatch
-- $1 after (exclusive), $2 limit, $3 type regex or NULL, $4 partitions,
-- $5 partition, $6 upper bound (inclusive), $7 subscriber, $8 the partition
-- key ('stream', 'category': the stream ID up to its first '-', 'metadata':
-- the metadata field $9 as text, '' when absent). The head comes
-- from the same snapshot as the events: every committed event up to it is
-- visible, so when fewer than $2 rows match, everything through the head (up
-- to $6) has been considered and the checkpoint may move there. The
-- checkpoint's epoch lets an idle leader notice that it has been fenced (an
-- operator's checkpoint set) without waiting for its next commit; the stop
-- reason and the dead-letter counts tell it to halt, to re-deliver what an
-- operator released, and whether any stream may be parked. No column is
-- NULL (so the client scans into plain values): a missing checkpoint row
-- has epoch -1, and when no event matches, the one row has position 0.
--
-- There is no ORDER BY outside the LATERAL: the one header row drives a
-- nested loop over the ordered, limited events, which come out in position
-- order; an outer ORDER BY made PostgreSQL sort the 500 wide rows again
-- (EXPLAIN ANALYZE: 0.71 ms per page, 0.54 ms of it the sort). The client
-- checks the order and restores it should a plan ever deliver otherwise.
--
-- The events come from the hot table alone. archived is the newest
-- archived position, from the same snapshot: when it is above $1, events
-- after the cursor may be in events_archive, and the client reads the page
-- again with ReadBatchArchive (and goes there directly while its cursor is
-- below the archived position it last saw). A reader past the archive pays
-- one index probe of events_archive per page.
SELECT h.head, coalesce(h.epoch, -1), coalesce(h.stopped_reason, ''), h.retry, h.unresolved, h.archived,
       coalesce(e.global_sequence, 0), coalesce(e.event_id, '00000000-0000-0000-0000-000000000000'),
       coalesce(e.stream_id, ''), coalesce(e.stream_version, 0), coalesce(e.event_type, ''),
       e.data, e.metadata, coalesce(e.recorded_at, 'epoch')
  FROM (SELECT greatest(a.archived, (SELECT coalesce(max(global_sequence), 0) FROM {{.Schema}}.events)) AS head,
               a.archived, c.epoch, c.stopped_reason, d.retry, d.unresolved
          FROM (SELECT coalesce(max(global_sequence), 0) AS archived FROM {{.Schema}}.events_archive) a
          LEFT JOIN {{.Schema}}.checkpoints c ON c.subscriber_id = $7 AND c.partition = $5
          CROSS JOIN (SELECT count(*) FILTER (WHERE dl.status = 'retry') AS retry, count(*) AS unresolved
                        FROM {{.Schema}}.dead_letters dl
                       WHERE dl.subscriber_id = $7 AND dl.partition = $5
                         AND dl.status IN ('open', 'retry')) d) h
  LEFT JOIN LATERAL (
        SELECT ev.global_sequence, ev.event_id, ev.stream_id, ev.stream_version,
               ev.event_type, ev.data, ev.metadata, ev.recorded_at
          FROM {{.Schema}}.events ev
         WHERE ev.global_sequence > $1
           AND ev.global_sequence <= least(h.head, $6)
           AND ($3::text IS NULL OR ev.event_type ~ $3)
           AND ($4::int <= 1 OR {{.Schema}}.stream_partition(
                   CASE $8::text WHEN 'category' THEN split_part(ev.stream_id, '-', 1)
                                 WHEN 'metadata' THEN coalesce(ev.metadata ->> $9::text, '')
                                 ELSE ev.stream_id END, $4) = $5)
         ORDER BY ev.global_sequence
         LIMIT $2) e ON true;

-- name: ReadBatchArchive
-- ReadBatch for a cursor below the newest archived position: the same
-- header, the events from events_all (archived and hot events, the two
-- position indexes merged).
SELECT h.head, coalesce(h.epoch, -1), coalesce(h.stopped_reason, ''), h.retry, h.unresolved, h.archived,
       coalesce(e.global_sequence, 0), coalesce(e.event_id, '00000000-0000-0000-0000-000000000000'),
       coalesce(e.stream_id, ''), coalesce(e.stream_version, 0), coalesce(e.event_type, ''),
       e.data, e.metadata, coalesce(e.recorded_at, 'epoch')
  FROM (SELECT greatest(a.archived, (SELECT coalesce(max(global_sequence), 0) FROM {{.Schema}}.events)) AS head,
               a.archived, c.epoch, c.stopped_reason, d.retry, d.unresolved
          FROM (SELECT coalesce(max(global_sequence), 0) AS archived FROM {{.Schema}}.events_archive) a
          LEFT JOIN {{.Schema}}.checkpoints c ON c.subscriber_id = $7 AND c.partition = $5
          CROSS JOIN (SELECT count(*) FILTER (WHERE dl.status = 'retry') AS retry, count(*) AS unresolved
                        FROM {{.Schema}}.dead_letters dl
                       WHERE dl.subscriber_id = $7 AND dl.partition = $5
                         AND dl.status IN ('open', 'retry')) d) h
  LEFT JOIN LATERAL (
        SELECT ev.global_sequence, ev.event_id, ev.stream_id, ev.stream_version,
               ev.event_type, ev.data, ev.metadata, ev.recorded_at
          FROM {{.Schema}}.events_all ev
         WHERE ev.global_sequence > $1
           AND ev.global_sequence <= least(h.head, $6)
           AND ($3::text IS NULL OR ev.event_type ~ $3)
           AND ($4::int <= 1 OR {{.Schema}}.stream_partition(
                   CASE $8::text WHEN 'category' THEN split_part(ev.stream_id, '-', 1)
                                 WHEN 'metadata' THEN coalesce(ev.metadata ->> $9::text, '')
                                 ELSE ev.stream_id END, $4) = $5)
         ORDER BY ev.global_sequence
         LIMIT $2) e ON true;

-- name: CommitFenced
-- A projection batch's fenced checkpoint move, sent in one round trip with
-- the transaction's COMMIT (Lease.CommitTx): $1 subscriber, $2 partition,
-- $3 epoch, $4 position. Pipelined, the COMMIT runs unless this statement
-- fails, so a fenced move (no row with this epoch) must fail rather than
-- change nothing: the cast of a message to int raises it (the message sits
-- in a subquery, so that the planner cannot fold it into an error at plan
-- time), and the client reports checkpoint.ErrFenced.
WITH moved AS (
    UPDATE {{.Schema}}.checkpoints
       SET position = greatest(position, $4), updated_at = clock_timestamp()
     WHERE subscriber_id = $1 AND partition = $2 AND epoch = $3
    RETURNING position)
SELECT CASE WHEN (SELECT count(*) FROM moved) = 1 THEN 1
            ELSE ('annals: checkpoint fenced, rows moved: ' || (SELECT count(*) FROM moved))::int END;

-- name: Head
SELECT greatest((SELECT coalesce(max(global_sequence), 0) FROM {{.Schema}}.events),
                (SELECT coalesce(max(global_sequence), 0) FROM {{.Schema}}.events_archive));

-- name: LockHolder
-- The backend holding the two-int4 advisory lock ($1, $2) in this database,
-- or no row when it is free. pg_locks shows the key as classid = k1 and
-- objid = k2, both oid (unsigned 32-bit), with objsubid = 2.
SELECT pid
  FROM pg_locks
 WHERE locktype = 'advisory'
   AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
   AND classid = ($1::int4::int8 & 4294967295)::oid
   AND objid = ($2::int4::int8 & 4294967295)::oid
   AND objsubid = 2
   AND granted
 LIMIT 1;

-- name: NotifyCheckpoint
-- Sent after a batch's COMMIT, in the same round trip, as a transaction of
-- its own: tells projection.Await that subscriber $3's partition $2 has
-- committed through position $1 (channel payload "position:partition:
-- subscriber"). Not inside the batch's transaction: a transaction that
-- NOTIFYs holds PostgreSQL's notification-queue lock from its commit
-- until its WAL flush is done, and every append NOTIFYs too, so each
-- batch commit would add a WAL flush to the appends' serial chain. This
-- transaction writes no data and commits without waiting for its flush
-- (synchronous_commit off, for it alone), so it holds that lock only
-- for a moment. A lost notification costs an awaiter its poll interval.
SELECT set_config('synchronous_commit', 'off', true),
       pg_notify({{.CheckpointChannel}}, $1::bigint::text || ':' || $2::int::text || ':' || $3::text);

-- name: LockStates
-- The lock session's look at who holds what: of the two-int4 advisory keys
-- in the arrays $1 (k1) and $2 (k2), the 1-based positions of those some
-- session holds or waits for, whether one holds it (granted) and the
-- holder's backend pid (0 when none holds it). A key not returned is free.
-- pg_locks is read once (materialized) and joined.
WITH l AS MATERIALIZED (
    SELECT classid, objid, bool_or(granted) AS granted, coalesce(max(pid) FILTER (WHERE granted), 0) AS pid
      FROM pg_locks
     WHERE locktype = 'advisory' AND objsubid = 2
       AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
     GROUP BY classid, objid)
SELECT k.i, l.granted, l.pid
  FROM unnest($1::int4[], $2::int4[]) WITH ORDINALITY AS k(k1, k2, i)
  JOIN l ON l.classid = (k.k1::int8 & 4294967295)::oid AND l.objid = (k.k2::int8 & 4294967295)::oid;

-- name: CommitFencedHeld
-- CommitFenced for a lease held on the engine's lock session, while the
-- batch runs on another connection: the move also needs the lock session
-- ($5, its backend pid) to hold the partition's lock ($6, $7) as the
-- statement runs, so that a leader whose lock session has ended commits
-- nothing even before anyone else has claimed (the epoch fences it once
-- someone has).
WITH moved AS (
    UPDATE {{.Schema}}.checkpoints
       SET position = greatest(position, $4), updated_at = clock_timestamp()
     WHERE subscriber_id = $1 AND partition = $2 AND epoch = $3
       AND EXISTS (SELECT 1 FROM pg_locks
                    WHERE locktype = 'advisory' AND granted AND objsubid = 2 AND pid = $5
                      AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
                      AND classid = ($6::int4::int8 & 4294967295)::oid
                      AND objid = ($7::int4::int8 & 4294967295)::oid)
    RETURNING position)
SELECT CASE WHEN (SELECT count(*) FROM moved) = 1 THEN 1
            ELSE ('annals: checkpoint fenced, rows moved: ' || (SELECT count(*) FROM moved))::int END;

-- name: ReadHeader
-- ReadBatch's header from the primary when the events come from a read
-- replica (Config.ReadPool): $1 subscriber, $2 partition. The checkpoint's
-- epoch, stop reason and dead-letter counts must be the primary's, not a
-- replica's that may lag behind this leader's own claim.
SELECT coalesce(c.epoch, -1), coalesce(c.stopped_reason, ''), d.retry, d.unresolved
  FROM (SELECT 1) one
  LEFT JOIN {{.Schema}}.checkpoints c ON c.subscriber_id = $1 AND c.partition = $2
 CROSS JOIN (SELECT count(*) FILTER (WHERE dl.status = 'retry') AS retry, count(*) AS unresolved
               FROM {{.Schema}}.dead_letters dl
              WHERE dl.subscriber_id = $1 AND dl.partition = $2
                AND dl.status IN ('open', 'retry')) d;
