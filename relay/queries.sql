-- name: Origin
-- Where the log is: the cluster (pg_control_system's system identifier,
-- which a physical standby shares with its primary, so a failover keeps it)
-- and the database.
SELECT (SELECT system_identifier::text FROM pg_catalog.pg_control_system()), pg_catalog.current_database();

-- name: Database
-- The database alone, for a role that may not run pg_control_system.
SELECT pg_catalog.current_database();

-- name: EventAt
-- The ID of the event at a position of the log, archived or not (an index
-- probe on each table): whether the stream's newest message is this log's
-- event (lastStored). No row once retention has scavenged the position.
SELECT event_id::text FROM {{.Schema}}.events_all WHERE global_sequence = $1;

-- name: MoveBack
-- A leadership's move of its checkpoint back to $4, from $5, where the
-- leadership found it, fenced by its epoch ($3): its stream lost the events
-- after $4 (publisher.Start). No row: fenced (another leader claimed, or an
-- operator moved the checkpoint since).
UPDATE {{.Schema}}.checkpoints
   SET position = $4, updated_at = clock_timestamp()
 WHERE subscriber_id = $1 AND partition = $2 AND epoch = $3 AND position = $5
RETURNING position;

-- name: LoadAcked
-- What the relay's stream had acknowledged at its last checkpoint commit
-- (RecordAcked): the stream's name, creation time (Unix nanoseconds), the
-- sequence of its last acknowledged message and the checkpoint committed
-- with it; and where a refill of what the stream lost ends, and the stream
-- sequence acknowledged before the loss (RecordRefill; 0: none under way).
-- No row: none recorded yet (publisher.Start).
SELECT stream, stream_created_ns, stream_sequence, position, refill_to, refill_seq
  FROM {{.Schema}}.relay_acks
 WHERE subscriber_id = $1 AND partition = $2;

-- name: RecordRefill
-- Records, in the transaction of a move back (MoveBack), that the relay
-- publishes again what its stream lost up to $3, the checkpoint it found,
-- and that the stream had acknowledged through sequence $4 before it lost
-- them: events refused for good up to there are passed over while the
-- events left outnumber the messages left to publish again (the surplus
-- is what an operator moved past: publisher.mayPassOver), also by the
-- leaderships that go on with the refill. A refill begun before and not
-- finished keeps its end.
UPDATE {{.Schema}}.relay_acks
   SET refill_to = GREATEST(refill_to, $3), refill_seq = GREATEST(refill_seq, $4),
       updated_at = clock_timestamp()
 WHERE subscriber_id = $1 AND partition = $2;

-- name: RecordAcked
-- Records, in the transaction of a checkpoint commit at position $7, that
-- stream $4 (made at $5, Unix nanoseconds) had acknowledged through sequence
-- $6; fenced by the epoch ($3) as the commit is (no row inserted or
-- updated: fenced). A refill under way (RecordRefill) ends once the
-- checkpoint reaches its end, or with another stream.
INSERT INTO {{.Schema}}.relay_acks AS a (subscriber_id, partition, stream, stream_created_ns, stream_sequence, position)
SELECT c.subscriber_id, c.partition, $4, $5, $6, $7
  FROM {{.Schema}}.checkpoints c
 WHERE c.subscriber_id = $1 AND c.partition = $2 AND c.epoch = $3
ON CONFLICT (subscriber_id, partition) DO UPDATE
   SET stream = EXCLUDED.stream, stream_created_ns = EXCLUDED.stream_created_ns,
       stream_sequence = EXCLUDED.stream_sequence, position = EXCLUDED.position,
       refill_to = CASE WHEN EXCLUDED.position < a.refill_to AND EXCLUDED.stream = a.stream
                          AND EXCLUDED.stream_created_ns = a.stream_created_ns
                        THEN a.refill_to ELSE 0 END,
       refill_seq = CASE WHEN EXCLUDED.position < a.refill_to AND EXCLUDED.stream = a.stream
                          AND EXCLUDED.stream_created_ns = a.stream_created_ns
                         THEN a.refill_seq ELSE 0 END,
       updated_at = clock_timestamp();

-- name: CountRefill
-- The events from position $1 through $2 that the relay publishes (of its
-- types: $3, a regular expression, or '' for every type), archived or not:
-- what is left of a refill (publisher.mayPassOver).
SELECT count(*) FROM {{.Schema}}.events_all
 WHERE global_sequence BETWEEN $1 AND $2 AND ($3 = '' OR event_type ~ $3);

-- name: LoadRewinds
-- The rewinds of the log the relay found under its streams (RecordRewinds):
-- a JSON array, oldest stream first, of {"stream", "created", "at"}
-- (relay.Rewinds). No row: none recorded (nor anything committed). Stamped
-- into the streams EnsureStream makes.
SELECT rewinds FROM {{.Schema}}.relay_acks WHERE subscriber_id = $1 AND partition = 0;

-- name: LockRewinds
-- LoadRewinds, locking the row until RecordRewinds in the same transaction
-- (recordRewound): two relays recording at once keep both rewinds.
SELECT rewinds FROM {{.Schema}}.relay_acks WHERE subscriber_id = $1 AND partition = 0 FOR UPDATE;

-- name: EnsureAcksRow
-- Makes relay $1's row when it has none yet (nothing committed since
-- migration 0036), so that a rewind found (recordRewound) can be recorded
-- in it: the message of stream $2 (made at $3, Unix nanoseconds) at
-- sequence $4, agreeing with the log at position $5, is recorded as what
-- the stream had acknowledged, which it had. A row there is left as it is.
INSERT INTO {{.Schema}}.relay_acks (subscriber_id, partition, stream, stream_created_ns, stream_sequence, position)
VALUES ($1, 0, $2, $3, $4, $5)
ON CONFLICT (subscriber_id, partition) DO NOTHING;

-- name: RecordRewinds
-- Replaces relay $1's rewinds with $2 (read by LockRewinds in
-- the same transaction, one added or lowered: recordRewound). Not fenced:
-- a rewind is a fact about a stream and the log, not the leadership's.
UPDATE {{.Schema}}.relay_acks SET rewinds = $2, updated_at = clock_timestamp()
 WHERE subscriber_id = $1 AND partition = 0;

-- name: Migrated
-- Reads nothing; fails when the schema lacks what the relay uses: the
-- schema or a table missing (3F000, 42P01: migrations.MarkNotMigrated), or
-- relay_acks older than migration 0037 or 0043 (42703: notMigrated).
-- EnsureStream runs it first, so that a relay on a schema not migrated says
-- so before it makes or checks a stream.
SELECT (SELECT 1 FROM {{.Schema}}.events_all LIMIT 0),
       (SELECT 1 FROM {{.Schema}}.checkpoints LIMIT 0),
       (SELECT refill_to + refill_seq FROM {{.Schema}}.relay_acks LIMIT 0),
       (SELECT rewinds FROM {{.Schema}}.relay_acks LIMIT 0);
