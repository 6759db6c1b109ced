-- annals schema: a timer's payload keeps its bytes.
--
-- timers.payload held a timer's encoded append (an eventstore.EncodedAppend)
-- as jsonb, which rewrote it on the way in: keys sorted, duplicate keys
-- dropped, numbers respelled (1e2 as 100, and 1e131000 as its 131,001
-- digits, so that a 1.5 KB timer of a hundred such numbers was stored, and
-- sent again when it fired, as 13 MB, past the client's MaxEventBytes),
-- and a number beyond numeric's range failed Schedule with a bare 22003.
-- New timers are stored in payload_json, as json: the text the scheduler
-- wrote, byte for byte, sent as stored when the timer fires (each event
-- measured again against MaxEventBytes). Rows stored before keep their
-- jsonb payload, and payload_json NULL; the scheduler reads
-- coalesce(payload_json::text, payload::text).
--
-- Not ALTER COLUMN payload TYPE json: that rewrites the table and rebuilds
-- its indexes under an ACCESS EXCLUSIVE lock, held until the whole upgrade
-- commits (Up applies the pending migrations in one transaction), and every
-- dispatcher, Cancel and Schedule waits meanwhile (a million timers took
-- seconds). A nullable column without a default, a column with a constant
-- default (lost_races, below), dropping a NOT NULL and a NOT VALID check
-- change the catalog only: none of them reads or writes a row (the new
-- column's CHECK holds for the default, which no row stores).
--
-- lost_races counts a timer's consecutive failures that are no fault of
-- its own (a serialization failure, a deadlock): they are not attempts,
-- but their retries back off, and after many in a row one counts as an
-- attempt, so that a timer that can never win ends failed (the scheduler's
-- fail). The check holds for every row written from now on; the rows before
-- it all have a payload (the column was NOT NULL), so validating it (a scan
-- of the table, under this transaction's lock) would prove nothing new.
ALTER TABLE {{.Schema}}.timers
    ADD COLUMN payload_json json,
    ADD COLUMN lost_races integer NOT NULL DEFAULT 0 CHECK (lost_races >= 0),
    ALTER COLUMN payload DROP NOT NULL,
    ADD CONSTRAINT timers_payload_present
        CHECK (payload IS NOT NULL OR payload_json IS NOT NULL) NOT VALID;

COMMENT ON COLUMN {{.Schema}}.timers.payload IS
    'annals: the encoded append (an eventstore.EncodedAppend) of a timer stored before migration 0033, as jsonb rendered it; NULL for later timers, whose payload is payload_json.';
COMMENT ON COLUMN {{.Schema}}.timers.lost_races IS
    'annals: consecutive serialization failures and deadlocks of the timer''s append, not counted in attempts; reset by a counted attempt.';
COMMENT ON COLUMN {{.Schema}}.timers.payload_json IS
    'annals: the timer''s encoded append (an eventstore.EncodedAppend) as the scheduler wrote it, byte for byte; sent as stored when the timer fires. NULL for a timer stored before migration 0033 (its payload is in payload).';
