package saga_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/locktrace"
	"github.com/annals-dev/annals/projection"
	"github.com/annals-dev/annals/saga"
)

// A saga's effect takes the log's ordering lock, which every append in the
// database waits for until the transaction commits: the runner commits right
// after each event that appended (projection.CommitCutter), so a batch of 40
// effectful events holds the lock for a few round trips at a time, not for
// the whole batch; and the effects are all there, once.
func TestEffectsHoldTheAppendLockBriefly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 40
	for i := range n {
		// Two instances, so that instance state rows alternate too.
		b.append(t, fmt.Sprintf("in-%d", i%2), Added{ID: fmt.Sprintf("c%d", i%2), N: i})
	}
	tracer := locktrace.New()
	cfg := b.db.Pool.Config().Copy()
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store, err := eventstore.New(pool, &eventstore.Config{Registry: b.reg})
	if err != nil {
		t.Fatal(err)
	}
	r, err := projection.NewRunner(pool, &projection.Config{Retry: fastRetry, RetryBackoff: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	register(t, r, counterSaga(b.reg, 0), &saga.Config{Store: store, Options: &projection.Options{BatchSize: n}})
	catchUp(t, r)

	// After its append, an event's transaction sends the state update, the
	// checkpoint update and the COMMIT.
	if got := tracer.MaxPerTransaction(); got > 3 {
		t.Errorf("a transaction sent %d round trips while holding the append lock; want at most 3 (state, checkpoint, COMMIT)", got)
	}
	for _, id := range []string{"c0", "c1"} {
		if effs := b.effects(t, id); len(effs) != n/2 {
			t.Errorf("instance %s has %d effects, want %d", id, len(effs), n/2)
		}
	}
	if st := b.lookup(t, "c0"); st.Version != n/2 {
		t.Errorf("instance c0 at version %d, want %d", st.Version, n/2)
	}
}
