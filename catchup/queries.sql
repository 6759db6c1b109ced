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
-- operator's checkpoint set) without waiting for its next commit, and its
-- position one of the leader's own commits whose answer was lost (see
-- "Commits whose outcome is unknown" in the package doc); the stop
-- reason and the dead-letter counts tell it to halt, to re-deliver what an
-- operator released, and whether any stream may be parked. A missing
-- checkpoint row has epoch -1.
--
-- The header travels once, in a row of its own whose event columns are
-- NULL; the event rows carry NULL header columns (a NULL is four bytes on
-- the wire and nothing to decode), so a page costs about what a plain read
-- of the eight event columns does. h is computed once (MATERIALIZED), and
-- the events read up to its head, so both come from one snapshot. No outer
-- ORDER BY: the events come from an index scan feeding the LIMIT, in
-- position order; the client tells the header row by its NULL position,
-- checks the events' order and restores it should a plan ever deliver
-- otherwise. The client asks for every column in binary (the event ID as
-- 16 bytes, positions as 8).
--
-- The events come from the hot table alone. archived is the newest
-- archived position, from the same snapshot: when it is above $1, events
-- after the cursor may be in events_archive, and the client reads the page
-- again with ReadBatchArchive (and goes there directly while its cursor is
-- below the archived position it last saw). A reader past the archive pays
-- one index probe of events_archive per read. ReadBatchArchive is this
-- statement reading "events_all ev" (events_archive UNION ALL events, the
-- two position indexes merged) instead of "events ev": the engine makes it
-- by replacing that one table name.
WITH h AS MATERIALIZED (
    SELECT greatest(a.archived, (SELECT coalesce(max(global_sequence), 0) FROM {{.Schema}}.events)) AS head,
           coalesce(c.epoch, -1) AS epoch, coalesce(c.stopped_reason, '') AS stopped_reason,
           d.retry, d.unresolved, a.archived, coalesce(c.position, 0) AS checkpoint
      FROM (SELECT coalesce(max(global_sequence), 0) AS archived FROM {{.Schema}}.events_archive) a
      LEFT JOIN {{.Schema}}.checkpoints c ON c.subscriber_id = $7 AND c.partition = $5
     CROSS JOIN (SELECT count(*) FILTER (WHERE dl.status = 'retry') AS retry, count(*) AS unresolved
                   FROM {{.Schema}}.dead_letters dl
                  WHERE dl.subscriber_id = $7 AND dl.partition = $5
                    AND dl.status IN ('open', 'retry')) d)
SELECT NULL::bigint, NULL::uuid, NULL::text, NULL::bigint, NULL::text, NULL::json, NULL::json, NULL::timestamptz,
       h.head, h.epoch, h.stopped_reason, h.retry, h.unresolved, h.archived, h.checkpoint
  FROM h
UNION ALL
(SELECT ev.global_sequence, ev.event_id, ev.stream_id, ev.stream_version,
        ev.event_type, ev.data, ev.metadata, ev.recorded_at,
        NULL, NULL, NULL, NULL, NULL, NULL, NULL
   FROM {{.Schema}}.events ev
  WHERE ev.global_sequence > $1
    AND ev.global_sequence <= least((SELECT head FROM h), $6)
    AND ($3::text IS NULL OR ev.event_type ~ $3)
    AND ($4::int <= 1 OR {{.Schema}}.stream_partition(
            CASE $8::text WHEN 'category' THEN split_part(ev.stream_id, '-', 1)
                          WHEN 'metadata' THEN coalesce(ev.metadata ->> $9::text, '')
                          ELSE ev.stream_id END, $4) = $5)
  ORDER BY ev.global_sequence
  LIMIT $2);

