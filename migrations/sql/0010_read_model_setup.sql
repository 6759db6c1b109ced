-- annals schema v10: which version of each projection's read-model setup
-- has run (projection.Typed.OnSetup, projection.Setupper).
--
-- A runner runs a projection's setup before the projection first runs (and
-- a rebuild before its reset) when the row here is missing or older than the
-- projection's setup version, in one transaction with the row's upsert,
-- under a transaction-scoped advisory lock on the projection's setup key:
-- instances starting at once run it once, and never concurrently. Deleting
-- a row makes the next start run that setup again.

CREATE TABLE {{.Schema}}.read_model_setups (
    projection text        PRIMARY KEY CHECK (projection <> ''),
    version    integer     NOT NULL CHECK (version > 0),
    applied_by text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

COMMENT ON TABLE {{.Schema}}.read_model_setups IS
    'annals: the read-model setup version each projection has applied (projection OnSetup).';
