package eventstore_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/eventstore"
)

// TestReadStreamThatChangesWhileRead: ReadStream reads a page per query,
// so a stream may change between two pages. A deletion, a deletion and a
// recreation, and a truncation past the next version end the read with
// ErrStreamChanged. Before, the read silently ended early (deleted), mixed
// the old and the new stream (versions [1 2 7 8] for a recreated one) or
// skipped versions (truncated). Appends meanwhile, and a stream that ends
// on a page's end, read as before.
func TestReadStreamThatChangesWhileRead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, &eventstore.Config{PageSize: 2})
	stream := func(name string, n int) {
		t.Helper()
		for range n {
			if _, err := b.store.Append(ctx, name, eventstore.Any, placed(name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	// read reads name, calling change once after version 2 (the end of
	// the first page): the versions it yielded and the error it ended with.
	read := func(name string, change func()) ([]int64, error) {
		var got []int64
		for e, err := range b.store.ReadStream(ctx, name, 0) {
			if err != nil {
				return got, err
			}
			got = append(got, e.StreamVersion)
			if e.StreamVersion == 2 && change != nil {
				change()
			}
		}
		return got, nil
	}
	del := func(name string) {
		if _, err := b.store.DeleteStream(ctx, name, eventstore.Any, nil); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		name    string
		change  func(name string)
		deleted bool
	}{
		{"deleted", del, true},
		{"recreated", func(name string) {
			del(name) // its "$stream.deleted" event is version 6
			if _, err := b.store.Append(ctx, name, eventstore.Exact(6), placed(name), placed(name)); err != nil {
				t.Fatal(err)
			}
		}, false},
		{"truncated", func(name string) {
			four := int64(4)
			if _, err := b.store.SetStreamRetention(ctx, name, eventstore.RetentionChange{TruncateBefore: &four}); err != nil {
				t.Fatal(err)
			}
		}, false},
	} {
		name := "changed-" + c.name
		stream(name, 5)
		got, err := read(name, func() { c.change(name) })
		if !errors.Is(err, eventstore.ErrStreamChanged) || errors.Is(err, eventstore.ErrStreamDeleted) != c.deleted || fmt.Sprint(got) != "[1 2]" {
			t.Errorf("%s: read %v, ended with %v; want [1 2] and ErrStreamChanged (ErrStreamDeleted %v)", c.name, got, err, c.deleted)
		}
	}
	// Unchanged, or only appended to: read to the end.
	stream("four", 4)
	if got, err := read("four", nil); err != nil || fmt.Sprint(got) != "[1 2 3 4]" {
		t.Errorf("a stream ending on a page's end: %v, %v", got, err)
	}
	stream("growing", 3)
	if got, err := read("growing", func() { stream("growing", 2) }); err != nil || fmt.Sprint(got) != "[1 2 3 4 5]" {
		t.Errorf("a stream appended to while read: %v, %v", got, err)
	}
}

// TestReadStreamRetentionWhileRead: a stream's retention is applied when
// it is read (ReadStream's query hides the versions beyond max_count of
// the stream's current version and those recorded before Config.Clock's
// now less max_age; a scavenge removes their rows later), so it can slide
// past the next version to read between two pages: a max count set, or
// appends under one, or the clock passing a max age, or a scavenge of what
// one hid. Each ends the read with ErrStreamChanged after the first page,
// not with the versions still kept after a gap (or nothing); a max age
// does so in a REPEATABLE READ transaction too, since each page asks the
// clock. A window that slides without reaching the next version reads on.
func TestReadStreamRetentionWhileRead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var clock atomic.Pointer[time.Time] // the reads' now; nil: the wall clock
	b := setup(t, &eventstore.Config{PageSize: 2, Clock: func() time.Time {
		if now := clock.Load(); now != nil {
			return *now
		}
		return time.Now()
	}})
	setClock := func(now time.Time) { clock.Store(&now) }
	add := func(name string, n int) {
		t.Helper()
		for range n {
			if _, err := b.store.Append(ctx, name, eventstore.Any, placed(name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	retain := func(name string, c eventstore.RetentionChange) {
		t.Helper()
		if _, err := b.store.SetStreamRetention(ctx, name, c); err != nil {
			t.Fatal(err)
		}
	}
	// recorded returns when version v of name was recorded.
	recorded := func(name string, v int64) time.Time {
		t.Helper()
		var at time.Time
		if err := b.db.Pool.QueryRow(ctx, `SELECT recorded_at FROM `+pgx.Identifier{b.db.Schema}.Sanitize()+`.events_all
			WHERE stream_id = $1 AND stream_version = $2`, name, v).Scan(&at); err != nil {
			t.Fatal(err)
		}
		return at
	}
	// read reads name, calling change once after the first page (two
	// events): the versions it yielded and the error it ended with.
	read := func(name string, inTx bool, change func()) ([]int64, error) {
		events := b.store.ReadStream(ctx, name, 0)
		if inTx { // in one REPEATABLE READ snapshot
			tx, err := b.db.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(ctx) }()
			events = b.store.ReadStreamTx(ctx, tx, name, 0)
		}
		var got []int64
		for e, err := range events {
			if err != nil {
				return got, err
			}
			got = append(got, e.StreamVersion)
			if len(got) == 2 && change != nil {
				change()
			}
		}
		return got, nil
	}
	count := func(n int64) eventstore.RetentionChange { return eventstore.RetentionChange{MaxCount: &n} }
	hour := time.Hour
	maxAge := eventstore.RetentionChange{MaxAge: &hour}

	for _, c := range []struct {
		name string
		// before sets the stream (five events) up; change runs after the
		// first page.
		before, change func(name string)
		want           string // the versions read
		changed        bool   // ErrStreamChanged, else no error
		inTx           bool   // ReadStreamTx in a REPEATABLE READ transaction
	}{
		{name: "max-count-set", change: func(name string) {
			retain(name, count(2)) // keeps 4 and 5
		}, want: "[1 2]", changed: true},
		{name: "max-count-slid", before: func(name string) {
			retain(name, count(4)) // 2 to 5
		}, change: func(name string) {
			add(name, 3) // 5 to 8: version 4 is gone
		}, want: "[2 3]", changed: true},
		{name: "max-count-slid-short", before: func(name string) {
			retain(name, count(4))
		}, change: func(name string) {
			add(name, 1) // 3 to 6: version 4, next, is kept
		}, want: "[2 3 4 5 6]"},
		{name: "max-age-passed", before: func(name string) {
			retain(name, maxAge)
		}, change: func(name string) {
			// Versions 1 to 3 are over an hour old now.
			at3, at4 := recorded(name, 3), recorded(name, 4)
			if !at3.Before(at4) {
				t.Fatalf("versions 3 and 4 recorded at %v and %v: not in order", at3, at4)
			}
			setClock(at4.Add(time.Hour))
		}, want: "[1 2]", changed: true},
		{name: "max-age-passed-in-a-snapshot", before: func(name string) {
			retain(name, maxAge)
		}, change: func(name string) {
			// One snapshot, but each page asks the clock.
			setClock(recorded(name, 4).Add(time.Hour))
		}, want: "[1 2]", changed: true, inTx: true},
		{name: "max-age-passed-every-event", before: func(name string) {
			retain(name, maxAge)
		}, change: func(name string) {
			setClock(time.Now().Add(2 * time.Hour))
		}, want: "[1 2]", changed: true},
		{name: "max-age-passed-short", before: func(name string) {
			retain(name, maxAge)
		}, change: func(name string) {
			setClock(recorded(name, 3).Add(time.Hour)) // 1 and 2 only
		}, want: "[1 2 3 4 5]"},
		{name: "max-count-scavenged", change: func(name string) {
			retain(name, count(2))
			// Removed, not only hidden: the rows of versions 1 to 3 are gone.
			for done := false; !done; {
				if err := b.db.Pool.QueryRow(ctx, `SELECT done FROM `+pgx.Identifier{b.db.Schema}.Sanitize()+`.scavenge('readchange', now(), 1000)`).Scan(&done); err != nil {
					t.Fatal(err)
				}
			}
			var left int
			if err := b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{b.db.Schema}.Sanitize()+`.events_all WHERE stream_id = $1`, name).Scan(&left); err != nil || left != 2 {
				t.Fatalf("after the scavenge %d events of %s are stored (%v), want 2", left, name, err)
			}
		}, want: "[1 2]", changed: true},
	} {
		clock.Store(nil)
		name := "retained-" + c.name
		add(name, 5)
		if c.before != nil {
			c.before(name)
		}
		got, err := read(name, c.inTx, func() { c.change(name) })
		if c.changed != errors.Is(err, eventstore.ErrStreamChanged) || (!c.changed && err != nil) || errors.Is(err, eventstore.ErrStreamDeleted) || fmt.Sprint(got) != c.want {
			want := "no error"
			if c.changed {
				want = "ErrStreamChanged"
			}
			t.Errorf("%s: read %v, ended with %v; want %s and %s", c.name, got, err, c.want, want)
		}
	}
}
