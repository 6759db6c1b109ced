-- annals schema: a timer's payload keeps its bytes.
--
-- timers.payload held a timer's encoded append (an eventstore.EncodedAppend)
-- as jsonb, which rewrote it on the way in: keys sorted, duplicate keys
-- dropped, numbers respelled (1e2 as 100, and 1e131000 as its 131,001
-- digits, so that a 1.5 KB timer of a hundred such numbers was stored, and
-- sent again when it fired, as 13 MB, past the client's MaxEventBytes),
-- and a number beyond numeric's range failed Schedule with a bare 22003.
-- As json the payload is the text the scheduler wrote, byte for byte, and
-- the dispatcher sends it as stored (measuring each event again against
-- MaxEventBytes). Rows stored before keep jsonb's rendering.
--
-- The scheduler reads payload with the operators json shares with jsonb
-- (->, ->>), and only as the whole text otherwise.
ALTER TABLE {{.Schema}}.timers ALTER COLUMN payload TYPE json USING payload::json;

COMMENT ON COLUMN {{.Schema}}.timers.payload IS
    'annals: the timer''s encoded append (an eventstore.EncodedAppend) as the scheduler wrote it, byte for byte; sent as stored when the timer fires.';