-- name: CommitFenced
-- A projection batch's fenced checkpoint move, sent in one round trip with
-- the transaction's COMMIT (Lease.CommitTx): $1 subscriber, $2 partition,
-- $3 epoch, $4 position, $5 where the leader knows the checkpoint (the
-- cursor its batch started from, or its last commit since). Pipelined, the
-- COMMIT runs unless this statement fails, so a move that is fenced (no row
-- with this epoch) or that finds the checkpoint past $5 (a commit of this
-- leader's whose answer was lost has landed since: see "Commits whose
-- outcome is unknown" in the package doc) must fail rather than change
-- nothing: the cast of a message to int raises it (the message sits in a
-- subquery, so that the planner cannot fold it into an error at plan time),
-- and the client reports checkpoint.ErrFenced or checkpoint.ErrMoved. The
-- message says moved when the row, as this statement's snapshot shows it,
-- still has the epoch: the update may have waited for the landing commit
-- (the row's lock) and seen its position, which the snapshot predates. A
-- new leader's claim taken for a move is caught by the next read's epoch.
WITH moved AS (
    UPDATE {{.Schema}}.checkpoints
       SET position = greatest(position, $4), updated_at = clock_timestamp()
     WHERE subscriber_id = $1 AND partition = $2 AND epoch = $3 AND position <= $5
    RETURNING position)
SELECT CASE WHEN (SELECT count(*) FROM moved) = 1 THEN 1
            ELSE ('annals: checkpoint '
                  || coalesce((SELECT 'moved past ' || $5 FROM {{.Schema}}.checkpoints c
                                WHERE c.subscriber_id = $1 AND c.partition = $2 AND c.epoch = $3), 'fenced')
                  || ', rows moved: ' || (SELECT count(*) FROM moved))::int END;

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
   AND mode = 'ExclusiveLock'
 LIMIT 1;

-- name: LockRequested
-- Whether backend $3 holds or waits for the two-int4 advisory lock ($1, $2)
-- (TakeOver: its session asked for the lock).
SELECT EXISTS (SELECT 1
                 FROM pg_locks
                WHERE locktype = 'advisory'
                  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
                  AND classid = ($1::int4::int8 & 4294967295)::oid
                  AND objid = ($2::int4::int8 & 4294967295)::oid
                  AND objsubid = 2
                  AND pid = $3::int4);

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
-- pg_locks is read once (materialized) and joined. Only exclusive locks
-- count: a batch commit's fence tries the lock shared for a moment
-- (CommitFencedHeld), which is not a holder.
WITH l AS MATERIALIZED (
    SELECT classid, objid, bool_or(granted) AS granted, coalesce(max(pid) FILTER (WHERE granted), 0) AS pid
      FROM pg_locks
     WHERE locktype = 'advisory' AND objsubid = 2 AND mode = 'ExclusiveLock'
       AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
     GROUP BY classid, objid)
SELECT k.i, l.granted, l.pid
  FROM unnest($1::int4[], $2::int4[]) WITH ORDINALITY AS k(k1, k2, i)
  JOIN l ON l.classid = (k.k1::int8 & 4294967295)::oid AND l.objid = (k.k2::int8 & 4294967295)::oid;

-- name: HeldLocks
-- Who holds the locks of the partitions a standby has found held by another
-- session for long (heldRun in heldlock.go), and of that holder's other
-- partitions of the subscriber: run only then, never per poll.
-- $1 subscribers, $2 partitions, $3 and $4 the partitions' two-int4 lock
-- keys, $5 and $6 the keys of the lock a rebuild of each subscriber holds
-- for its whole run (NULL: none), $7 the staleness threshold in
-- microseconds. Per 1-based position i: the holder's backend pid (NULL: free
-- now); the live instance whose heartbeat lists the partition
-- (leadership.HeartbeatLeaderJoin; NULL: none); the checkpoint's owner and
-- how long ago its row last changed, in seconds (NULL: no row); whether a
-- session holds the rebuild's lock; and what pg_stat_activity shows this
-- role of the holder: usename and application_name for every backend, the
-- rest NULL for another role's backend unless this role has
-- pg_read_all_stats (or is a superuser).
WITH l AS MATERIALIZED (
    SELECT classid, objid, pid
      FROM pg_locks
     WHERE locktype = 'advisory' AND objsubid = 2 AND mode = 'ExclusiveLock' AND granted
       AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))
