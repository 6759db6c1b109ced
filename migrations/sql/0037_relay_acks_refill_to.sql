-- annals schema: how far a relay's refill of what its JetStream stream lost
-- goes, kept across its leaderships.
--
-- A relay whose stream lost messages it had acknowledged (relay_acks, 0036)
-- moves its checkpoint back to the stream's newest message and publishes
-- from there up to where it found the checkpoint. An event in that range
-- that NATS refuses for good (over max_payload or the stream's
-- max_msg_size, headers over 64 KiB) was moved past by an operator before,
-- and is passed over again. That bound was held by the leadership that
-- moved back only: a refill that spans leaderships (a publish failed, the
-- process restarted, or the relay ended its leadership to chain what
-- follows a passed-over event) forgot it, and stopped for good at the next
-- such event. refill_to keeps it: set with the move back, in the same
-- transaction and fenced like it, and cleared by the checkpoint commit
-- that reaches it (0: no refill under way).
--
-- "Refused now, so refused then" fails when a limit was lowered after the
-- stream stored an event: the event is refused in the refill though the
-- stream had it, and no operator moved past it. refill_seq, recorded with
-- refill_to, is the stream sequence the stream had acknowledged before it
-- lost its tail: the messages still to publish again are refill_seq less
-- the stream's last sequence, and the events left up to refill_to
-- outnumber them by the events an operator moved past. A refill passes
-- over a refused event only while there is such a surplus; else it stops
-- and says which limit to raise.
--
-- relay_acks holds one row per relay: the column's default and check cost
-- nothing to add.
ALTER TABLE {{.Schema}}.relay_acks
    ADD COLUMN refill_to bigint NOT NULL DEFAULT 0 CHECK (refill_to >= 0),
    ADD COLUMN refill_seq bigint NOT NULL DEFAULT 0 CHECK (refill_seq >= 0);

COMMENT ON COLUMN {{.Schema}}.relay_acks.refill_to IS
    'annals: the checkpoint position the relay found when it moved back to publish what its stream lost; events refused for good up to it are passed over (an operator had moved past them). 0: no refill under way.';

COMMENT ON COLUMN {{.Schema}}.relay_acks.refill_seq IS
    'annals: the stream sequence the relay had recorded as acknowledged when it moved back to publish what its stream lost (with refill_to): what the stream is to hold again by refill_to. 0: no refill under way.';
