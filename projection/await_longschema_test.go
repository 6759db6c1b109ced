package projection_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

// In a schema whose name is as long as allowed (56 bytes), a batch's commit
// still notifies awaiters: "<schema>_checkpoints" would be 68 bytes, over
// PostgreSQL's 63 for a channel name, so pg_notify failed (silently: the
// notice is best effort) and every Await waited out its poll interval.
func TestAwaitInALongSchema(t *testing.T) {
	t.Parallel()
	schema := "s" + strings.Repeat("x", 55)
	db := annalstest.NewDB(t, &annalstest.Options{Schema: schema})
	reg := eventstore.NewRegistry()
	eventstore.MustRegister[Deposited](reg, "account.deposited")
	eventstore.MustRegister[Withdrawn](reg, "account.withdrawn")
	store, err := eventstore.New(db.Pool, &eventstore.Config{Schema: schema, Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(t.Context(), `CREATE TABLE balances (account text PRIMARY KEY, amount bigint NOT NULL, events int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	r, err := projection.NewRunner(db.Pool, &projection.Config{Schema: schema, PollInterval: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Register(balances(reg), nil); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	// The awaiter's own poll is a minute: a wait that returns within
	// seconds was woken by a notification.
	a, err := projection.NewAwaiter(db.Pool, &projection.AwaitOptions{Schema: schema, PollInterval: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	for i := range 3 {
		res, err := store.Append(t.Context(), "acct-1", eventstore.Any, eventstore.NewEvent(Deposited{Amount: 1}))
		if err != nil {
			t.Fatal(err)
		}
		wctx, wcancel := context.WithTimeout(t.Context(), 20*time.Second)
		err = a.Await(wctx, "balances", res.Events[0].GlobalSequence)
		wcancel()
		if err != nil {
			t.Fatalf("Await of append %d in a schema of %d bytes: %v", i, len(schema), err)
		}
	}
}
