package natsconsumer_test

import (
	"context"
	"testing"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/relay/natsconsumer"
)

// TestACheckpointBehindTheAckFloorCatchesUp: a RunProjection whose
// checkpoint is behind what its durable consumer has acknowledged (the
// checkpoint row deleted to rebuild the read model, or the service's
// database restored from a dump older than the acknowledgements) reads the
// messages between them from the stream by sequence at its start, on an
// idle stream, without a new message published. Before, the server had
// nothing to deliver (it took them as handled) and the consumer waited for
// the next published message to notice: on an idle stream, for ever.
func TestACheckpointBehindTheAckFloorCatchesUp(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// back sets the read model and its checkpoint back.
		back []string
		// kept is how many events the read model keeps.
		kept int
	}{
		{name: "cleared", back: []string{`TRUNCATE tally`, `DELETE FROM annals.relay_checkpoints WHERE consumer = 'tally'`}},
		{name: "restored", kept: 6, back: []string{`DELETE FROM tally WHERE pos > 6`,
			`UPDATE annals.relay_checkpoints SET stream_seq = 6, position = 6, event_id = NULL WHERE consumer = 'tally'`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			cfg := &natsconsumer.Config{Durable: "tally", Batch: 4}
			e.appendAndRelay(t, ctx, 10)
			run := func() (stop func() error) {
				c, err := natsconsumer.New(ctx, e.nc, cfg)
				if err != nil {
					t.Fatal(err)
				}
				return start(ctx, func(ctx context.Context) error { return c.RunProjection(ctx, e.dst.Pool, tally{}) })
			}
			stop := run()
			annalstest.WaitFor(t, 10*time.Second, func() bool { return e.tallied(ctx) == once(10) })
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			// Every message acknowledged: the server delivers none again.
			annalstest.WaitForErr(t, 10*time.Second, func() error {
				info, err := e.js.Consumer(ctx, "ANNALS", "tally")
				if err != nil {
					return err
				}
				if f := info.CachedInfo().AckFloor.Stream; f != 10 {
					return errors.Newf("ack floor %d, want 10", f)
				}
				return nil
			})
			for _, q := range tc.back {
				if _, err := e.dst.Pool.Exec(ctx, q); err != nil {
					t.Fatal(err)
				}
			}
			if got := e.tallied(ctx); got != once(tc.kept) {
				t.Fatalf("the read model set back holds %q, want %q", got, once(tc.kept))
			}

			stop = run() // nothing published from here on
			annalstest.WaitFor(t, 10*time.Second, func() bool { return e.tallied(ctx) == once(10) })
			var seq int64
			if err := e.dst.Pool.QueryRow(ctx, `SELECT stream_seq FROM annals.relay_checkpoints WHERE consumer = 'tally'`).Scan(&seq); err != nil || seq != 10 {
				t.Fatalf("the checkpoint: stream message %d, %v; want 10", seq, err)
			}
			if err := stop(); err != nil {
				t.Fatal(err)
			}
		})
	}
}
