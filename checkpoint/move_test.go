package checkpoint_test

import (
	"context"
	"slices"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/checkpoint"
)

// TestMove: an operator's move back settles the partition's dead letters
// after the new position (open, retry and skipped ones; not another
// partition's, another subscriber's, or those at or before the position),
// reports how many, and fences the leader; a move forward settles none; an
// unknown partition is ErrNotFound and nothing is created; a rolled-back
// transaction undoes the move and the settling together.
func TestMove(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	s, err := checkpoint.New("")
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.Claim(ctx, db.Pool, "sub", 1, "a")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, db.Pool, "sub", 1, c.Epoch, 10); err != nil {
		t.Fatal(err)
	}
	// (subscriber, partition, position, status) of each dead letter.
	dls := []struct {
		sub    string
		part   int
		pos    int64
		status string
	}{
		{"sub", 1, 3, "open"},      // at or before the new position: stays
		{"sub", 1, 4, "skipped"},   // at it: stays
		{"sub", 1, 5, "open"},      // settled
		{"sub", 1, 6, "retry"},     // settled
		{"sub", 1, 7, "skipped"},   // settled
		{"sub", 1, 8, "resolved"},  // already resolved: not counted
		{"sub", 0, 9, "open"},      // another partition
		{"other", 1, 9, "skipped"}, // another subscriber
	}
	ids := make([]int64, len(dls))
	for i, d := range dls {
		if err := db.Pool.QueryRow(ctx, `INSERT INTO annals.dead_letters
			(subscriber_id, partition, event_id, global_sequence, stream_id, event_type, reason, error, status)
			VALUES ($1, $2, gen_random_uuid(), $3, 's-1', 't', 'failed', 'boom', $4) RETURNING id`,
			d.sub, d.part, d.pos, d.status).Scan(&ids[i]); err != nil {
			t.Fatal(err)
		}
	}
	statuses := func() []string {
		t.Helper()
		out := make([]string, len(ids))
		for i, id := range ids {
			if err := db.Pool.QueryRow(ctx, "SELECT status FROM annals.dead_letters WHERE id = $1", id).Scan(&out[i]); err != nil {
				t.Fatal(err)
			}
		}
		return out
	}
	before := statuses()

	// Rolled back: nothing moved, nothing settled.
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		if m, err := s.Move(ctx, tx, "sub", 1, 4); err != nil || m.DeadLettersSettled != 3 {
			t.Errorf("Move in a transaction: %+v, %v", m, err)
		}
		return errors.New("roll back")
	})
	if err == nil {
		t.Fatal("the transaction committed")
	}
	if got, _ := s.Load(ctx, db.Pool, "sub", 1); got.Position != 10 || got.Epoch != c.Epoch {
		t.Fatalf("after a rolled-back move: %+v", got)
	}
	if got := statuses(); !slices.Equal(got, before) {
		t.Fatalf("a rolled-back move settled dead letters: %v, want %v", got, before)
	}

	m, err := s.Move(ctx, db.Pool, "sub", 1, 4)
	if err != nil {
		t.Fatal(err)
	}
	if m.Before.Position != 10 || m.Before.Epoch != c.Epoch || m.Before.Owner != "a" ||
		m.After.Position != 4 || m.After.Epoch != c.Epoch+1 || m.After.Owner != "" || m.DeadLettersSettled != 3 {
		t.Fatalf("Move back: %+v", m)
	}
	want := []string{"open", "skipped", "resolved", "resolved", "resolved", "resolved", "open", "skipped"}
	if got := statuses(); !slices.Equal(got, want) {
		t.Fatalf("after the move back: %v, want %v", got, want)
	}
	if err := s.Commit(ctx, db.Pool, "sub", 1, c.Epoch, 12); !errors.Is(err, checkpoint.ErrFenced) {
		t.Fatalf("the leader was not fenced by Move: %v", err)
	}

	// Forward (and in place): nothing settled, even open ones past it.
	if _, err := db.Pool.Exec(ctx, "UPDATE annals.dead_letters SET status = 'open' WHERE id = $1", ids[2]); err != nil {
		t.Fatal(err)
	}
	for _, pos := range []int64{6, 6} {
		m, err = s.Move(ctx, db.Pool, "sub", 1, pos)
		if err != nil || m.After.Position != 6 || m.DeadLettersSettled != 0 {
			t.Fatalf("Move to %d: %+v, %v", pos, m, err)
		}
	}
	if st := statuses()[2]; st != "open" {
		t.Fatalf("a move forward settled a dead letter: %s", st)
	}

	if _, err := s.Move(ctx, db.Pool, "nobody", 0, 0); !errors.Is(err, checkpoint.ErrNotFound) {
		t.Fatalf("Move of an unknown checkpoint: %v, want ErrNotFound", err)
	}
	if _, err := s.Load(ctx, db.Pool, "nobody", 0); !errors.Is(err, checkpoint.ErrNotFound) {
		t.Fatalf("Move created a checkpoint: %v", err)
	}
	if _, err := s.Move(ctx, db.Pool, "sub", 1, -1); !errors.Is(err, checkpoint.ErrInvalid) {
		t.Fatalf("negative position: %v", err)
	}
	if _, err := s.Move(ctx, db.Pool, "", 1, 0); !errors.Is(err, checkpoint.ErrInvalid) {
		t.Fatalf("empty subscriber: %v", err)
	}
}
