// Package migrations creates and upgrades the annals schema.
//
// The schema is a list of versioned SQL files embedded in the binary
// (migrations/sql/NNNN_name.sql). [Up] applies the pending ones in order, each
// in its own transaction, and records them in the schema_migrations table of
// the annals schema. It holds a session advisory lock (keyed by md5 of the
// schema name) for the whole run, so several processes may call Up at once:
// one applies, the others wait and then find nothing to do. Up is idempotent.
//
// The schema name is configurable (default "annals") and always quoted as an
// identifier, so any name PostgreSQL accepts works (except one containing '$').
//
// Teams that run their own migration tool (goose, golang-migrate, atlas) can
// take the SQL from [Script] or `annals migrate --print` instead of calling Up.
package migrations
