-- One single-event append to the client's own stream with an exact
-- expected version: the version comes from the stream's current maximum.
SELECT coalesce(max(stream_version), 0) + 1 AS v FROM seqproto.events WHERE stream_id = 's-' || :client_id \gset
INSERT INTO seqproto.events (event_id, stream_id, stream_version, event_type, data)
VALUES (gen_random_uuid(), 's-' || :client_id, :v, 'deposited', '{"amount":100,"note":"a deposit of some money into the account"}');
