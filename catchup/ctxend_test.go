package catchup_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/eventstore"
)

// cancelOnRead cancels a context when the batch read number at is about
// to be sent: the read then fails because the caller's context ended.
type cancelOnRead struct {
	at     int64
	n      atomic.Int64
	cancel atomic.Pointer[context.CancelFunc]
}

func (c *cancelOnRead) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "WITH h AS MATERIALIZED") && c.n.Add(1) == c.at {
		if cancel := c.cancel.Load(); cancel != nil {
			(*cancel)()
		}
	}
	return ctx
}
func (c *cancelOnRead) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// A catch-up to a target whose context ends while it reads a batch says
// that it stopped before the target: it used to return nil, so
// RunUntilCaughtUp and Rebuild reported success short of the head.
func TestCatchUpContextEndsDuringARead(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	store, err := eventstore.New(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if _, err := store.Append(ctx, "s-1", eventstore.Exact(int64(i)), eventstore.EventData{Type: "t.x", Data: map[string]int{}}); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	tracer := &cancelOnRead{at: 3}
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	e, err := catchup.NewEngine(pool, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	head, err := e.Head(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, ephemeral := range []bool{false, true} {
		tracer.n.Store(0)
		cctx, cancel := context.WithCancel(ctx)
		tracer.cancel.Store(&cancel)
		sub := &catchup.Subscription{Name: "ctxend", Processor: nopProcessor{}, BatchSize: 1, Ephemeral: ephemeral}
		err := e.CatchUp(cctx, sub, head)
		cancel()
		if err == nil {
			t.Fatalf("ephemeral %v: CatchUp returned nil although its context ended at the third read, short of %d", ephemeral, head)
		}
		if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "before reaching") {
			t.Fatalf("ephemeral %v: CatchUp: %v; want the context's error, saying it stopped before reaching the target", ephemeral, err)
		}
	}
}
