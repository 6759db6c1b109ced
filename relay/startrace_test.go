package relay_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/relay"
)

// TestRelaysStartingAtOnce: four relay processes (pools and NATS
// connections of their own) released together on a fresh database and a
// NATS server without the stream: every Run goes on (the stream made
// once, JetStream's create of one config from several at once answering
// each), one leads and the log is relayed exactly once. Half of the
// relays' sessions default to REPEATABLE READ.
func TestRelaysStartingAtOnce(t *testing.T) {
	t.Parallel()
	for round := range 3 {
		// A subtest per round: its database and pools go at its end.
		t.Run(fmt.Sprintf("round %d", round), func(t *testing.T) {
			b := setup(t)
			const n = 4
			relays := make([]*relay.Relay, n)
			for i := range n {
				pool := b.db.NewPool(t, func(cfg *pgxpool.Config) {
					cfg.MaxConns = 4
					if i%2 == 1 {
						cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = "repeatable read"
					}
				})
				if err := pool.Ping(t.Context()); err != nil {
					t.Fatal(err)
				}
				nc, err := nats.Connect(b.ns.ClientURL())
				if err != nil {
					t.Fatal(err)
				}
				defer nc.Close()
				if relays[i], err = relay.New(pool, nc, &relay.Config{BatchSize: 7}); err != nil {
					t.Fatal(err)
				}
			}
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			start := make(chan struct{})
			ended := make(chan error, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					ended <- relays[i].Run(ctx)
				}()
			}
			close(start)
			appendMany(t, b.store, 20)
			annalstest.WaitFor(t, 30*time.Second, func() bool {
				select {
				case err := <-ended:
					t.Fatalf("round %d: a relay ended while running: %v", round, err)
				default:
				}
				s, err := b.js.Stream(ctx, "ANNALS")
				if err != nil {
					return false
				}
				info, err := s.Info(ctx)
				return err == nil && info.State.Msgs == 20
			})
			checkExactlyOnce(t, b.relayed("ANNALS"), b.log())
			cancel()
			wg.Wait()
			close(ended)
			for err := range ended {
				if err != nil {
					t.Fatalf("round %d: %v", round, err)
				}
			}
		})
	}
}
