package eventstore_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
)

// Under a database whose default_transaction_isolation is REPEATABLE READ
// (or SERIALIZABLE), an append that waited for the ordering lock while
// another append to its stream committed took its snapshot before that
// commit, and the update of the stream's row failed to serialize (40001):
// Append returned "could not serialize access due to concurrent update"
// where the same race under READ COMMITTED answers a wrong expected
// version. Append's own transactions (a group's statement, a lone append,
// the one-by-one re-sends) commit nothing when they fail to serialize, so
// they are sent again, and the race answers as it does under READ
// COMMITTED, whatever the session's default.
func TestAppendRaceUnderRepeatableReadDefault(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, iso := range []string{"repeatable read", "serializable"} {
		for _, disabled := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/group commit disabled %v", iso, disabled), func(t *testing.T) {
				db := annalstest.NewDB(t, nil)
				db.SetDefaultIsolation(t, iso)
				// Writers in other processes: a pool (and Store) each, so that
				// their appends are not grouped into one statement.
				const writers = 4
				stores := make([]*eventstore.Store, writers)
				for i := range stores {
					cfg := &eventstore.Config{}
					cfg.GroupCommit.Disabled = disabled
					var err error
					if stores[i], err = eventstore.New(db.NewPool(t), cfg); err != nil {
						t.Fatal(err)
					}
				}
				for round := range 30 {
					stream := fmt.Sprintf("race-%d", round)
					start := make(chan struct{})
					errs := make([]error, writers)
					var wg sync.WaitGroup
					for i, s := range stores {
						wg.Add(1)
						go func() {
							defer wg.Done()
							<-start
							_, errs[i] = s.Append(ctx, stream, eventstore.NoStream,
								eventstore.EventData{Type: "race.won", Data: json.RawMessage(`{}`)})
						}()
					}
					close(start)
					wg.Wait()
					won := 0
					for i, err := range errs {
						var wrong *eventstore.WrongExpectedVersionError
						switch {
						case err == nil:
							won++
						case errors.As(err, &wrong):
						default:
							t.Fatalf("round %d, writer %d: %v; want success or a wrong expected version", round, i, err)
						}
					}
					if won != 1 {
						t.Fatalf("round %d: %d appends with NoStream won, want 1", round, won)
					}
				}
			})
		}
	}
}
