-- annals schema: what a relay's JetStream stream had acknowledged when the
-- relay last committed its checkpoint.
--
-- JetStream acknowledges a message before it writes it to disk, so a crash
-- of the NATS server's machine, or its store restored from a backup, loses
-- the newest messages: the relay's checkpoint is then past the stream's
-- newest message, and the relay, which skips what the stream shows
-- published, would leave the lost events out for good. A checkpoint past
-- the stream's newest message is also normal (a relay of some types only
-- moves past events of others; an operator moves it past an event NATS
-- refuses), so the log cannot tell a loss. The stream can: the relay
-- records here, in the transaction of each checkpoint commit and fenced
-- like it, the JetStream sequence of the last message acknowledged through
-- that checkpoint and the stream's identity (name and creation time). A
-- leadership that finds the same stream with a last sequence below the one
-- recorded knows it lost acknowledged messages, and publishes them again
-- (relay/doc.go).
CREATE TABLE {{.Schema}}.relay_acks (
    subscriber_id     text        NOT NULL,
    partition         integer     NOT NULL DEFAULT 0,
    stream            text        NOT NULL CHECK (stream <> ''),
    stream_created_ns bigint      NOT NULL,
    stream_sequence   bigint      NOT NULL CHECK (stream_sequence >= 0),
    position          bigint      NOT NULL CHECK (position >= 0),
    updated_at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (subscriber_id, partition)
);

COMMENT ON TABLE {{.Schema}}.relay_acks IS
    'annals: per relay, the JetStream stream (name, creation time in Unix nanoseconds) and its sequence acknowledged through the checkpoint position last committed; a leadership that finds the stream''s last sequence below it publishes the lost messages again.';

-- Roles an older `annals grant` made runners keep running relays without
-- running it again: whoever may update checkpoints (runners, operators) may
-- record with them.
DO $grants$
DECLARE
    v_schema constant text := {{.SchemaLiteral}};
    r record;
BEGIN
    FOR r IN
        SELECT DISTINCT pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(a.grantee)) AS who
          FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
         WHERE c.oid = pg_catalog.format('%I.checkpoints', v_schema)::pg_catalog.regclass
           AND a.privilege_type = 'UPDATE' AND a.grantee <> 0 AND a.grantee <> c.relowner
    LOOP
        EXECUTE pg_catalog.format('GRANT SELECT, INSERT, UPDATE ON %I.relay_acks TO %s', v_schema, r.who);
    END LOOP;
END
$grants$;
