package migrations_test

import (
	"context"
	"testing"

	"github.com/annals-dev/annals/migrations"
)

// TestUpPinsTheSearchPathForEveryMigration: Up runs every migration under
// search_path = pg_catalog, pg_temp, so that an unqualified call in a body
// parsed at CREATE binds to pg_catalog even where an object planted in
// public matches it better. 0042 and the qualified lock statements keep the
// shipped migrations safe without the pin; a later migration that forgets
// to qualify a call must be too. Here one does (div of numeric and integer,
// which the planted public.div matches exactly).
func TestUpPinsTheSearchPathForEveryMigration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := plantedDB(t)
	const schema = `planted "later"`
	dropAtEnd(t, db, schema)
	cfg := &migrations.Config{Schema: schema}
	later := func(ms []migrations.Migration) []migrations.Migration {
		return append(ms, migrations.Migration{Version: len(ms) + 1, Name: "unqualified", SQL: `
CREATE FUNCTION "planted ""later""".hours(p numeric) RETURNS numeric
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN div(p, 3600);`})
	}
	if _, err := migrations.UpWith(ctx, db.Pool, cfg, later); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	for _, b := range dependsOnPublic(t, db) {
		t.Errorf("a migration bound a planted object: %s", b)
	}
}
