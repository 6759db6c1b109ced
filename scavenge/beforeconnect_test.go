package scavenge_test

import (
	"testing"

	"github.com/annals-dev/annals/internal/hookedpool"
	"github.com/annals-dev/annals/scavenge"
)

// The scavenger's lock connection logs in through the pool's BeforeConnect
// (credentials that rotate): on a pool whose ConnConfig names a role that
// does not exist, a run takes its lock and removes what has expired.
func TestScavengerLockUsesThePoolsHooks(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	pool := hookedpool.New(t, f.db.URL, "hooked-scavenger")
	s, err := scavenge.New(pool.Pool, &scavenge.Config{Schema: f.db.Schema, Pause: -1})
	if err != nil {
		t.Fatal(err)
	}
	p, err := s.RunOnce(t.Context())
	if err != nil {
		t.Fatalf("RunOnce on a pool whose login comes from BeforeConnect: %v", err)
	}
	if !p.Done || p.Removed != f.removed {
		t.Fatalf("progress %+v, want %d removed", p, f.removed)
	}
	f.check(t)
}
