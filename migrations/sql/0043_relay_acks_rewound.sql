-- annals schema: every rewind of the log a relay found under its JetStream
-- streams, and where each stream and the log last agreed.
--
-- A source database restored from a backup, or failed over to an
-- asynchronous replica that lacked its newest commits, gives the positions
-- of the events it lost to new events. The relay refuses its stream then
-- (its newest message is past the log's head, or another event than the
-- log's at its position), and the stream is made anew. Consumers of the
-- relay (relay/natsconsumer) that handled lost events would acknowledge
-- without handling every new event at or below their last position, as
-- events handled before. So the relay, when it proves the rewind, finds the
-- last position at which its stream and the log agree (a binary search by
-- stream sequence comparing event IDs), records it here with the stream
-- it found (name, creation time), and stamps what consumers need of the
-- rewinds recorded into the metadata of each stream it makes after: a
-- consumer whose place is in a stream made no later than one found
-- rewound, and past where that one agreed, stops at once when it moves to
-- the new stream (relay/doc.go).
--
-- Recorded apart from the checkpoint commit (relay_acks' other columns),
-- and kept, each rewind (a log restored twice is rewound twice, under two
-- streams): a consumer offline through both must be judged by the lower.
-- A JSON array, oldest stream first, of {"stream", "created" (RFC 3339,
-- nanoseconds, UTC), "at"}: a few entries per relay, read and written
-- whole by the relay (relay.Rewinds). Empty: no rewind found.
ALTER TABLE {{.Schema}}.relay_acks
    ADD COLUMN rewinds jsonb NOT NULL DEFAULT '[]'
        CONSTRAINT relay_acks_rewinds_array CHECK (pg_catalog.jsonb_typeof(rewinds) = 'array');

COMMENT ON COLUMN {{.Schema}}.relay_acks.rewinds IS
    'annals: every JetStream stream under which the relay found the log rewound (its newest message past the log''s head, or not the log''s event at its position), oldest first: [{"stream", "created" (RFC 3339), "at": the last position at which that stream and the log agree, 0: none}]; stamped into the metadata of the streams the relay makes after (annals-rewinds), so that consumers past it stop.';
