package advisorylock_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/advisorylock"
)

// Take keeps what it wins on the standby's session, which stays usable;
// Give releases and announces; the session's end frees everything it holds.
func TestStandbyTakeGive(t *testing.T) {
	t.Parallel()
	b := newBundle(t)
	b.acquire(t, "held", nil)
	cfg := &advisorylock.Config{ReleaseChannel: "annals_test_take"}
	s := b.newStandby(t, cfg)
	won, err := s.Take(t.Context(), []string{"x", "held", "y"})
	if err != nil || !slices.Equal(won, []int{0, 2}) {
		t.Fatalf("Take = %v, %v; want [0 2]", won, err)
	}
	for _, k := range []string{"x", "y"} {
		if pid := b.holderPID(t, k); pid != s.PID() {
			t.Fatalf("%s is held by %d, want the standby's session %d", k, pid, s.PID())
		}
	}
	// Still usable: it takes another key.
	if won, err := s.Take(t.Context(), []string{"z"}); err != nil || !slices.Equal(won, []int{0}) {
		t.Fatalf("second Take = %v, %v", won, err)
	}
	// Give announces on the channel: a listener elsewhere hears it.
	conn, err := pgx.Connect(t.Context(), b.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(t.Context(), `LISTEN annals_test_take`); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Give(t.Context(), []string{"x", "never-held"}); err != nil || n != 1 {
		t.Fatalf("Give = %d, %v; want 1 (it held x, not never-held)", n, err)
	}
	if pid := b.holderPID(t, "x"); pid != 0 {
		t.Fatalf("x is still held by %d after Give", pid)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	got := map[string]bool{}
	for len(got) < 2 {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			t.Fatalf("notifications %v: %v", got, err)
		}
		got[n.Payload] = true
	}
	if !got["x"] || !got["never-held"] {
		t.Fatalf("announced %v, want x and never-held", got)
	}
	// The session's end frees what it still holds.
	if err := s.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"y", "z"} {
		deadline := time.Now().Add(5 * time.Second)
		for b.holderPID(t, k) != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("%s still held 5s after the standby closed", k)
			}
			time.Sleep(5 * time.Millisecond) // polling the server's lock table
		}
	}
	if _, err := s.Take(t.Context(), []string{"q"}); err == nil {
		t.Fatal("Take after Close succeeded")
	}
}
