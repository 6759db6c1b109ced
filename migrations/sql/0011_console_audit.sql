-- annals schema: the operator console's audit trail (issue #18).
--
-- Every change an operator makes through the console (a dead letter retried,
-- skipped or purged, a checkpoint moved, a cron task paused or resumed) is
-- recorded here: who (the console's authenticated principal and the database
-- session's role), what (the action, its target and a JSON detail of what
-- changed) and when (the server's clock). The console records an action in
-- the same transaction as the change where the change takes a transaction,
-- so an entry exists exactly when its change committed.
--
-- Operators insert rows (the operate group of grant.sql: INSERT and SELECT,
-- nothing else). A trigger stamps each new row: the ID from the sequence, the
-- time from the server's clock and db_role from session_user, whatever the
-- INSERT said, so an entry's time and role cannot be forged; another refuses
-- UPDATE, DELETE and TRUNCATE, so earlier entries cannot be changed (short
-- of the owner dropping the trigger).

CREATE TABLE {{.Schema}}.audit_log (
    id        bigserial   PRIMARY KEY,
    at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    actor     text        NOT NULL CHECK (actor <> '' AND length(actor) <= 200),
    db_role   text        NOT NULL DEFAULT session_user,
    action    text        NOT NULL CHECK (action <> '' AND length(action) <= 100),
    target    text        NOT NULL DEFAULT '' CHECK (length(target) <= 1000),
    detail    jsonb       NOT NULL DEFAULT '{}'::jsonb
);

CREATE INDEX audit_log_newest ON {{.Schema}}.audit_log (at DESC, id DESC);

COMMENT ON TABLE {{.Schema}}.audit_log IS
    'annals: who changed what through the operator console, and when. Append-only: rows are stamped by a trigger and never changed.';

CREATE FUNCTION {{.Schema}}.audit_log_stamp() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    NEW.id := nextval(pg_get_serial_sequence(format('%I.%I', TG_TABLE_SCHEMA, TG_TABLE_NAME), 'id')::regclass);
    NEW.at := clock_timestamp();
    NEW.db_role := session_user;
    RETURN NEW;
END
$fn$;
REVOKE ALL ON FUNCTION {{.Schema}}.audit_log_stamp() FROM PUBLIC;

CREATE TRIGGER audit_log_stamp
    BEFORE INSERT ON {{.Schema}}.audit_log
    FOR EACH ROW EXECUTE FUNCTION {{.Schema}}.audit_log_stamp();

CREATE FUNCTION {{.Schema}}.audit_log_append_only() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    RAISE EXCEPTION 'annals: the audit log is append-only (% refused)', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$fn$;
REVOKE ALL ON FUNCTION {{.Schema}}.audit_log_append_only() FROM PUBLIC;

CREATE TRIGGER audit_log_append_only
    BEFORE UPDATE OR DELETE ON {{.Schema}}.audit_log
    FOR EACH ROW EXECUTE FUNCTION {{.Schema}}.audit_log_append_only();
CREATE TRIGGER audit_log_no_truncate
    BEFORE TRUNCATE ON {{.Schema}}.audit_log
    FOR EACH STATEMENT EXECUTE FUNCTION {{.Schema}}.audit_log_append_only();


-- When the runner will next try an event that failed (now + its retry
-- policy's delay, jitter included), so the console can show failures in
-- progress with their next attempt. NULL for rows written before this
-- migration and for the attempt that spent the policy (no retry follows).
ALTER TABLE {{.Schema}}.failures ADD COLUMN retry_at timestamptz;
