package pgcluster

import (
	"context"
	"errors"
	"runtime"
	"testing"

	"github.com/jackc/pgx/v5"
)

// Down refuses connections and keeps the data; Up serves it again on the
// same port; both fail after Stop.
func TestDownUp(t *testing.T) {
	t.Parallel()
	c, err := Start(t.Context(), nil)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	conn := connect(t, c.URL())
	if _, err := conn.Exec(t.Context(), "CREATE TABLE kept (n int); INSERT INTO kept VALUES (7)"); err != nil {
		t.Fatal(err)
	}
	if err := c.Down(t.Context()); err != nil {
		t.Fatalf("Down: %v", err)
	}
	if conn, err := pgx.Connect(t.Context(), c.URL()); err == nil {
		_ = conn.Close(context.Background())
		t.Fatal("connected to a cluster that is down")
	}
	if err := c.Up(t.Context()); err != nil {
		t.Fatalf("Up: %v", err)
	}
	if err := c.Up(t.Context()); err != nil {
		t.Fatalf("Up when up: %v", err)
	}
	var n int
	if err := connect(t, c.URL()).QueryRow(t.Context(), "SELECT n FROM kept").Scan(&n); err != nil || n != 7 {
		t.Fatalf("after Up: %d, %v", n, err)
	}
	if err := c.Stop(context.Background()); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if err := c.Down(t.Context()); !errors.Is(err, ErrStopped) {
		t.Errorf("Down after Stop: %v", err)
	}
	if err := c.Up(t.Context()); !errors.Is(err, ErrStopped) {
		t.Errorf("Up after Stop: %v", err)
	}
}

// Crash kills every process of the server and returns only once none is
// attached to its shared memory any more, so that Up can start at once,
// several times in a row, even with connections busy when it is killed.
func TestCrashUp(t *testing.T) {
	t.Parallel()
	c := startCluster(t, nil)
	for round := range 3 {
		shmid := c.shmID()
		if shmid < 0 {
			t.Fatalf("round %d: no shared memory ID in postmaster.pid", round)
		}
		if runtime.GOOS == "linux" && !shmAttached(shmid) {
			t.Fatalf("round %d: segment %d not attached while the server runs", round, shmid)
		}
		// Busy backends at the moment of the kill.
		for range 4 {
			conn := connect(t, c.URL())
			done := make(chan struct{})
			go func() {
				defer close(done)
				_, _ = conn.Exec(context.Background(), "SELECT pg_sleep(10)")
			}()
			// Before connect's cleanup closes conn (cleanups run last
			// first): the Exec has ended, with the crash.
			t.Cleanup(func() { <-done })
		}
		if err := c.Crash(t.Context()); err != nil {
			t.Fatalf("round %d: Crash: %v", round, err)
		}
		if shmAttached(shmid) {
			t.Fatalf("round %d: segment %d still attached after Crash returned", round, shmid)
		}
		if err := c.Up(t.Context()); err != nil {
			t.Fatalf("round %d: Up: %v", round, err)
		}
		var one int
		if err := connect(t, c.URL()).QueryRow(t.Context(), "SELECT 1").Scan(&one); err != nil || one != 1 {
			t.Fatalf("round %d: after Up: %v", round, err)
		}
	}
}
