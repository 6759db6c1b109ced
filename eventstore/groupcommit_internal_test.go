package eventstore

import (
	"context"
	"testing"
)

// takeLocked leaves out queued appends whose caller has gone (their caller
// takes them out of the queue), and when that leaves nothing it takes no
// slot: a slot taken for an empty group was never given back, and once
// both were gone appends waited for ever.
func TestTakeLockedSkipsAppendsWhoseCallerHasGone(t *testing.T) {
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	live := context.Background()
	c := &committer{cfg: GroupCommit{MaxInFlight: 2, MaxEvents: 400, ParallelEvents: 200}}
	queued := func(ctx context.Context, stream string) *pendingAppend {
		return &pendingAppend{ctx: ctx, args: appendArgs{stream: stream, count: 1}, done: make(chan struct{})}
	}

	c.queue = []*pendingAppend{queued(gone, "a"), queued(gone, "b")}
	if g := c.takeLocked(); g != nil || c.inFlight != 0 {
		t.Fatalf("only gone callers queued: group %d, %d slots taken; want none", len(g), c.inFlight)
	}
	if len(c.queue) != 2 {
		t.Fatalf("%d queued after the take, want the 2 gone ones left for their callers", len(c.queue))
	}

	c.queue = append(c.queue, queued(live, "c"))
	g := c.takeLocked()
	if len(g) != 1 || g[0].args.stream != "c" || !g[0].taken || c.inFlight != 1 || len(c.queue) != 2 {
		t.Fatalf("group %v, %d slots, %d queued; want c alone, 1 slot, the 2 gone ones queued", g, c.inFlight, len(c.queue))
	}
}
