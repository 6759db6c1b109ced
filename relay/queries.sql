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

-- name: NextMatch
-- The position of the first event after $1, through $2, whose type matches
-- the relay's filter ($3, a regular expression as catchup.Filter.Regex
-- gives it; NULL: every type), archived or not: whether the stream lacks
-- events up to the checkpoint (publisher.Start). No row when none.
SELECT global_sequence
  FROM {{.Schema}}.events_all
 WHERE global_sequence > $1 AND global_sequence <= $2
   AND ($3::text IS NULL OR event_type ~ $3::text)
 ORDER BY global_sequence
 LIMIT 1;

-- name: MoveBack
-- A leadership's move of its checkpoint back to $4, from $5, where the
-- leadership found it, fenced by its epoch ($3): its stream lost the events
-- after $4 (publisher.Start). No row: fenced (another leader claimed, or an
-- operator moved the checkpoint since).
UPDATE {{.Schema}}.checkpoints
   SET position = $4, updated_at = clock_timestamp()
 WHERE subscriber_id = $1 AND partition = $2 AND epoch = $3 AND position = $5
RETURNING position;
