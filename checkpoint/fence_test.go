package checkpoint_test

import (
	"context"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/checkpoint"
)

// Set and Move announce the fence on FenceChannel with FencePayload, which
// the SQL computes as the Go code does (also for a name that is not ASCII),
// when the transaction commits; a Move of a missing checkpoint announces
// nothing.
func TestFenceAnnounced(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := annalstest.NewDB(t, nil)
	s, err := checkpoint.New("")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{checkpoint.FenceChannel("")}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	next := func() string {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		n, err := conn.WaitForNotification(wctx)
		if err != nil {
			t.Fatalf("no fence announced: %v", err)
		}
		if n.Channel != "annals_fences" {
			t.Fatalf("announced on %q, want annals_fences", n.Channel)
		}
		return n.Payload
	}
	const sub = "café: über"
	if _, err := s.Move(ctx, db.Pool, sub, 3, 1); err == nil {
		t.Fatal("Move of a missing checkpoint succeeded")
	}
	if _, err := s.Set(ctx, db.Pool, sub, 3, 5); err != nil {
		t.Fatal(err)
	}
	if got, want := next(), checkpoint.FencePayload(sub, 3); got != want {
		t.Fatalf("Set announced %q, want %q", got, want) // also: the failed Move announced something
	}
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Move(ctx, tx, sub, 3, 2); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got, want := next(), checkpoint.FencePayload(sub, 3); got != want {
		t.Fatalf("Move announced %q, want %q", got, want)
	}
	if checkpoint.FencePayload(sub, 3) == checkpoint.FencePayload(sub, 4) {
		t.Fatal("two partitions have the same payload")
	}
}

// CommitFrom moves the checkpoint only while it is not past where the
// leader knows it: past it in the leader's epoch is checkpoint.ErrMoved (a
// commit of the leader's whose answer was lost landed), another epoch is
// checkpoint.ErrFenced; neither moves anything. Commit knows no position.
func TestCommitFrom(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := annalstest.NewDB(t, nil)
	s, err := checkpoint.New("")
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.Claim(ctx, db.Pool, "from", 0, "me")
	if err != nil {
		t.Fatal(err)
	}
	at := func(want int64) {
		t.Helper()
		got, err := s.Load(ctx, db.Pool, "from", 0)
		if err != nil {
			t.Fatal(err)
		}
		if got.Position != want {
			t.Fatalf("checkpoint at %d, want %d", got.Position, want)
		}
	}
	if err := s.CommitFrom(ctx, db.Pool, "from", 0, c.Epoch, 0, 5); err != nil {
		t.Fatal(err)
	}
	at(5)
	if err := s.CommitFrom(ctx, db.Pool, "from", 0, c.Epoch, 0, 5); !errors.Is(err, checkpoint.ErrMoved) {
		t.Fatalf("the same commit again from 0: %v, want ErrMoved", err)
	}
	if err := s.CommitFrom(ctx, db.Pool, "from", 0, c.Epoch, 3, 9); !errors.Is(err, checkpoint.ErrMoved) {
		t.Fatalf("a commit from 3 with the checkpoint at 5: %v, want ErrMoved", err)
	}
	at(5)
	if err := s.CommitFrom(ctx, db.Pool, "from", 0, c.Epoch, 7, 9); err != nil {
		t.Fatalf("a commit from 7 with the checkpoint at 5 (behind, as an observer's batched write): %v", err)
	}
	at(9)
	if err := s.Commit(ctx, db.Pool, "from", 0, c.Epoch, 8); err != nil {
		t.Fatalf("Commit behind the checkpoint: %v", err)
	}
	at(9)
	if _, err := s.Set(ctx, db.Pool, "from", 0, 2); err != nil {
		t.Fatal(err)
	}
	if err := s.CommitFrom(ctx, db.Pool, "from", 0, c.Epoch, 9, 12); !errors.Is(err, checkpoint.ErrFenced) {
		t.Fatalf("a commit after the epoch moved: %v, want ErrFenced", err)
	}
	if err := s.CommitFrom(ctx, db.Pool, "from", 0, c.Epoch, 0, 12); !errors.Is(err, checkpoint.ErrFenced) {
		t.Fatalf("a commit after the epoch moved, the checkpoint past from: %v, want ErrFenced", err)
	}
	at(2)
}
