package migrations_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
)

// TestArchiveStepFromAnotherCluster: a dump restored into another cluster
// brings archive_step_xact a transaction ID that cluster never assigned
// (pg_dump writes a sequence's value with setval). Appends with caller-chosen
// IDs took it for an archive step their snapshot could not see and refused
// with serialization_failure until the new cluster's XID counter passed it
// (found by review); since migration 0019 they append. Each append function
// is called, append_batch with a small call and one of 64 events (0020's
// threshold). The refusal a real step after the snapshot earns stays:
// archive/TestIdempotencyAcrossTheArchive.
func TestArchiveStepFromAnotherCluster(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	schema := pgx.Identifier{db.Schema}.Sanitize()
	seq := pgx.Identifier{db.Schema, "archive_step_xact"}.Sanitize()
	if _, err := db.Pool.Exec(ctx, `SELECT setval($1::regclass, pg_current_xact_id()::text::bigint + 1000000000)`, seq); err != nil {
		t.Fatal(err)
	}
	calls := []struct{ name, sql string }{
		{"append_events", fmt.Sprintf(`SELECT count(*) FROM %s.append_events('r-1', NULL,
			jsonb_build_array(jsonb_build_object('event_id', gen_random_uuid(), 'type', 't', 'data', jsonb_build_object('a', 1))))`, schema)},
		{"append_one", fmt.Sprintf(`SELECT status FROM %s.append_one('r-2', NULL, gen_random_uuid(), 't', '{"a": 1}', NULL, true)`, schema)},
		{"append_batch", fmt.Sprintf(`SELECT count(*) FROM %s.append_batch('{r-3}', '{NULL}', '{1}', '{1}', ARRAY[gen_random_uuid()],
			'{t}', '{"{\"a\": 1}"}', '{NULL}', true)`, schema)},
		{"append_batch of 64 events", fmt.Sprintf(`SELECT count(*) FROM %s.append_batch('{r-4}', '{NULL}', array_fill(1, ARRAY[64]),
			(SELECT array_agg(g) FROM generate_series(1, 64) g), (SELECT array_agg(gen_random_uuid()) FROM generate_series(1, 64)),
			array_fill('t'::text, ARRAY[64]), array_fill('{"a": 1}'::text, ARRAY[64]), array_fill(NULL::text, ARRAY[64]), true)`, schema)},
	}
	for _, c := range calls {
		if _, err := db.Pool.Exec(ctx, c.sql); err != nil {
			t.Errorf("%s after a restore: %v", c.name, err)
		}
	}
	var n int
	if err := db.Pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %s.events WHERE stream_id LIKE 'r-%%'`, schema)).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1+1+1+64 {
		t.Fatalf("%d events stored, want %d", n, 1+1+1+64)
	}
}
