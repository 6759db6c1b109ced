-- Statements of personal data keys (keys.go). {{.Schema}} is the quoted
-- schema name.

-- name: KeyOf
SELECT wrapped_key, forgotten_at IS NOT NULL
  FROM {{.Schema}}.personal_keys
 WHERE subject = $1;

-- name: CreateKey
INSERT INTO {{.Schema}}.personal_keys (subject, wrapped_key)
VALUES ($1, $2)
ON CONFLICT (subject) DO NOTHING;

-- name: Forget
SELECT had_key, snapshots_deleted
  FROM {{.Schema}}.forget_subject($1);
