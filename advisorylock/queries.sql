-- Statements of the advisorylock package. $1 and $2 are always the two int4
-- halves of md5(key) (see Key); the two-argument lock functions take them as
-- one 64-bit key in a space separate from the one-bigint-argument functions.

-- name: TryLock
-- A single lock's try, only on a server session that carries the lock
-- session's mark $3 (MarkSession, sent in the same round trip or before):
-- NULL, nothing tried, on another (a pooler in transaction or statement
-- mode ran it on a session that holds another lock session's locks).
SELECT CASE WHEN pg_catalog.current_setting('annals.standby_session', true) IS NOT DISTINCT FROM $3::text
            THEN pg_try_advisory_lock($1::int4, $2::int4) END;

-- name: Lock
-- Waits in the lock queue until the lock is granted; true then. As TryLock,
-- only on a server session with the mark $3: NULL, no wait, on another.
-- (pg_advisory_lock returns void, which IS NOT NULL.)
SELECT CASE WHEN pg_catalog.current_setting('annals.standby_session', true) IS NOT DISTINCT FROM $3::text
            THEN pg_advisory_lock($1::int4, $2::int4) IS NOT NULL END;

-- name: WaitUnbounded
-- Run in the transaction that waits in Lock, before it: the wait is bounded
-- by the caller's context alone, not by a lock_timeout or statement_timeout
-- of the role or the database (a production guard meant for application
-- statements). SET LOCAL: the session's own values are back at COMMIT, for
-- the work done under the lock.
SELECT set_config('lock_timeout', '0', true), set_config('statement_timeout', '0', true);

-- name: Unlock
SELECT pg_advisory_unlock($1::int4, $2::int4);

-- name: UnlockNotify
-- Unlock and announce it: $3 is the channel, $4 the key. The notification is
-- delivered when the statement's transaction commits, after the unlock.
SELECT pg_advisory_unlock($1::int4, $2::int4), pg_notify($3::text, $4::text);

-- name: MarkSession
-- A lock session's mark on its server session (a Standby's, a single
-- lock's), set once at connect ($1, random): TryLocks, TryLock and Lock take
-- nothing on a session that does not carry it. It marks only a session that
-- holds no advisory lock, and otherwise returns no row: one that holds some
-- is another lock session's (a pooler in transaction mode handed it over
-- with another's locks and mark), and marking it again would let this
-- session's statements take those locks again (re-entrant). Marking a
-- session replaces the mark of another lock session that holds nothing on
-- it, whose statements then take nothing there. It returns the server's
-- backend PID too. $2, unless NULL, is the session's idle_session_timeout
-- (Config.FreezeTimeout), set here rather than as a start-up parameter: a
-- pooler in session mode passes a statement on, while PgBouncer refuses
-- start-up parameters it does not know (or drops those listed in its
-- ignore_startup_parameters).
SELECT pg_catalog.set_config('annals.standby_session', $1::text, false), pg_catalog.pg_backend_pid(),
       CASE WHEN $2::text IS NOT NULL THEN pg_catalog.set_config('idle_session_timeout', $2::text, false) END
 WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_locks l
                    WHERE l.locktype = 'advisory' AND l.pid = pg_catalog.pg_backend_pid());

-- name: TryLocks
-- A standby's poll: tries every key of the arrays $1 (k1) and $2 (k2) once,
-- in array order, and returns the 1-based positions of those it took. On a
-- server session without the standby's mark $3 (MarkSession) it takes
-- nothing and returns 0 alone: a pooler in transaction or statement mode
-- ran this statement on another session than the one the standby marked,
-- where a lock would be neither the standby's alone nor freed when it ends.
-- (CASE, not AND: the mark is checked before any lock is tried.)
SELECT k.i
  FROM unnest($1::int4[], $2::int4[]) WITH ORDINALITY AS k(k1, k2, i)
 WHERE CASE WHEN pg_catalog.current_setting('annals.standby_session', true) IS NOT DISTINCT FROM $3::text
            THEN pg_try_advisory_lock(k.k1, k.k2) ELSE false END
UNION ALL
SELECT 0
 WHERE pg_catalog.current_setting('annals.standby_session', true) IS DISTINCT FROM $3::text
 ORDER BY 1;

-- name: UnlockAll
-- Gives back the keys of the arrays $1 (k1) and $2 (k2).
SELECT count(*) FILTER (WHERE pg_advisory_unlock(k.k1, k.k2))
  FROM unnest($1::int4[], $2::int4[]) AS k(k1, k2);

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
