package migrations

import (
	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/annals-dev/annals/internal/errmark"
)

// ErrNotMigrated is matched (errors.Is) by the errors that [MarkNotMigrated]
// marks: PostgreSQL refused a statement because the annals schema, or one of
// its tables, does not exist. The database was never migrated (run [Up] or
// `annals migrate`), or the configured schema name is not the one migrated.
var ErrNotMigrated = errors.New("annals schema not migrated")

// ErrNotOwner is matched (errors.Is) by Up's error when migrations are
// pending and PostgreSQL refused the role the privileges to apply them
// (42501): the schema's owner migrates (annals migrate), and a service that
// runs on a role of its own (annals grant) sets annals.Config.SkipMigrations,
// or calls Up only after the owner has migrated, when it does nothing.
var ErrNotOwner = errors.New("annals migrations pending, and this role may not apply them")

// ErrSchemaOwnedByAnother is matched (errors.Is) by Up's error when the
// schema has no migrations applied yet and exists already, owned by a role
// other than the one migrating (and not one it is a member of, nor a
// superuser): the owner of a schema may drop and replace anything in it,
// so a role that made the schema beforehand (with CREATE on the database)
// would own the log made there. Nothing is applied.
var ErrSchemaOwnedByAnother = errors.New("annals: the schema belongs to another role")

// MarkNotMigrated returns err marked with [ErrNotMigrated] when PostgreSQL
// reported an undefined schema (SQLSTATE 3F000, invalid_schema_name) or an
// undefined table (42P01, undefined_table), and err unchanged otherwise. It
// only inspects err, so calling it on an error path costs no round trip.
func MarkNotMigrated(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "3F000" || pgErr.Code == "42P01") {
		return errmark.Mark(err, ErrNotMigrated)
	}
	return err
}

// IsNotMigrated reports whether err says that the annals schema or one of its
// tables does not exist: errors.Is(MarkNotMigrated(err), ErrNotMigrated).
func IsNotMigrated(err error) bool {
	return errors.Is(MarkNotMigrated(err), ErrNotMigrated)
}
