package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
)

// TestMain runs the tests, or, when the demo started this test binary as
// its second process ("consumer URL N"), the consumer.
func TestMain(m *testing.M) {
	if len(os.Args) == 4 && os.Args[1] == "consumer" {
		ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
		err := consume(ctx, os.Args[2], os.Args[3])
		cancel()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	annalstest.Main(m)
}

// The demo runs against a fresh database without error: the consumer
// process reads every relayed event back within the demo's deadline.
func TestRelayDemoRuns(t *testing.T) {
	db := annalstest.NewDB(t, &annalstest.Options{Schema: "annals"})
	t.Setenv("DATABASE_URL", db.URL)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	if err := run(ctx, os.Stdout); err != nil {
		t.Fatal(err)
	}
}

// A second run on the same database starts a new JetStream server, so its
// closing line says which positions this run's JetStream holds: those after
// the head when it began (the six events of the first run are not in it).
func TestRelayDemoRunsTwice(t *testing.T) {
	db := annalstest.NewDB(t, &annalstest.Options{Schema: "annals"})
	t.Setenv("DATABASE_URL", db.URL)
	var last string
	for range 2 {
		ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
		var out strings.Builder
		err := run(ctx, &out)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		last = lines[len(lines)-1]
	}
	want := "relay checkpoint at position 12: the shop.* events after position 6 (the head when the relay began) " +
		"up to it are in this run's JetStream stream SHOP, each once"
	if last != want {
		t.Errorf("the second run ends with\n%s\nwant\n%s", last, want)
	}
}

// The demo's streams are its own: a database where "order-2" is
// hard-deleted (docs/sql-api.md's examples append to order-1 and order-2 and
// delete streams) does not stop it, as the other demos, whose streams carry
// a run suffix, are not stopped by what a database already holds.
func TestRelayDemoRunsBesideOtherOrders(t *testing.T) {
	db := annalstest.NewDB(t, &annalstest.Options{Schema: "annals"})
	t.Setenv("DATABASE_URL", db.URL)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	store, err := eventstore.New(db.Pool, &eventstore.Config{Registry: registry()})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"order-1", "order-2", "order-3"} {
		if _, err := store.Append(ctx, s, eventstore.NoStream, eventstore.NewEvent(OrderPlaced{Item: "x", Total: 1})); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := store.DeleteStream(ctx, "order-2", eventstore.Any, &eventstore.DeleteOptions{Hard: true}); err != nil {
		t.Fatal(err)
	}
	if err := run(ctx, io.Discard); err != nil {
		t.Fatal(err)
	}
}
