package main

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/annals-dev/annals/annalstest"
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
	if err := run(ctx); err != nil {
		t.Fatal(err)
	}
}
