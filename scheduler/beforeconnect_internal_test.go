package scheduler

import (
	"testing"
	"time"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/hookedpool"
)

// A pool whose login comes from BeforeConnect (credentials that rotate; here
// the user name, over a placeholder that does not exist): the dispatcher's
// LISTEN connection logs in through the hook as the pool's connections do.
func TestListenerUsesThePoolsBeforeConnect(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	pool := hookedpool.New(t, db.URL, "").Pool
	store, err := eventstore.New(pool, &eventstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(store, &Config{Clock: newFakeClock(t0), PollInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	run(t, s)
	annalstest.WaitFor(t, 10*time.Second, func() bool { return s.listenUp.Load() })
}
