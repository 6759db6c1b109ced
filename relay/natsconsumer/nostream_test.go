package natsconsumer_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/relay/natsconsumer"
)

// TestNoStreamSaysToStartTheRelay: a consumer started before the relay
// made its stream (or on another stream name) fails with ErrNoStream,
// saying to start the relay first, at New, and at Run or RunProjection when
// the stream went away after New. Before, New failed with a bare "nats: API
// error ... stream not found".
func TestNoStreamSaysToStartTheRelay(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg := &natsconsumer.Config{Durable: "tally"}
	check := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, natsconsumer.ErrNoStream) || !strings.Contains(err.Error(), "start the relay first") ||
			!strings.Contains(err.Error(), "ANNALS") {
			t.Errorf("%s with no stream: %v; want ErrNoStream, naming the stream and saying to start the relay first", what, err)
		}
	}
	_, err := natsconsumer.New(ctx, e.nc, cfg)
	check("New", err)

	e.appendAndRelay(t, ctx, 1) // the relay makes the stream
	c, err := natsconsumer.New(ctx, e.nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.deleteStream(t, ctx)
	check("Run", c.Run(ctx, func(context.Context, eventstore.Event) error { return nil }))
	check("RunProjection", c.RunProjection(ctx, e.dst.Pool, tally{}))
}
