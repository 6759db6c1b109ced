-- annals schema: the input rules of every append read an event's data
-- once, not three times.
--
-- Every append function asks event_input_bad of each event (inlined into
-- append_batch's checking statement, append_one's simple expressions and
-- append_events_json), and two of its tests walked the whole payload for
-- what only its first bytes or a rare byte decide:
--
--   - "data starts with { or [ after JSON white space" was
--     left(ltrim(data, ' \t\r\n'), 1). In a multibyte database encoding
--     (UTF8) ltrim measures every character of the text first, and
--     allocates two entries per character, before it looks at the first
--     one: 0.64 µs for a 200-byte payload, 0.02 µs for left(data, 1).
--     The rule now looks at the first character alone, and trims only when
--     that is not already { or [ (white space before the payload, which
--     the Go client never sends);
--   - "no \u escape" (jsonb cannot hold \u0000, data_unstorable) was
--     strpos(data, '\u'): a two-byte needle, searched byte by byte with a
--     skip table, 0.44 µs for 200 bytes; a one-byte needle is a memchr.
--     The rule now searches for a backslash first and for \u only in text
--     that has one (most payloads have none).
--
-- The same for metadata. The rules' results are unchanged (each new form
-- answers as the old one for every text, NULL included:
-- migrations/TestInputRulesCheaperFormsAgree), and they stay one expression
-- each, so PostgreSQL still inlines them (migrations/TestInputRulesInlined).
-- Measured: event_input_bad over 200,000 200-byte payloads, 2.5-2.7 ->
-- 1.2-1.3 µs an event (docs/benchmarks.md, "Third 2026-12-01 session").
-- Signatures, owner and grants are kept (CREATE OR REPLACE; a schema that a
-- build of 0032 without data_unstorable migrated gets it created here, with
-- the rights 0032 gives it); every name the bodies call is one pg_catalog
-- matches exactly (see 0042).

-- data_unstorable as in 0032, the \u search behind a backslash's.
CREATE OR REPLACE FUNCTION {{.Schema}}.data_unstorable(p_data text)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN ((strpos(p_data, E'\\') > 0 AND strpos(p_data, E'\\u') > 0)
        OR (strpos(p_data, '"$personal"') > 0 AND {{.Schema}}.jsonb_may_overflow(p_data)))
   AND NOT {{.Schema}}.jsonb_storable(p_data);

-- event_input_bad as in 0032, the first-character rules trimming only text
-- that does not start with the character, and metadata's \u search behind
-- a backslash's.
CREATE OR REPLACE FUNCTION {{.Schema}}.event_input_bad(p_type text, p_data text, p_metadata text)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN p_type IS NULL OR p_data IS NULL
    OR starts_with(p_type, '$stream.')
    OR NOT (octet_length(p_type) <= 256
            AND p_type ~ E'^[^\\x01-\\x1f\\x7f-\\x9f]*[^\\x01-\\x20\\x7f-\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000][^\\x01-\\x1f\\x7f-\\x9f]*$')
    OR CASE WHEN left(p_data, 1) IN ('{', '[') THEN false
            ELSE left(ltrim(p_data, E' \t\r\n'), 1) NOT IN ('{', '[') END
    OR octet_length(p_data) + coalesce(octet_length(p_metadata), 0) > 67108864
    OR {{.Schema}}.data_unstorable(p_data)
    OR (p_metadata IS NOT NULL AND p_metadata <> ''
        AND (CASE WHEN left(p_metadata, 1) = '{' THEN false
                  ELSE left(ltrim(p_metadata, E' \t\r\n'), 1) <> '{' END
             OR (strpos(p_metadata, E'\\') > 0 AND strpos(p_metadata, E'\\u') > 0
                 AND NOT {{.Schema}}.jsonb_storable(p_metadata))
             OR NOT {{.Schema}}.metadata_ok(p_metadata::jsonb)));
