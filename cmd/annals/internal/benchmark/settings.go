package benchmark

import (
	"context"
	"fmt"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/internal/schemaname"
	"github.com/annals-dev/annals/internal/sqltmpl"
	"github.com/annals-dev/annals/migrations"
)

// Settings are the server settings that every figure depends on.
type Settings struct {
	Server            string `json:"server_version"`
	Fsync             string `json:"fsync"`
	SynchronousCommit string `json:"synchronous_commit"`
}

// String returns the settings as a table header states them.
func (s Settings) String() string {
	return fmt.Sprintf("PostgreSQL %s, fsync=%s, synchronous_commit=%s", s.Server, s.Fsync, s.SynchronousCommit)
}

// ReadSettings reads the server version, fsync and synchronous_commit.
func ReadSettings(ctx context.Context, pool *pgxpool.Pool) (Settings, error) {
	q, err := queries(schemaname.Default)
	if err != nil {
		return Settings{}, err
	}
	var s Settings
	err = pool.QueryRow(ctx, q["Settings"]).Scan(&s.Fsync, &s.SynchronousCommit, &s.Server)
	return s, errors.Wrap(err, "benchmark: read server settings")
}

// queries renders bench.sql for schema.
func queries(schema string) (map[string]string, error) {
	if err := schemaname.Validate(schema); err != nil {
		return nil, err
	}
	return sqltmpl.Named("bench.sql", benchSQL, sqltmpl.NewData(schema))
}

// freshSchema drops the benchmark's schema, migrates it anew and returns its
// rendered statements: every benchmark starts from an empty log.
func freshSchema(ctx context.Context, pool *pgxpool.Pool, schema string) (map[string]string, error) {
	q, err := queries(schema)
	if err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, q["DropSchema"]); err != nil {
		return nil, errors.Wrapf(err, "benchmark: drop schema %s", schema)
	}
	if _, err := migrations.Up(ctx, pool, &migrations.Config{Schema: schema}); err != nil {
		return nil, err
	}
	return q, nil
}
