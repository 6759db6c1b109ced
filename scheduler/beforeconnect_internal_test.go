package scheduler

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
)

// A pool whose login comes from BeforeConnect (credentials that rotate; here
// the user name, over a placeholder that does not exist): the dispatcher's
// LISTEN connection logs in through the hook as the pool's connections do.
func TestListenerUsesThePoolsBeforeConnect(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	pcfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	user := pcfg.ConnConfig.User
	pcfg.ConnConfig.User = "annals_placeholder_role"
	pcfg.BeforeConnect = func(_ context.Context, cc *pgx.ConnConfig) error {
		cc.User = user
		return nil
	}
	pool, err := pgxpool.NewWithConfig(t.Context(), pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
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
