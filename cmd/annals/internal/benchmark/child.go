package benchmark

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/internal/lockkey"
	"github.com/annals-dev/annals/projection"
)

// ChildConfig is one process of the takeover benchmark. The parent passes it
// to a re-executed annals binary as flags (Args); the hidden command
// `annals bench runner-child` defines the same flags and calls RunChild.
type ChildConfig struct {
	// Schema is the benchmark's schema (the global --schema flag).
	Schema string
	// InstanceID is the runner's instance ID: the owner in checkpoints.
	InstanceID string
	// Subscriber is the name of the no-op projection.
	Subscriber string
	// LockRetry is the runner's LockRetryInterval (0: its default).
	LockRetry time.Duration
	// Raw makes the process hold a session advisory lock on a connection
	// instead of running a Runner (the baseline).
	Raw bool
	// Partitions splits the subscriber (the scale-out benchmark); 0 or 1:
	// one partition.
	Partitions int
	// Upsert makes the projection upsert a row per event into
	// bench_scale_rm (the scale-out benchmark's realistic handler) instead
	// of doing nothing.
	Upsert bool
}

// Args returns the command-line flags that describe c.
func (c ChildConfig) Args() []string {
	args := []string{"--schema", c.Schema, "--instance-id", c.InstanceID, "--subscriber", c.Subscriber, "--lock-retry", c.LockRetry.String()}
	if c.Raw {
		args = append(args, "--raw")
	}
	if c.Partitions > 1 {
		args = append(args, "--partitions", fmt.Sprint(c.Partitions))
	}
	if c.Upsert {
		args = append(args, "--upsert")
	}
	return args
}

// ChildReady is the line a child prints on stdout once it runs.
const ChildReady = "ready"

// RunChild runs one process of the takeover benchmark until ctx ends: a
// Runner with a no-op projection (or, with Raw, a held advisory lock). It
// prints ChildReady on ready once the runner is about to start (or the lock
// is held). The runner logs warnings to logs.
func RunChild(ctx context.Context, pool *pgxpool.Pool, c ChildConfig, ready, logs io.Writer) error {
	if c.Raw {
		q, err := queries(c.Schema)
		if err != nil {
			return err
		}
		conn, err := pool.Acquire(ctx)
		if err != nil {
			return errors.Wrap(err, "benchmark: connect")
		}
		defer conn.Release()
		k1, k2 := rawTakeoverKey(c.Schema)
		if _, err := conn.Exec(ctx, q["SessionLock"], k1, k2); err != nil {
			return errors.Wrap(err, "benchmark: take the baseline lock")
		}
		fmt.Fprintln(ready, ChildReady)
		<-ctx.Done()
		_, err = conn.Exec(context.WithoutCancel(ctx), q["SessionUnlock"], k1, k2)
		return errors.Wrap(err, "benchmark: release the baseline lock")
	}
	r, err := projection.NewRunner(pool, &projection.Config{
		Schema:            c.Schema,
		InstanceID:        c.InstanceID,
		LockRetryInterval: c.LockRetry,
		Logger:            slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		return err
	}
	var handler projection.Projection = &noopProjection{name: c.Subscriber}
	if c.Upsert {
		handler = &upsertProjection{name: c.Subscriber, table: pgx.Identifier{c.Schema, "bench_scale_rm"}.Sanitize()}
	}
	if err := r.Register(handler, &projection.Options{Partitions: c.Partitions}); err != nil {
		return err
	}
	fmt.Fprintln(ready, ChildReady)
	return r.Run(ctx)
}

// rawTakeoverKey is the advisory lock of the takeover baseline.
func rawTakeoverKey(schema string) (int32, int32) {
	return lockkey.Pair(schema + ":bench-takeover-raw")
}
