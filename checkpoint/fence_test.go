package checkpoint_test

import (
	"context"
	"testing"
	"time"

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
