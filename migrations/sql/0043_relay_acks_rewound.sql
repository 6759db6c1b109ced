-- annals schema: where a relay's JetStream stream and the log last agreed,
-- when the relay found the log rewound under its stream.
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
-- it found (name, creation time), and stamps it into the metadata of each
-- stream it makes after that one: a consumer whose place is past it stops
-- at once when it moves to the new stream (relay/doc.go).
--
-- Recorded apart from the checkpoint commit (relay_acks' other columns),
-- and kept: the stamp holds for any consumer whose place is in the stream
-- found rewound or one made before it. NULL: no rewind found.
ALTER TABLE {{.Schema}}.relay_acks
    ADD COLUMN rewound_stream text,
    ADD COLUMN rewound_created_ns bigint,
    ADD COLUMN rewound_at bigint CHECK (rewound_at >= 0),
    ADD CONSTRAINT relay_acks_rewound_whole CHECK (
        (rewound_stream IS NULL) = (rewound_at IS NULL) AND (rewound_created_ns IS NULL) = (rewound_at IS NULL));

COMMENT ON COLUMN {{.Schema}}.relay_acks.rewound_stream IS
    'annals: the JetStream stream in which the relay found the log rewound (its newest message past the log''s head, or not the log''s event at its position); NULL: none.';

COMMENT ON COLUMN {{.Schema}}.relay_acks.rewound_created_ns IS
    'annals: the creation time (Unix nanoseconds) of rewound_stream.';

COMMENT ON COLUMN {{.Schema}}.relay_acks.rewound_at IS
    'annals: the last position at which rewound_stream and the log agree (the same event); stamped into the metadata of the streams the relay makes after it (annals-rewound-at), so that consumers past it stop. 0: none agrees.';
