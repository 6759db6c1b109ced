package migrations_test

import (
	"context"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/migrations"
)

// Migration 0024: set_stream_retention refuses a metadata stream ("$$" and
// a stream ID), for a writer and for the owner alike, and changes nothing;
// the stream it describes still takes retention. Before it, a writer could
// give "$$s1" a retention of its own, let the scavenger remove s1's records,
// and so switch annals verify's check of s1's retention off.
func TestMetadataStreamsTakeNoRetention(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	writer := newRole(t, db, migrations.Writer)
	schema := pgx.Identifier{db.Schema}.Sanitize()

	if _, err := writer.Pool.Exec(ctx, `SELECT * FROM `+schema+`.append_events('s1', NULL, '[{"type":"t.x","data":{}}]')`); err != nil {
		t.Fatal(err)
	}
	if _, err := writer.Pool.Exec(ctx, `SELECT * FROM `+schema+`.set_stream_retention('s1', NULL, 5, NULL)`); err != nil {
		t.Fatalf("retention of s1: %v", err)
	}
	// Another stream whose ID starts with "$$" but has no stream it
	// describes is refused too: its ID says it is a metadata stream.
	if _, err := writer.Pool.Exec(ctx, `SELECT * FROM `+schema+`.append_events('$$lone', NULL, '[{"type":"t.x","data":{}}]')`); err != nil {
		t.Fatal(err)
	}
	var before string
	snapshot := `SELECT string_agg(format('%s v%s state %s tb %s age %s count %s', stream_id, version, state, truncate_before, max_age, max_count), '; ' ORDER BY stream_id)
	               || (SELECT ' / ' || count(*) FROM ` + schema + `.events) FROM ` + schema + `.streams`
	if err := db.Pool.QueryRow(ctx, snapshot).Scan(&before); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		who  string
		pool interface {
			Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
		}
		call string
	}{
		{"writer", writer.Pool, `set_stream_retention('$$s1', NULL, 1, NULL)`},
		{"writer", writer.Pool, `set_stream_retention('$$s1', interval '1 second', NULL, NULL)`},
		{"writer", writer.Pool, `set_stream_retention('$$s1', NULL, NULL, 2)`},
		{"writer", writer.Pool, `set_stream_retention('$$lone', NULL, 1, NULL)`},
		{"writer", writer.Pool, `set_stream_retention('$$$$s1', NULL, 1, NULL)`},
		{"owner", db.Pool, `set_stream_retention('$$s1', NULL, 1, NULL)`},
		{"owner", db.Pool, `set_stream_retention('$$', NULL, 1, NULL)`},
	} {
		_, err := c.pool.Exec(ctx, `SELECT * FROM `+schema+`.`+c.call)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "AN002" || pgErr.Detail != `{"event": 0, "field": "stream_id"}` {
			t.Errorf("%s: %s: %v, want AN002 on stream_id", c.who, c.call, err)
		}
	}
	var after string
	if err := db.Pool.QueryRow(ctx, snapshot).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Errorf("a refused call changed the log:\n before %s\n after  %s", before, after)
	}
	// The stream a metadata stream describes is unaffected.
	var count int64
	if err := writer.Pool.QueryRow(ctx, `SELECT max_count FROM `+schema+`.set_stream_retention('s1', NULL, 3, NULL)`).Scan(&count); err != nil || count != 3 {
		t.Fatalf("retention of s1 after the refusals: %d, %v", count, err)
	}
}
