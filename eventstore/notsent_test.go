package eventstore_test

import (
	stderrors "errors"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/eventstore"
)

// TestAppendWithoutAConnection: an append for which no connection could be
// had was never sent, and says so with ErrNotWritten while its context is
// still live (before, the bare connect error matched neither marker, so a
// caller switching on ErrNotWritten and ErrOutcomeUnknown missed it). With
// and without group commit.
func TestAppendWithoutAConnection(t *testing.T) {
	t.Parallel()
	for _, disabled := range []bool{false, true} {
		// Port 1 on loopback: nothing listens, the connect is refused.
		pool, err := pgxpool.New(t.Context(), "postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=5")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		s, err := eventstore.New(pool, &eventstore.Config{GroupCommit: eventstore.GroupCommit{Disabled: disabled}})
		if err != nil {
			t.Fatal(err)
		}
		_, err = s.Append(t.Context(), "s-1", eventstore.Any, eventstore.EventData{Type: "order.placed", Data: OrderPlaced{OrderID: "1"}})
		if !isBoth(err, eventstore.ErrNotWritten) || stderrors.Is(err, eventstore.ErrOutcomeUnknown) {
			t.Errorf("group commit disabled %v: %v; want ErrNotWritten, not ErrOutcomeUnknown", disabled, err)
		}
	}
}
