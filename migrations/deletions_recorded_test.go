package migrations_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/migrations"
	"github.com/annals-dev/annals/verify"
)

const deletionsRecordedMigration = "deletions_recorded"

// deletionRecord is the data of the "$stream.truncated" record
// delete_stream appends to the metadata stream since migration 0038.
type deletionRecord struct {
	StreamID       string   `json:"stream_id"`
	TruncateBefore int64    `json:"truncate_before"`
	MaxAgeSeconds  *float64 `json:"max_age_seconds"`
	MaxCount       *int64   `json:"max_count"`
	Deleted        string   `json:"deleted"`
	Version        int64    `json:"version"`
}

// A writer's delete_stream records the deletion in the metadata stream, in
// its transaction and after its "$stream.deleted" event (soft, then hard,
// with the stream's retention as it stands, for a stream ID of the longest
// kind too); a writer cannot write such a record itself: "$stream." types
// are reserved to annals' functions.
func TestDeleteStreamRecordsTheDeletion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	w := newRole(t, db, migrations.Writer)
	store, err := eventstore.New(w.Pool, &eventstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("x", eventstore.MaxStreamIDBytes)
	for _, id := range []string{"s", long} {
		if _, err := store.Append(ctx, id, eventstore.NoStream, eventstore.EventData{Type: "T", Data: map[string]int{"n": 1}},
			eventstore.EventData{Type: "T", Data: map[string]int{"n": 2}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := store.SetStreamRetention(ctx, "s", eventstore.RetentionChange{MaxCount: ptrTo(int64(5))}); err != nil {
		t.Fatal(err)
	}
	records := func(id string) []deletionRecord {
		t.Helper()
		var out []deletionRecord
		for e, err := range store.ReadStream(ctx, eventstore.MetadataStream(id), 1) {
			if err != nil {
				t.Fatal(err)
			}
			if e.Type != eventstore.StreamTruncatedType {
				t.Fatalf("%s in %s", e.Type, eventstore.MetadataStream(id))
			}
			var r deletionRecord
			if err := json.Unmarshal(e.Data, &r); err != nil {
				t.Fatal(err)
			}
			out = append(out, r)
		}
		return out
	}
	del, err := store.DeleteStream(ctx, "s", eventstore.Exact(2), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.DeleteStream(ctx, "s", eventstore.Any, &eventstore.DeleteOptions{Hard: true}); err != nil {
		t.Fatal(err)
	}
	got := records("s")
	five := int64(5)
	want := []deletionRecord{
		{StreamID: "s", TruncateBefore: 0, MaxCount: &five},
		{StreamID: "s", TruncateBefore: 4, MaxCount: &five, Deleted: "soft", Version: 3},
		{StreamID: "s", TruncateBefore: 5, MaxCount: &five, Deleted: "hard", Version: 4},
	}
	if len(got) != len(want) {
		t.Fatalf("records %+v, want %+v", got, want)
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.StreamID != w.StreamID || g.TruncateBefore != w.TruncateBefore || g.MaxAgeSeconds != nil || *g.MaxCount != *w.MaxCount ||
			g.Deleted != w.Deleted || g.Version != w.Version {
			t.Errorf("record %d: %+v, want %+v", i+1, g, w)
		}
	}
	// The record follows the deletion event, in the same transaction.
	var recPos int64
	if err := db.Pool.QueryRow(ctx, `SELECT global_sequence FROM `+pgx.Identifier{db.Schema}.Sanitize()+
		`.events WHERE stream_id = '$$s' AND stream_version = 2`).Scan(&recPos); err != nil {
		t.Fatal(err)
	}
	if recPos != del.Events[0].GlobalSequence+1 {
		t.Errorf("the record is at position %d, the deletion event at %d", recPos, del.Events[0].GlobalSequence)
	}

	if _, err := store.DeleteStream(ctx, long, eventstore.Any, nil); err != nil {
		t.Fatalf("delete a stream with a %d-byte ID: %v", len(long), err)
	}
	if got := records(long); len(got) != 1 || got[0].Deleted != "soft" || got[0].Version != 3 {
		t.Errorf("records of the long stream: %+v", got)
	}

	// Forged by a writer: refused, through every append path.
	forged := eventstore.EventData{Type: eventstore.StreamTruncatedType,
		Data: map[string]any{"stream_id": "t", "truncate_before": 9, "deleted": "soft", "version": 8}}
	if _, err := store.Append(ctx, "$$t", eventstore.Any, forged); !errors.Is(err, eventstore.ErrInvalidEvent) {
		t.Errorf("writer appends a deletion record: %v, want ErrInvalidEvent", err)
	}
	s := pgx.Identifier{db.Schema}.Sanitize()
	for _, q := range []string{
		`SELECT * FROM ` + s + `.append_events('$$t', NULL, '[{"type": "$stream.truncated", "data": {"deleted": "soft", "version": 8}}]'::jsonb)`,
		`SELECT * FROM ` + s + `.append_events_json('$$t', NULL, '[{"type": "$stream.truncated", "data": {"deleted": "soft", "version": 8}}]'::json)`,
		`SELECT * FROM ` + s + `.append_one('$$t', NULL, gen_random_uuid(), '$stream.truncated', '{"deleted": "soft", "version": 8}', NULL, true)`,
	} {
		_, err := w.Pool.Exec(ctx, q)
		wantAN002(t, q, err, "type")
	}

	// A reader verifies the log: deletions_recorded_after() needs no grant.
	r := newRole(t, db, migrations.Reader)
	rep, err := verify.Log(ctx, r.Pool, &verify.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() {
		t.Errorf("verify as a reader: %+v", rep.Problems)
	}
	for _, n := range rep.Notes {
		if strings.Contains(n, "without their records") {
			t.Errorf("verify as a reader: %s", n)
		}
	}
}

// Deletions made before migration 0038 have no record: verify checks them
// as before and says so; a retention record written before it in a session
// with extra_float_digits = 0 (rounded to 15 digits) still matches. A
// deletion after it has its record.
func TestVerifyDeletionsBefore0038(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	cfg := upTo(t, db, `Verify "0038"`, deletionsRecordedMigration)
	s := pgx.Identifier{cfg.Schema}.Sanitize()
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := db.Pool.Exec(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	for _, id := range []string{"a", "b", "c", "d"} {
		for range 3 {
			exec(`SELECT * FROM `+s+`.append_one($1, NULL, gen_random_uuid(), 'T', '{}', NULL, true)`, id)
		}
	}
	exec(`SELECT * FROM ` + s + `.delete_stream('b', NULL, true)`)
	exec(`SELECT * FROM ` + s + `.delete_stream('c', NULL, false)`)
	exec(`SELECT * FROM ` + s + `.append_one('c', 4, gen_random_uuid(), 'T', '{}', NULL, true)`) // recreated
	exec(`SELECT * FROM ` + s + `.delete_stream('d', NULL, false)`)
	conn, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{`SET extra_float_digits = 0`,
		`SELECT * FROM ` + s + `.set_stream_retention('a', make_interval(secs => 1262304000.000001), NULL, NULL)`,
		`RESET extra_float_digits`} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	conn.Release()
	if err := scavengeToEnd(ctx, &role{Pool: db.Pool}, s); err != nil {
		t.Fatal(err)
	}
	if _, err := migrations.Up(ctx, db.Pool, cfg); err != nil {
		t.Fatal(err)
	}

	check := func(when string, notes int) {
		t.Helper()
		rep, err := verify.Log(ctx, db.Pool, &verify.Config{Schema: cfg.Schema})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range rep.Problems {
			t.Errorf("%s: %s: %s", when, p.Kind, p.Message)
		}
		if len(rep.Notes) != notes {
			t.Errorf("%s: notes %q, want %d", when, rep.Notes, notes)
		}
		for _, n := range rep.Notes {
			t.Logf("%s: %s", when, n)
		}
	}
	// b (hard, scavenged), c (recreated, its deletion event scavenged) and
	// d (soft, scavenged) were checked as before.
	check("after the upgrade", 1)
	exec(`SELECT * FROM ` + s + `.delete_stream('a', NULL, true)`)
	exec(`SELECT * FROM ` + s + `.delete_stream('c', NULL, false)`)
	check("deleted after the upgrade", 1)
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+s+`.events WHERE stream_id IN ('$$a', '$$c') AND data->>'deleted' IS NOT NULL`).Scan(&n); err != nil || n != 2 {
		t.Errorf("deletion records after the upgrade: %d, %v; want 2", n, err)
	}
}

func ptrTo[T any](v T) *T { return &v }
