package advisorylock_test

import (
	"context"
	"testing"
	"time"

	"github.com/annals-dev/annals/advisorylock"
)

// A Standby's Wait pings by the time of the session's last statement; a
// Take that never reached the server (its context ended before it was
// sent) is not one. Before, every call counted, and a standby whose calls
// failed so between short Waits was never pinged: the server ended its
// session, and the locks it held with it.
func TestStandbyCountsOnlyStatementsThatRan(t *testing.T) {
	t.Parallel()
	const freeze = time.Second // not late under make test's load on 2 cores
	b := newBundle(t)
	ctx := t.Context()
	sb := b.newStandby(t, &advisorylock.Config{FreezeTimeout: freeze})
	if won, err := sb.Take(ctx, []string{"count:held"}); err != nil || len(won) != 1 {
		t.Fatalf("Take = %v, %v", won, err)
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	for end := time.Now().Add(4 * freeze); time.Now().Before(end); {
		if _, err := sb.Take(done, []string{"count:other"}); err == nil {
			t.Fatal("Take with a done context succeeded")
		}
		if _, err := sb.Give(done, []string{"count:other"}); err == nil {
			t.Fatal("Give with a done context succeeded")
		}
		if _, err := sb.Wait(ctx, 20*time.Millisecond); err != nil {
			t.Fatalf("Wait: %+v", err)
		}
	}
	if got := b.holderPID(t, "count:held"); got != sb.PID() {
		t.Fatalf("count:held is held by %d, want the standby's session %d", got, sb.PID())
	}
}

// A Wait that returns before it waits (Interrupt came, or a notification
// is there) still pings when one is due. Before, a standby interrupted
// before every Wait was never pinged, and the server ended its session.
func TestStandbyInterruptedWaitsPing(t *testing.T) {
	t.Parallel()
	const freeze = time.Second // not late under make test's load on 2 cores
	b := newBundle(t)
	ctx := t.Context()
	sb := b.newStandby(t, &advisorylock.Config{FreezeTimeout: freeze})
	if won, err := sb.Take(ctx, []string{"interrupted:held"}); err != nil || len(won) != 1 {
		t.Fatalf("Take = %v, %v", won, err)
	}
	for end := time.Now().Add(4 * freeze); time.Now().Before(end); {
		sb.Interrupt()
		if _, err := sb.Wait(ctx, time.Second); err != nil {
			t.Fatalf("Wait: %+v", err)
		}
	}
	if got := b.holderPID(t, "interrupted:held"); got != sb.PID() {
		t.Fatalf("interrupted:held is held by %d, want the standby's session %d", got, sb.PID())
	}
}
