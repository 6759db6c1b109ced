package checkpoint_test

import (
	"context"
	"testing"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/checkpoint"
)

func TestStore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	setup := func(t *testing.T) (*checkpoint.Store, *annalstest.DB) {
		db := annalstest.NewDB(t, nil)
		s, err := checkpoint.New("")
		if err != nil {
			t.Fatal(err)
		}
		return s, db
	}

	t.Run("ClaimBumpsEpochAndFencesTheOldLeader", func(t *testing.T) {
		t.Parallel()
		s, db := setup(t)
		if _, err := s.Load(ctx, db.Pool, "sub", 0); !errors.Is(err, checkpoint.ErrNotFound) {
			t.Fatalf("Load before any claim: %v", err)
		}
		a, err := s.Claim(ctx, db.Pool, "sub", 0, "a")
		if err != nil || a.Epoch != 1 || a.Position != 0 || a.Owner != "a" {
			t.Fatalf("first claim %+v, %v", a, err)
		}
		if err := s.Commit(ctx, db.Pool, "sub", 0, a.Epoch, 10); err != nil {
			t.Fatal(err)
		}
		b, err := s.Claim(ctx, db.Pool, "sub", 0, "b")
		if err != nil || b.Epoch != 2 || b.Position != 10 || b.Owner != "b" {
			t.Fatalf("second claim %+v, %v", b, err)
		}
		if err := s.Commit(ctx, db.Pool, "sub", 0, a.Epoch, 20); !errors.Is(err, checkpoint.ErrFenced) {
			t.Fatalf("stale epoch commit: %v, want ErrFenced", err)
		}
		got, err := s.Load(ctx, db.Pool, "sub", 0)
		if err != nil || got.Position != 10 || got.Epoch != 2 {
			t.Fatalf("after fenced commit: %+v, %v", got, err)
		}
	})

	t.Run("CommitNeverMovesBackwards", func(t *testing.T) {
		t.Parallel()
		s, db := setup(t)
		c, err := s.Claim(ctx, db.Pool, "sub", 3, "a")
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range []int64{5, 9, 7} {
			if err := s.Commit(ctx, db.Pool, "sub", 3, c.Epoch, p); err != nil {
				t.Fatal(err)
			}
		}
		if got, _ := s.Load(ctx, db.Pool, "sub", 3); got.Position != 9 {
			t.Fatalf("position %d, want 9", got.Position)
		}
	})

	t.Run("SetIsAnOperatorOverride", func(t *testing.T) {
		t.Parallel()
		s, db := setup(t)
		c, err := s.Claim(ctx, db.Pool, "sub", 0, "a")
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Commit(ctx, db.Pool, "sub", 0, c.Epoch, 50); err != nil {
			t.Fatal(err)
		}
		set, err := s.Set(ctx, db.Pool, "sub", 0, 20)
		if err != nil || set.Position != 20 || set.Epoch != c.Epoch+1 || set.Owner != "" {
			t.Fatalf("Set: %+v, %v", set, err)
		}
		if err := s.Commit(ctx, db.Pool, "sub", 0, c.Epoch, 60); !errors.Is(err, checkpoint.ErrFenced) {
			t.Fatalf("the leader was not fenced by Set: %v", err)
		}
		if _, err := s.Set(ctx, db.Pool, "new", 1, 7); err != nil {
			t.Fatal(err)
		}
		all, err := s.List(ctx, db.Pool)
		if err != nil || len(all) != 2 || all[0].Subscriber != "new" || all[1].Position != 20 {
			t.Fatalf("List: %+v, %v", all, err)
		}
	})

	t.Run("BadInput", func(t *testing.T) {
		t.Parallel()
		s, db := setup(t)
		if _, err := s.Claim(ctx, db.Pool, "", 0, "a"); !errors.Is(err, checkpoint.ErrInvalid) {
			t.Errorf("empty subscriber: %v", err)
		}
		if _, err := s.Claim(ctx, db.Pool, "s", -1, "a"); !errors.Is(err, checkpoint.ErrInvalid) {
			t.Errorf("negative partition: %v", err)
		}
		if _, err := s.Set(ctx, db.Pool, "s", 0, -5); !errors.Is(err, checkpoint.ErrInvalid) {
			t.Errorf("negative position: %v", err)
		}
		if _, err := checkpoint.New("bad$schema"); err == nil {
			t.Error("bad schema accepted")
		}
	})
}

func TestBatcher(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	now := time.Unix(1000, 0)
	clock := func() time.Time { return now }
	var writes []int64
	commit := func(_ context.Context, pos int64) error {
		writes = append(writes, pos)
		return nil
	}
	b := checkpoint.NewBatcher(commit, 5, 3, time.Second, clock)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(b.Advance(ctx, 6, 1))
	must(b.Advance(ctx, 7, 1))
	if len(writes) != 0 || b.Position() != 7 || b.Flushed() != 5 {
		t.Fatalf("wrote before the threshold: %v", writes)
	}
	must(b.Advance(ctx, 9, 1)) // third event: threshold
	now = now.Add(500 * time.Millisecond)
	must(b.Advance(ctx, 10, 1))
	now = now.Add(600 * time.Millisecond) // 1.1 s since the last write: interval
	must(b.Advance(ctx, 11, 0))
	must(b.Flush(ctx)) // nothing new: no write
	must(b.Advance(ctx, 12, 1))
	must(b.Flush(ctx))
	if got := []int64{9, 11, 12}; len(writes) != len(got) || writes[0] != got[0] || writes[1] != got[1] || writes[2] != got[2] {
		t.Fatalf("writes %v, want %v", writes, got)
	}
	if due := b.Due(); !due.IsZero() {
		t.Fatalf("Due %v with nothing to write, want zero", due)
	}
	written := now
	must(b.Advance(ctx, 13, 0))
	must(b.FlushIfDue(ctx)) // moved, but the interval has not passed
	if due := b.Due(); !due.Equal(written.Add(time.Second)) {
		t.Fatalf("Due %v, want the last write plus the interval, %v", due, written.Add(time.Second))
	}
	now = now.Add(2 * time.Second)
	must(b.FlushIfDue(ctx))
	must(b.FlushIfDue(ctx)) // nothing new
	if len(writes) != 4 || writes[3] != 13 {
		t.Fatalf("FlushIfDue writes %v, want a fourth write at 13", writes)
	}
	failing := checkpoint.NewBatcher(func(context.Context, int64) error { return errors.New("down") }, 0, 1, time.Second, clock)
	if err := failing.Advance(ctx, 3, 1); err == nil || failing.Flushed() != 0 || failing.Position() != 3 {
		t.Fatalf("a failed write must keep the position for the next flush: %v", err)
	}
}
