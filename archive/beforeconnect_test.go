package archive_test

import (
	"testing"

	"github.com/annals-dev/annals/archive"
	"github.com/annals-dev/annals/internal/hookedpool"
)

// The archiver's lock connection logs in through the pool's BeforeConnect
// (credentials that rotate): on a pool whose ConnConfig names a role that
// does not exist, a run takes its lock and archives.
func TestArchiverLockUsesThePoolsHooks(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.fill(t, 2, 30)
	pool := hookedpool.New(t, f.db.URL, "hooked-archiver")
	a, err := archive.New(pool.Pool, &archive.Config{Schema: f.db.Schema, Pause: -1})
	if err != nil {
		t.Fatal(err)
	}
	p, err := a.RunOnce(t.Context(), 21)
	if err != nil {
		t.Fatalf("RunOnce on a pool whose login comes from BeforeConnect: %v", err)
	}
	if !p.Done || p.Moved != 20 {
		t.Fatalf("progress %+v, want 20 events archived", p)
	}
}