SELECT k.i, h.pid, heartbeat_leader.instance_id, c.owner,
       extract(epoch FROM now() - c.updated_at)::float8,
       EXISTS (SELECT 1 FROM l
                WHERE l.classid = (k.r1::int8 & 4294967295)::oid AND l.objid = (k.r2::int8 & 4294967295)::oid),
       a.usename::text, a.application_name, host(a.client_addr), a.backend_start, a.state, a.state_change
  FROM unnest($1::text[], $2::int4[], $3::int4[], $4::int4[], $5::int4[], $6::int4[])
       WITH ORDINALITY AS k(subscriber_id, partition, k1, k2, r1, r2, i)
  LEFT JOIN {{.Schema}}.checkpoints cp ON cp.subscriber_id = k.subscriber_id AND cp.partition = k.partition
 CROSS JOIN LATERAL (SELECT k.subscriber_id, k.partition, cp.epoch, cp.owner, cp.updated_at) AS c
  LEFT JOIN LATERAL (
        SELECT min(l.pid) AS pid FROM l
         WHERE l.classid = (k.k1::int8 & 4294967295)::oid AND l.objid = (k.k2::int8 & 4294967295)::oid
       ) AS h ON true
  {{.HeartbeatLeader "c" "$7"}}
  LEFT JOIN pg_stat_activity a ON a.pid = h.pid;

-- name: CommitFencedHeld
-- CommitFenced for a lease held on the engine's lock session, while the
-- batch runs on another connection: the move also needs the partition's
-- lock ($5, $6) to be held by some session as the statement runs, so that a
-- leader whose lock session has ended commits nothing even before anyone
-- else has claimed (the epoch fences it once someone has). The test is a
-- try for the lock in shared mode, for this transaction: it fails while a
-- session holds the lock (exclusively: the leader's lock session, or a new
-- leader, which the epoch then fences), and succeeds only when the lock is
-- free, and then the statement fails and its transaction rolls back,
-- giving the shared lock back at once. It costs a lock-table probe where
-- reading pg_locks (which copies the whole lock table) cost about 0.1 ms of
-- server CPU per batch. $7 is CommitFenced's $5: where the leader knows
-- the checkpoint; the move fails as moved when the row still has the epoch
-- and the lock is held.
-- When fenced, its error names the server session it ran on: on the
-- one that holds the lock (a pooler in transaction mode ran the batch on
-- the lock session's server session, where the shared try succeeds
-- although the lock is held), no commit through that pooler can succeed,
-- and the engine says so (it knows the lock session's server PID). (A
-- look at the lock table here instead cost 0.13 ms of planning per
-- commit in the Exec and SimpleProtocol modes, which plan every call.)
WITH moved AS (
    UPDATE {{.Schema}}.checkpoints
       SET position = greatest(position, $4), updated_at = clock_timestamp()
     WHERE subscriber_id = $1 AND partition = $2 AND epoch = $3
       AND NOT pg_try_advisory_xact_lock_shared($5::int4, $6::int4)
       AND position <= $7
    RETURNING position)
SELECT CASE WHEN (SELECT count(*) FROM moved) = 1 THEN 1
            WHEN EXISTS (SELECT FROM {{.Schema}}.checkpoints c
                          WHERE c.subscriber_id = $1 AND c.partition = $2 AND c.epoch = $3)
                 AND NOT pg_try_advisory_xact_lock_shared($5::int4, $6::int4)
            THEN ('annals: checkpoint moved past ' || $7 || ', rows moved: ' || (SELECT count(*) FROM moved))::int
            ELSE ('annals: checkpoint fenced, rows moved: ' || (SELECT count(*) FROM moved)
                  || ', server session ' || pg_catalog.pg_backend_pid())::int END;

