package scavenge_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
	"github.com/annals-dev/annals/scavenge"
	"github.com/annals-dev/annals/verify"
)

// The scavenger is a runner service.
var _ projection.Service = (*scavenge.Scavenger)(nil)

type fixture struct {
	db    *annalstest.DB
	store *eventstore.Store
	// keep is every stream's versions that must survive a scavenge run
	// (the events are made two hours old); removed counts the rest.
	keep    map[string][]int64
	removed int64
}

func ev() eventstore.EventData {
	return eventstore.EventData{Type: "thing.happened", Data: map[string]any{"secret": "plaintext"}}
}

// newFixture builds streams that cover every rule: max age (expired and
// not), max count, truncate-before, soft delete, delete and recreate, hard
// delete, no retention, and the metadata streams of retention changes.
func newFixture(t *testing.T) *fixture {
	t.Helper()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	store, err := eventstore.New(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{db: db, store: store, keep: map[string][]int64{}}
	add := func(stream string, n int) {
		for range n {
			if _, err := store.Append(ctx, stream, eventstore.Any, ev()); err != nil {
				t.Fatal(err)
			}
		}
	}
	set := func(stream string, c eventstore.RetentionChange) {
		if _, err := store.SetStreamRetention(ctx, stream, c); err != nil {
			t.Fatal(err)
		}
		f.keep[eventstore.MetadataStream(stream)] = []int64{1}
	}
	hour, threeHours, three, four := time.Hour, 3*time.Hour, int64(3), int64(4)
	// Interleave the streams, so that each batch of positions holds several.
	for i := range 10 {
		for _, s := range []string{"age-old", "age-keep", "live", "soft", "hard", "recreated", "trunc", "count"} {
			if (s == "count") || (i < 2 && (s == "soft" || s == "hard" || s == "recreated")) ||
				(i < 3 && (s == "age-old" || s == "age-keep")) || (i < 4 && s == "live") || (i < 5 && s == "trunc") {
				add(s, 1)
			}
		}
	}
	set("age-old", eventstore.RetentionChange{MaxAge: &hour})
	set("age-keep", eventstore.RetentionChange{MaxAge: &threeHours})
	set("count", eventstore.RetentionChange{MaxCount: &three})
	set("trunc", eventstore.RetentionChange{TruncateBefore: &four})
	for _, s := range []string{"soft", "recreated"} {
		if _, err := store.DeleteStream(ctx, s, eventstore.Exact(2), nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := store.DeleteStream(ctx, "hard", eventstore.Exact(2), &eventstore.DeleteOptions{Hard: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Append(ctx, "recreated", eventstore.Exact(3), ev()); err != nil {
		t.Fatal(err)
	}
	// A run's clock is the server's (migration 0027): the events are made
	// two hours old instead, as the superuser, with the append-only
	// trigger off.
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL session_replication_role = replica`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE annals.events SET recorded_at = recorded_at - interval '2 hours'`)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	f.keep["age-keep"] = []int64{1, 2, 3}
	f.keep["live"] = []int64{1, 2, 3, 4}
	f.keep["count"] = []int64{8, 9, 10}
	f.keep["trunc"] = []int64{4, 5}
	f.keep["recreated"] = []int64{4}
	// Each deletion's record in the metadata stream (migration 0038).
	for _, s := range []string{"soft", "hard", "recreated"} {
		f.keep[eventstore.MetadataStream(s)] = []int64{1}
	}
	f.removed = 3 + 7 + 3 + 3 + 3 + 3 // age-old, count, trunc, soft, hard, recreated
	return f
}

// check verifies that the log holds exactly the kept events, in strictly
// increasing positions with each stream's versions in order.
func (f *fixture) check(t *testing.T) {
	t.Helper()
	got := map[string][]int64{}
	last := int64(0)
	for e, err := range f.store.ReadAll(context.Background(), 0) {
		if err != nil {
			t.Fatal(err)
		}
		if e.GlobalSequence <= last {
			t.Fatalf("position %d after %d", e.GlobalSequence, last)
		}
		last = e.GlobalSequence
		got[e.StreamID] = append(got[e.StreamID], e.StreamVersion)
	}
	if !maps.EqualFunc(got, f.keep, slices.Equal) {
		t.Fatalf("log after scavenging:\n got  %v\n want %v", got, f.keep)
	}
}

func (f *fixture) scavenger(t *testing.T, cfg scavenge.Config) *scavenge.Scavenger {
	t.Helper()
	if cfg.Pause == 0 {
		cfg.Pause = -1
	}
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	s, err := scavenge.New(f.db.Pool, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestScavenge(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("RemovesExpiredKeepsTheRest", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		head, err := f.store.Head(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var steps []scavenge.Progress
		s := f.scavenger(t, scavenge.Config{BatchSize: 4, InstanceID: "test-1",
			OnProgress: func(p scavenge.Progress) { steps = append(steps, p) }})
		p, err := s.RunOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !p.Done || p.Removed != f.removed || p.From != 0 || p.Target != head || p.ScannedTo != head {
			t.Fatalf("progress %+v, want done with %d removed over (0, %d]", p, f.removed, head)
		}
		if want := int((head + 3) / 4); len(steps) != want || p.Steps != want {
			t.Fatalf("%d steps reported, %d recorded; want %d", len(steps), p.Steps, want)
		}
		for i := 1; i < len(steps); i++ {
			if steps[i].ScannedTo <= steps[i-1].ScannedTo || steps[i].Removed < steps[i-1].Removed || steps[i].RunID != p.RunID {
				t.Fatalf("progress does not advance: %+v then %+v", steps[i-1], steps[i])
			}
		}
		f.check(t)

		// The run is recorded: who, when, which range, how many rows.
		runs, err := s.Runs(ctx, 10)
		if err != nil || len(runs) != 1 {
			t.Fatalf("runs %+v %v", runs, err)
		}
		var user string
		if err := f.db.Pool.QueryRow(ctx, `SELECT session_user`).Scan(&user); err != nil {
			t.Fatal(err)
		}
		r := runs[0]
		if r.StartedBy != user || r.Instance != "test-1" || r.FinishedAt == nil || r.Removed != f.removed || r.Target != head ||
			time.Since(r.StartedAt) > time.Minute || r.Now.After(r.StartedAt) || r.StartedAt.Sub(r.Now) > time.Minute {
			t.Fatalf("recorded run %+v", r)
		}
		// annals verify finds nothing wrong with a scavenged log.
		rep, err := verify.Log(ctx, f.db.Pool, nil)
		if err != nil || len(rep.Problems) != 0 {
			t.Fatalf("verify after scavenging: %+v %v", rep, err)
		}
		// A second run removes nothing.
		if p, err = s.RunOnce(ctx); err != nil || p.Removed != 0 || p.RunID == r.RunID || !p.Done {
			t.Fatalf("second run %+v %v", p, err)
		}
		f.check(t)
	})

	t.Run("AppendOnlyOtherwise", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		var pgErr *pgconn.PgError
		_, err := f.db.Pool.Exec(ctx, `DELETE FROM annals.events WHERE stream_id = 'live'`)
		if !errors.As(err, &pgErr) || pgErr.Code != eventstore.CodeAppendOnly {
			t.Fatalf("DELETE by the owner: %v", err)
		}
		// Not even in the transaction of a scavenge step, once it returned.
		err = pgx.BeginFunc(ctx, f.db.Pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SELECT * FROM annals.scavenge('x', now(), 1)`); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `DELETE FROM annals.events WHERE stream_id = 'live'`)
			return err
		})
		if !errors.As(err, &pgErr) || pgErr.Code != eventstore.CodeAppendOnly {
			t.Fatalf("DELETE after a scavenge step in its transaction: %v", err)
		}
		// Nor by forging the marker: only scavenge() may write scavenge_runs
		// (the owner can, but the trigger wants this transaction's step).
		err = pgx.BeginFunc(ctx, f.db.Pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO annals.scavenge_runs (started_by, now_at, from_position, scanned_to, target_position, step_xact, finished_at)
				VALUES ('x', now(), 0, 0, 0, pg_current_xact_id(), now())`); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `DELETE FROM annals.events WHERE stream_id = 'live'`)
			return err
		})
		if !errors.As(err, &pgErr) || pgErr.Code != eventstore.CodeAppendOnly {
			t.Fatalf("DELETE with a finished forged run: %v", err)
		}
		if _, err := f.db.Pool.Exec(ctx, `TRUNCATE annals.events`); !errors.As(err, &pgErr) || pgErr.Code != eventstore.CodeAppendOnly {
			t.Fatalf("TRUNCATE: %v", err)
		}
	})

	// One scavenger at a time; a stopped run is resumed by the next one.
	t.Run("LeaderAndResume", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		stepped := make(chan struct{}, 100)
		a := f.scavenger(t, scavenge.Config{BatchSize: 1, Pause: 20 * time.Millisecond, InstanceID: "a",
			OnProgress: func(scavenge.Progress) { stepped <- struct{}{} }})
		b := f.scavenger(t, scavenge.Config{BatchSize: 1000, InstanceID: "b"})
		actx, cancel := context.WithCancel(ctx)
		var pa scavenge.Progress
		var errA error
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			pa, errA = a.RunOnce(actx)
		}()
		<-stepped
		<-stepped
		if _, err := b.RunOnce(ctx); !errors.Is(err, scavenge.ErrBusy) {
			t.Fatalf("second scavenger: %v, want ErrBusy", err)
		}
		cancel()
		wg.Wait()
		if !errors.Is(errA, context.Canceled) || pa.Done || pa.Steps < 2 {
			t.Fatalf("stopped run: %+v %v", pa, errA)
		}
		// The stopped run's last progress may lag its last committed step
		// by one (a step commits while the cancellation is being noticed),
		// so the resumed run made at least one step more. A cancellation
		// that came mid-step closed a's lock connection instead of
		// unlocking: the server frees the lock once it notices, so b may
		// be told ErrBusy for a moment.
		var pb scavenge.Progress
		var err error
		annalstest.WaitFor(t, 10*time.Second, func() bool {
			pb, err = b.RunOnce(ctx)
			return !errors.Is(err, scavenge.ErrBusy)
		})
		if err != nil || pb.RunID != pa.RunID || !pb.Done || pb.Steps < pa.Steps+1 || pb.Steps > pa.Steps+2 || pb.Removed != f.removed {
			t.Fatalf("resumed run %+v %v (stopped at %+v)", pb, err, pa)
		}
		f.check(t)
	})

	t.Run("ResumesAfterSIGKILL", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		child := startChild(t, f.db, childSpec{Instance: "doomed", Offset: 2 * time.Hour, Pause: 30 * time.Millisecond})
		steps := func() (n int, open bool) {
			err := f.db.Pool.QueryRow(ctx, `SELECT coalesce(max(steps), 0), coalesce(bool_or(finished_at IS NULL), false) FROM annals.scavenge_runs`).Scan(&n, &open)
			if err != nil {
				t.Fatal(err)
			}
			return n, open
		}
		annalstest.WaitFor(t, 30*time.Second, func() bool { n, _ := steps(); return n >= 5 })
		child.Kill()
		killedAt, open := steps()
		if !open {
			t.Fatalf("the run finished before the kill (%d steps)", killedAt)
		}
		// The dead session's lock goes with it; then the run resumes here.
		s := f.scavenger(t, scavenge.Config{BatchSize: 3, InstanceID: "survivor"})
		var p scavenge.Progress
		annalstest.WaitForErr(t, 30*time.Second, func() error {
			var err error
			p, err = s.RunOnce(ctx)
			return err
		})
		if !p.Done || p.Removed != f.removed || p.Steps <= killedAt {
			t.Fatalf("resumed run %+v, want done with %d removed after step %d", p, f.removed, killedAt)
		}
		runs, err := s.Runs(ctx, 10)
		if err != nil || len(runs) != 1 || runs[0].Instance != "doomed" {
			t.Fatalf("runs %+v %v: want the one run the child started", runs, err)
		}
		f.check(t)
	})

	// Writers append to streams with a maximum count while scavengers run:
	// the newest MaxCount versions of every stream are never removed.
	t.Run("NeverInsideTheWindow", func(t *testing.T) {
		t.Parallel()
		db := annalstest.NewDB(t, nil)
		store, err := eventstore.New(db.Pool, nil)
		if err != nil {
			t.Fatal(err)
		}
		const streams, maxCount = 4, int64(5)
		hour := time.Hour
		for i := range streams {
			s := fmt.Sprintf("s-%d", i)
			if _, err := store.Append(ctx, s, eventstore.NoStream, ev()); err != nil {
				t.Fatal(err)
			}
			mc := maxCount
			if _, err := store.SetStreamRetention(ctx, s, eventstore.RetentionChange{MaxCount: &mc, MaxAge: &hour}); err != nil {
				t.Fatal(err)
			}
		}
		sc, err := scavenge.New(db.Pool, &scavenge.Config{BatchSize: 7, Pause: -1})
		if err != nil {
			t.Fatal(err)
		}
		wctx, stop := context.WithTimeout(ctx, 3*time.Second)
		defer stop()
		var wg sync.WaitGroup
		errs := make(chan error, streams+1)
		for i := range streams {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for wctx.Err() == nil {
					if _, err := store.Append(ctx, fmt.Sprintf("s-%d", i), eventstore.Any, ev()); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Add(1)
		runs := 0
		go func() {
			defer wg.Done()
			for wctx.Err() == nil {
				if _, err := sc.RunOnce(ctx); err != nil {
					errs <- err
					return
				}
				runs++
			}
		}()
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		if _, err := sc.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
		for i := range streams {
			s := fmt.Sprintf("s-%d", i)
			v, err := store.StreamVersion(ctx, s)
			if err != nil {
				t.Fatal(err)
			}
			var n, lo, hi int64
			if err := db.Pool.QueryRow(ctx, `SELECT count(*), min(stream_version), max(stream_version) FROM annals.events WHERE stream_id = $1`, s).Scan(&n, &lo, &hi); err != nil {
				t.Fatal(err)
			}
			if n != maxCount || lo != v-maxCount+1 || hi != v {
				t.Fatalf("%s at version %d keeps %d events (%d..%d), want the newest %d (after %d runs)", s, v, n, lo, hi, maxCount, runs)
			}
		}
	})

	t.Run("Service", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		s := f.scavenger(t, scavenge.Config{BatchSize: 10, Interval: time.Hour})
		sctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- s.Run(sctx) }()
		annalstest.WaitForErr(t, 10*time.Second, func() error {
			runs, err := s.Runs(ctx, 1)
			if err != nil || len(runs) != 1 || runs[0].FinishedAt == nil {
				return errors.Newf("runs %+v %v", runs, err)
			}
			return nil
		})
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		f.check(t)
	})
}
