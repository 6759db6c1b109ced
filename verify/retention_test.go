package verify_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/archive"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/scavenge"
	"github.com/annals-dev/annals/verify"
)

// Retention excuses missing events only when set_stream_retention set it
// (and recorded it in the metadata stream); a position held in both tables
// is found although paging by position reads one copy.
func TestRetentionAndArchiveTampering(t *testing.T) {
	t.Parallel()
	// Positions: a-1 1, b-1 2, c-1 3, a-2 4, b-2 5, c-2 6, a-3 7, b-3 8,
	// c-3 9, a-4 10, b-4 11, c-4 12, a-5 14.
	t.Run("RecordedRetention", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx := context.Background()
		two := int64(2)
		if _, err := b.store.SetStreamRetention(ctx, "b", eventstore.RetentionChange{MaxCount: &two}); err != nil {
			t.Fatal(err)
		}
		sc, err := scavenge.New(b.db.Pool, &scavenge.Config{Schema: b.db.Schema, Pause: -1})
		if err != nil {
			t.Fatal(err)
		}
		if p, err := sc.RunOnce(ctx); err != nil || p.Removed != 2 {
			t.Fatalf("scavenge: %+v %v; want b-1 and b-2 removed", p, err)
		}
		wantProblems(t, b.verify(t, nil))
	})
	t.Run("ForgedRetention", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// A maximum count no set_stream_retention recorded, to pass off the
		// removal of b's first and last events.
		b.tamper(t, `UPDATE %s.streams SET max_count = 1000000 WHERE stream_id = 'b'`,
			`DELETE FROM %s.events WHERE global_sequence IN (2, 11)`)
		wantProblems(t, b.verify(t, nil),
			verify.Problem{Kind: verify.RetentionUnrecorded, StreamID: "b"},
			verify.Problem{Kind: verify.VersionGap, Position: 5, StreamID: "b"},
			verify.Problem{Kind: verify.StreamVersion, StreamID: "b"})
	})
	t.Run("RetentionChangedAfterItsRecord", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx := context.Background()
		two := int64(2)
		if _, err := b.store.SetStreamRetention(ctx, "b", eventstore.RetentionChange{MaxCount: &two}); err != nil {
			t.Fatal(err)
		}
		b.tamper(t, `UPDATE %s.streams SET max_count = 1 WHERE stream_id = 'b'`)
		wantProblems(t, b.verify(t, nil), verify.Problem{Kind: verify.RetentionUnrecorded, StreamID: "b"})
	})
	t.Run("AgeRecordedWhateverExtraFloatDigits", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx := context.Background()
		// A session with extra_float_digits = 0 (PostgreSQL 11's default;
		// some drivers and roles set it): set_stream_retention wrote the
		// age as float8 text, rounded to 15 digits, before migration 0038.
		conn, err := b.db.Pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Release()
		if _, err := conn.Exec(ctx, `SET extra_float_digits = 0`); err != nil {
			t.Fatal(err)
		}
		// 40 years and a microsecond, as the Go client sends it (seconds).
		if _, err := conn.Exec(ctx, `SELECT * FROM `+pgx.Identifier{b.db.Schema}.Sanitize()+
			`.set_stream_retention('a', make_interval(secs => 1262304000.000001), NULL, NULL)`); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, `RESET extra_float_digits`); err != nil {
			t.Fatal(err)
		}
		wantProblems(t, b.verify(t, nil))
	})
	t.Run("PositionInBothTables", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx := context.Background()
		arch, err := archive.New(b.db.Pool, &archive.Config{Schema: b.db.Schema, Pause: -1})
		if err != nil {
			t.Fatal(err)
		}
		if p, err := arch.RunOnce(ctx, 6); err != nil || p.Moved != 5 {
			t.Fatalf("archive: %+v %v; want positions 1-5 moved", p, err)
		}
		b.tamper(t, `INSERT INTO %s.events (global_sequence, event_id, stream_id, stream_version, event_type, data)
		             VALUES (3, gen_random_uuid(), 'forged', 1, 'Forged', '{}')`)
		wantProblems(t, b.verify(t, nil),
			verify.Problem{Kind: verify.DuplicatePosition, Position: 3, StreamID: "forged"},
			verify.Problem{Kind: verify.StreamRowMissing, StreamID: "forged"})
	})
}