-- name: ReadHeader
-- ReadBatch's header from the primary when the events come from a read
-- replica (Config.ReadPool): $1 subscriber, $2 partition. The checkpoint's
-- epoch, stop reason and dead-letter counts must be the primary's, not a
-- replica's that may lag behind this leader's own claim.
SELECT coalesce(c.epoch, -1), coalesce(c.stopped_reason, ''), d.retry, d.unresolved, coalesce(c.position, 0)
  FROM (SELECT 1) one
  LEFT JOIN {{.Schema}}.checkpoints c ON c.subscriber_id = $1 AND c.partition = $2
 CROSS JOIN (SELECT count(*) FILTER (WHERE dl.status = 'retry') AS retry, count(*) AS unresolved
               FROM {{.Schema}}.dead_letters dl
              WHERE dl.subscriber_id = $1 AND dl.partition = $2
                AND dl.status IN ('open', 'retry')) d;

-- name: AsyncCommit
-- Queued before the COMMIT of a batch read while its partition was behind
-- its head (Lease.CommitConn): that commit does not wait for its WAL
-- flush. The read model and the checkpoint commit or are lost together, so
-- a crash of the server loses at most the last fraction of a second of
-- batches, which are then applied again from the checkpoint: exactly once
-- still holds. Not when this transaction appended events (or deleted a
-- stream), which must be durable before anyone can see them. An append
-- holds the append lock until its transaction ends, so if this transaction
-- appended, its event is the newest one it sees: the test is whether the
-- newest event's xmin is this transaction's ID or one of its
-- subtransactions'. xmin is 32 bits: d, its distance above the low 32 bits
-- of this transaction's ID (modulo 2^32), is 0 for this transaction itself;
-- a subtransaction's ID is a little above it (d in 1..2^20), and then
-- pg_xact_status of the full ID says "in progress" exactly for this
-- transaction's own (other transactions still in progress are invisible
-- here; an append under a savepoint rolled back is gone, with its lock).
-- Any other xmin (older, possibly frozen or from before an epoch wrap) is
-- never given to pg_xact_status, which fails on IDs it cannot place. The
-- newest event is always in the hot table (archiving leaves it there).
-- The first batch that reaches the head commits synchronously, flushing
-- every one before it.
SELECT set_config('synchronous_commit', 'off', true)
 WHERE NOT EXISTS (
       SELECT 1
         FROM (SELECT e.xmin FROM {{.Schema}}.events e ORDER BY e.global_sequence DESC LIMIT 1) e,
              LATERAL (SELECT pg_current_xact_id()::text::bigint AS x) cur,
              LATERAL (SELECT (e.xmin::text::bigint - (cur.x & 4294967295)) & 4294967295 AS d) dist
        WHERE CASE WHEN dist.d = 0 THEN true
                   WHEN dist.d <= 1048576 THEN pg_xact_status((cur.x + dist.d)::text::xid8) = 'in progress'
                   ELSE false END);


-- name: RecordLayout
-- $1 subscriber, $2 partitions, $3 partition key (canonical: see
-- layoutOf). Records the subscriber's layout when it
-- has none and its checkpoints allow it, or replaces it while every
-- checkpoint of the subscriber is at 0 (nothing was processed: a first run
-- with a mistaken layout, or every partition reset), bumping every
-- checkpoint's epoch so that leaders of the old layout are fenced, and
-- announcing each bump on the fence channel (checkpoint.FencePayload; the
-- RETURNING of a data-modifying CTE is computed for every row even though
-- nothing reads it), so that an idle one lets go at once. A subscriber that ran
-- before layouts were recorded (migration 0022) has a checkpoint for each
-- partition it claimed: with no gap (0..k) its count was k+1; with gaps (a
-- first run interrupted, checkpoints created by hand) it had more than its
-- highest checkpointed partition. Returns whether it inserted or replaced,
-- the layout recorded before (NULL when none is visible), the highest
-- checkpointed partition (NULL: none), the number of checkpoints, and
-- whether any moved past 0. A rebuild (a checkpoint owned by "rebuild:…",
-- projection.RebuildOwnerPrefix) sets checkpoints back to 0 while its
-- layout stands: that counts as moved, or an instance of another layout
-- still running would take the layout from under the rebuild.
WITH cp AS (
    SELECT max(c.partition) AS highest, count(*) AS n,
           coalesce(bool_or(c.position > 0 OR starts_with(coalesce(c.owner, ''), 'rebuild:')), false) AS moved
      FROM {{.Schema}}.checkpoints c WHERE c.subscriber_id = $1),
