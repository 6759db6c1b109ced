-- Statements of the advisorylock package. $1 and $2 are always the two int4
-- halves of md5(key) (see Key); the two-argument lock functions take them as
-- one 64-bit key in a space separate from the one-bigint-argument functions.

-- name: TryLock
SELECT pg_try_advisory_lock($1::int4, $2::int4);

-- name: Unlock
SELECT pg_advisory_unlock($1::int4, $2::int4);

-- name: Held
-- pg_locks shows a two-int4 advisory key as classid = k1 and objid = k2,
-- both of type oid (unsigned 32-bit), with objsubid = 2. A negative int4
-- becomes its unsigned value through int8 & 0xFFFFFFFF.
SELECT EXISTS (
  SELECT 1
    FROM pg_locks
   WHERE locktype = 'advisory'
     AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
     AND classid = ($1::int4::int8 & 4294967295)::oid
     AND objid = ($2::int4::int8 & 4294967295)::oid
     AND objsubid = 2
     AND pid = pg_backend_pid()
     AND granted
);

-- name: Rollback
ROLLBACK;
