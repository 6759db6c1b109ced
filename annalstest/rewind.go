package annalstest

import (
	"context"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/internal/schemaname"
)

// RewindLog leaves the log of schema on pool as a restore from a backup
// taken at position keep leaves it (or a failover to a replica that had
// received that far): the events after keep gone, their positions given to
// the next appends, and the checkpoints (a relay's among them) no further
// than keep. It goes past the append-only trigger as the schema's owner or
// a superuser can.
func RewindLog(t testing.TB, pool *pgxpool.Pool, schema string, keep int64) {
	t.Helper()
	ctx := context.Background()
	s := pgx.Identifier{schema}.Sanitize()
	seq := pgx.Identifier{schema, "events_global_sequence"}.Sanitize()
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL session_replication_role = replica`); err != nil { // past the append-only trigger
			return err
		}
		for _, q := range []string{
			`DELETE FROM ` + s + `.events WHERE global_sequence > $1`,
			`DELETE FROM ` + s + `.streams s WHERE NOT EXISTS (SELECT 1 FROM ` + s + `.events e WHERE e.stream_id = s.stream_id AND e.global_sequence <= $1)`,
			`UPDATE ` + s + `.streams s SET version = (SELECT max(e.stream_version) FROM ` + s + `.events e WHERE e.stream_id = s.stream_id AND e.global_sequence <= $1)`,
			`SELECT pg_catalog.setval(pg_catalog.to_regclass(` + schemaname.Literal(seq) + `), greatest($1, 1), $1 > 0)`,
			`UPDATE ` + s + `.checkpoints SET position = LEAST(position, $1)`,
		} {
			if _, err := tx.Exec(ctx, q, keep); err != nil {
				return errors.Wrap(err, q)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