ins AS (
    INSERT INTO {{.Schema}}.subscriber_layouts AS l (subscriber_id, partitions, partition_by)
    SELECT $1, $2, $3 FROM cp
     WHERE cp.highest IS NULL OR NOT cp.moved
        OR (cp.n = cp.highest + 1 AND cp.highest = $2 - 1)
        OR (cp.n < cp.highest + 1 AND cp.highest < $2)
    ON CONFLICT (subscriber_id) DO UPDATE
       SET partitions = excluded.partitions, partition_by = excluded.partition_by, recorded_at = clock_timestamp()
     WHERE (l.partitions, l.partition_by) IS DISTINCT FROM (excluded.partitions, excluded.partition_by)
       AND NOT (SELECT cp.moved FROM cp)
    RETURNING l.xmax::text <> '0' AS replaced),
bump AS (
    UPDATE {{.Schema}}.checkpoints c SET epoch = c.epoch + 1, owner = NULL, updated_at = clock_timestamp()
     WHERE c.subscriber_id = $1 AND EXISTS (SELECT 1 FROM ins WHERE ins.replaced)
    RETURNING {{.AnnounceFence "c.subscriber_id" "c.partition"}})
SELECT EXISTS (SELECT 1 FROM ins), l.partitions, l.partition_by, cp.highest, cp.n, cp.moved
  FROM cp LEFT JOIN {{.Schema}}.subscriber_layouts l ON l.subscriber_id = $1;

-- name: Claim
-- checkpoint.Store's Claim ($1 subscriber, $2 partition, $3 owner: the row
-- created at position 0 or its epoch bumped), made only while the
-- subscriber's recorded layout is $4 partitions by $5: a layout replaced
-- (RecordLayout) after this engine checked it refuses the claim, so no
-- leader of the old layout starts after the replacement. No row: refused.
{{define "claim"}}INSERT INTO {{.Schema}}.checkpoints AS c (subscriber_id, partition, position, epoch, owner)
SELECT $1, $2, 0, 1, $3
 WHERE EXISTS (SELECT 1 FROM {{.Schema}}.subscriber_layouts l
                WHERE l.subscriber_id = $1 AND l.partitions = $4 AND l.partition_by = $5)
ON CONFLICT (subscriber_id, partition) DO UPDATE
   SET epoch = c.epoch + 1, owner = EXCLUDED.owner, updated_at = clock_timestamp()
RETURNING position, epoch, owner, updated_at{{end}}{{template "claim" .}};

-- name: ClaimAnnounced
-- Claim, announced on the fence channel (checkpoint.FencePayload) when
-- it claims: TakeOver's claims, which fence a leader that may be waiting
-- idle for new events (see "Announcing a fence" in the package doc). The
-- notification is delivered when the claim's transaction commits.
WITH claimed AS ({{template "claim" .}})
SELECT cl.position, cl.epoch, cl.owner, cl.updated_at
  FROM claimed cl, {{.AnnounceFence "$1" "$2"}} n;

-- name: ClaimUnbounded
-- The timeouts of TakeOver's claims, for their transaction only: no
-- lock_timeout or statement_timeout of the role's or the database's (a
-- production guard meant for application statements) cuts a claim short
-- while the checkpoint row is held for a moment (a batch's commit in
-- flight); the caller's context bounds it, as it bounds the wait for the
-- lock (advisorylock's WaitUnbounded).
SELECT pg_catalog.set_config('lock_timeout', '0', true), pg_catalog.set_config('statement_timeout', '0', true);

-- name: ClaimLockTimeout
-- The lock_timeout ($1) of a claim on the lock session, for its transaction
-- only: a checkpoint row held elsewhere must not hold up the session's
-- poller, which serves every partition of the process.
SELECT pg_catalog.set_config('lock_timeout', $1, true);

-- name: Layout
-- The subscriber's recorded layout: partitions, partition_by.
SELECT partitions, partition_by FROM {{.Schema}}.subscriber_layouts WHERE subscriber_id = $1;
