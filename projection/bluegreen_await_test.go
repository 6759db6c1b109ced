package projection_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/internal/schemaname"
	"github.com/annals-dev/annals/projection"
)

// TestBlueGreenAwait: Await on a blue/green projection waits for its live
// generation (whose subscriber is <name>#g<N>, not the projection's name),
// and a wait that a cut-over interrupts follows readers to the new
// generation.
func TestBlueGreenAwait(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	log := &bgLog{db: db}
	seedV1(t, db, log, 10, 10)
	v1 := bgRunner(t, db, "v1", 1, false)
	stopV1 := bgRunInBackground(t, v1)

	if err := log.add(ctx, 1, 5); err != nil {
		t.Fatal(err)
	}
	head := headOf(t, db)
	actx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := v1.Await(actx, bgName, head); err != nil {
		t.Fatalf("Await on the live generation: %v", err)
	}
	if cp := checkpointOf(t, db, "bgstats#g1"); cp < head {
		t.Fatalf("Await returned with generation 1 at %d, before %d", cp, head)
	}
	// The package function, which knows no registration, too.
	if err := projection.Await(actx, db.Pool, bgName, head, &projection.AwaitOptions{Schema: db.Schema}); err != nil {
		t.Fatalf("projection.Await: %v", err)
	}

	// Generation 1 stops below the next position; a wait for it started
	// then ends when version 2 has been built past it and cut over.
	stopV1()
	if err := log.add(ctx, 1, 5); err != nil {
		t.Fatal(err)
	}
	head = headOf(t, db)
	// Who listens for checkpoint moves: v2's Awaiter, once it waits. The
	// Awaiters used above let their connections go when their waiters
	// have left; wait until they have, so that the listener seen next is
	// v2's.
	listeners := func() int {
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND query = $1 AND pid <> pg_backend_pid()`,
			"LISTEN "+pgx.Identifier{schemaname.CheckpointChannel(db.Schema)}.Sanitize()).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	annalstest.WaitFor(t, 30*time.Second, func() bool { return listeners() == 0 })
	waited := make(chan error, 1)
	v2 := bgRunner(t, db, "v2", 2, true)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		waited <- v2.Await(wctx, bgName, head)
	}()
	annalstest.WaitFor(t, 10*time.Second, func() bool { return listeners() > 0 })
	select {
	case err := <-waited:
		t.Fatalf("Await returned %v before any generation reached %d", err, head)
	default:
	}
	bgRunInBackground(t, v2)
	if err := <-waited; err != nil {
		t.Fatalf("Await across the cut-over: %v", err)
	}
	if s := state(t, db, 2); s != projection.GenerationLive {
		t.Fatalf("Await returned with generation 2 %s", s)
	}
	if cp := checkpointOf(t, db, "bgstats#g2"); cp < head {
		t.Fatalf("Await returned with generation 2 at %d, before %d", cp, head)
	}
	readerSees(t, db, log, 2)
}
