package relay_test

import (
	"context"
	"testing"

	"github.com/annals-dev/annals/relay"
)

// TestRelayRunWithAnEndedContextReturnsNil: Run returns nil when ctx
// ends, also before it has started (Ctrl-C right after 'annals relay nats'
// started, while it ensured the stream): it exited 1 with "relay: stream
// ANNALS: context canceled".
func TestRelayRunWithAnEndedContextReturnsNil(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r, err := relay.New(b.db.Pool, b.nc, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := r.Run(ctx); err != nil {
		t.Fatalf("Run with an ended context: %v, want nil", err)
	}
}
