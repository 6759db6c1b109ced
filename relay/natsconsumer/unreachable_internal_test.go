package natsconsumer

import (
	"strings"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/annals-dev/annals/internal/natsserver"
)

// TestUnreachableNamesAServerShutdown: the fetch in flight when the NATS
// server stops fails with JetStream's "server shutdown" while the
// connection may still read connected, and was the outage's one WARN, in
// words that did not say an outage began; unreachable says so, and leaves
// other errors of a connected consumer as they are.
func TestUnreachableNamesAServerShutdown(t *testing.T) {
	t.Parallel()
	ns, err := natsserver.Start(t.TempDir(), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Stop)
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	c := &Consumer{js: js}
	got := c.unreachable(errors.Wrap(jetstream.ErrServerShutdown, "fetch"))
	if !errors.Is(got, jetstream.ErrServerShutdown) || !strings.Contains(got.Error(), "the NATS server shut down") {
		t.Fatalf("unreachable(server shutdown) = %v, want it to say the server shut down and keep the error", got)
	}
	other := errors.New("something else")
	if got := c.unreachable(other); got != other {
		t.Fatalf("unreachable(other) = %v, want it unchanged on a connected consumer", got)
	}
}
