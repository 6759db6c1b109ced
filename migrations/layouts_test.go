package migrations_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/migrations"
)

// TestLayoutsOfBlueGreenGenerations: migration 0022 records the layout of
// every blue/green generation that has checkpoints as what it was before
// (partitioned by stream ID, whatever the projection's PartitionBy said),
// so that a projection partitioned by another key is refused rather than
// repartitioned in place; other subscribers are judged at their next run.
func TestLayoutsOfBlueGreenGenerations(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	cfg := &migrations.Config{Schema: "layouts"}
	if _, err := migrations.UpWith(ctx, db.Pool, cfg, func(ms []migrations.Migration) []migrations.Migration {
		return ms[:21] // through 0021
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `
		INSERT INTO layouts.read_model_generations (projection, generation, version, schema_name, reader_schema, subscriber, state, created_by)
		VALUES ('stats', 1, 1, 'rm_stats_g1', 'public', 'stats#g1', 'live', 'test'),
		       ('stats', 2, 2, 'rm_stats_g2', 'public', 'stats#g2', 'building', 'test');
		INSERT INTO layouts.checkpoints (subscriber_id, partition, position)
		SELECT 'stats#g1', p, 10 FROM generate_series(0, 3) p
		UNION ALL SELECT 'plain', p, 10 FROM generate_series(0, 1) p`); err != nil {
		t.Fatal(err)
	}
	if _, err := migrations.Up(ctx, db.Pool, cfg); err != nil {
		t.Fatal(err)
	}
	rows, err := db.Pool.Query(ctx, `SELECT subscriber_id || ':' || partitions || ':' || partition_by FROM layouts.subscriber_layouts ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0] != "stats#g1:4:stream" {
		t.Fatalf("layouts after 0022: %q, want only stats#g1:4:stream", got)
	}
}
