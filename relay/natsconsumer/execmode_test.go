package natsconsumer_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/relay"
	"github.com/annals-dev/annals/relay/natsconsumer"
)

// TestACheckpointSavedInTextModeKeepsItsStream pins what the rewind's
// early stop relies on in the query exec modes that send parameters as
// text (QueryExecModeExec, SimpleProtocol: behind PgBouncer): the
// checkpoint keeps the stream's creation time truncated to the
// microsecond, as sameStream and relay.Rewinds.Since compare it, not
// rounded. PostgreSQL rounds a literal with nanoseconds (…456789 is kept
// as …457): were the driver to send them, a stream made 500 ns or more
// past a microsecond (made so here) would be kept 1 µs late, taken for
// one made again at every restart, and the rewind recorded under it taken
// as one under a stream made before the place's, so the consumer, past
// where they agree, would move to the stream made anew and acknowledge its
// events unhandled up to the late per-event check. (pgx v5.12 writes
// microseconds: this passed before; a pin.)
func TestACheckpointSavedInTextModeKeepsItsStream(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	// A stream whose creation time PostgreSQL rounds up.
	var created time.Time
	for try := 0; ; try++ {
		s, err := e.r.EnsureStream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if created = s.CachedInfo().Created; created.Nanosecond()%1000 >= 500 {
			break
		}
		if try == 100 {
			t.Fatalf("100 streams made, none at 500 ns or more past a microsecond (%v): the server keeps no nanoseconds?", created)
		}
		e.deleteStream(t, ctx)
	}
	cfg, err := pgxpool.ParseConfig(e.dst.Pool.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	p := tallyIn("text_tally")
	if _, err := pool.Exec(ctx, `CREATE TABLE text_tally (pos bigint PRIMARY KEY, n int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	run := func(ctx context.Context) error {
		c, err := natsconsumer.New(ctx, e.nc, &natsconsumer.Config{Durable: string(p), Batch: 4, RetryBackoff: 50 * time.Millisecond})
		if err != nil {
			return err
		}
		return c.RunProjection(ctx, pool, p)
	}
	e.appendAndRelay(t, ctx, 10)
	stop := start(ctx, run)
	annalstest.WaitFor(t, 20*time.Second, func() bool { return p.tallied(ctx, pool) == once(10) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	var kept time.Time
	if err := pool.QueryRow(ctx, `SELECT stream_created FROM annals.relay_checkpoints WHERE consumer = $1`, string(p)).Scan(&kept); err != nil {
		t.Fatal(err)
	}
	if want := created.Truncate(time.Microsecond); !kept.Equal(want) {
		t.Errorf("the checkpoint keeps the stream made at %v as made at %v; want %v", created, kept, want)
	}

	// The log rewound to 6, 5 new events; the stream made anew.
	annalstest.RewindLog(t, e.src.Pool, "annals", 6)
	e.appendEvents(t, ctx, 5)
	if err := e.r.CatchUp(ctx); !errors.Is(err, relay.ErrStreamMismatch) || !strings.Contains(err.Error(), "last agree at position 6") {
		t.Fatalf("the relay on the rewound log: %v; want ErrStreamMismatch, agreeing at 6", err)
	}
	e.deleteStream(t, ctx)
	if _, err := e.src.Pool.Exec(ctx, `UPDATE annals.checkpoints SET position = 0 WHERE subscriber_id = 'relay'`); err != nil {
		t.Fatal(err)
	}
	if e.r, err = relay.New(e.src.Pool, e.nc, nil); err != nil {
		t.Fatal(err)
	}
	if err := e.r.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	rctx, cancelRun := context.WithTimeout(ctx, 20*time.Second)
	defer cancelRun()
	err = run(rctx)
	var rw *natsconsumer.RewoundError
	if !errors.As(err, &rw) || !rw.Stamped || rw.Agreed != 6 || rw.Position != 10 {
		t.Fatalf("the consumer at 10 after the log was rewound to 6: %v (%+v); want ErrLogRewound from the stamp, agreed 6", err, rw)
	}
	if got := p.tallied(ctx, pool); got != once(10) {
		t.Errorf("the read model holds %s after the stop; want %s", got, once(10))
	}
}
