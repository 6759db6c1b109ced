package migrations_test

import (
	"context"
	"strings"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/migrations"
)

// indexOf returns the position in ms of the migration named name.
func indexOf(t *testing.T, ms []migrations.Migration, name string) int {
	t.Helper()
	for i, m := range ms {
		if m.Name == name {
			return i
		}
	}
	t.Fatalf("no migration named %q", name)
	return -1
}

// TestInputLimitsUpgrade migrates a schema up to the migration before
// input_limits, as an existing database would be, appends, then upgrades:
// the old events stay, the stream continues, and the new limits apply.
func TestInputLimitsUpgrade(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	cfg := &migrations.Config{Schema: "upgraded"}
	all, err := migrations.All(cfg)
	if err != nil {
		t.Fatal(err)
	}
	limits := indexOf(t, all, "input_limits")
	if _, err := migrations.UpWith(ctx, db.Pool, cfg, func(ms []migrations.Migration) []migrations.Migration { return ms[:limits] }); err != nil {
		t.Fatal(err)
	}
	appendTo := func(stream string, expected int64) error {
		_, err := db.Pool.Exec(ctx, `SELECT * FROM upgraded.append_events($1, $2, '[{"type":"t","data":{}}]')`, stream, expected)
		return err
	}
	if err := appendTo("old", 0); err != nil {
		t.Fatal(err)
	}
	if err := appendTo("   ", 0); err != nil {
		t.Fatalf("before the upgrade a blank stream ID was accepted; now: %v", err)
	}
	done, err := migrations.Up(ctx, db.Pool, cfg)
	if err != nil || len(done) != len(all)-limits {
		t.Fatalf("upgrade applied %d migrations (%v), want %d", len(done), err, len(all)-limits)
	}
	if err := appendTo("old", 1); err != nil {
		t.Fatalf("append to a stream written before the upgrade: %v", err)
	}
	var pgErr *pgconn.PgError
	if err := appendTo("  ", 0); !errors.As(err, &pgErr) || pgErr.Code != "AN002" {
		t.Fatalf("after the upgrade a blank stream ID got %v, want AN002", err)
	}
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM upgraded.events`).Scan(&n); err != nil || n != 3 {
		t.Fatalf("events after the upgrade: %d, %v", n, err)
	}
}

// TestAppendEventsBodyKeptInStep: the migration that redefines append_events
// with the input limits keeps the body of the first migration's function,
// plus the call of check_event_input, so that a fix to one is not lost in
// the other.
func TestAppendEventsBodyKeptInStep(t *testing.T) {
	t.Parallel()
	all, err := migrations.All(nil)
	if err != nil {
		t.Fatal(err)
	}
	body := func(sql string) string {
		i := strings.Index(sql, "-- append_events appends p_events")
		if i < 0 {
			t.Fatal("no append_events definition")
		}
		return sql[i:]
	}
	first := body(all[indexOf(t, all, "events")].SQL)
	limits := body(all[indexOf(t, all, "input_limits")].SQL)
	limits = strings.Replace(limits, "CREATE OR REPLACE FUNCTION", "CREATE FUNCTION", 1)
	limits = strings.Replace(limits, "\n    -- Input limits, checked by a function other append functions share.\n"+
		"    PERFORM \"annals\".check_event_input(p_stream_id, p_expected_version, p_events);\n", "", 1)
	if first != limits {
		t.Fatalf("append_events of input_limits differs from the first migration's beyond the check_event_input call:\n%s", limits)
	}
}
