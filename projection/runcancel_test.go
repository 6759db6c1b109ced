package projection_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/projection"
)

// cancelOnQuery cancels a context when a query whose SQL contains match
// starts on the pool.
type cancelOnQuery struct {
	match  string
	cancel atomic.Pointer[context.CancelFunc]
}

func (c *cancelOnQuery) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if strings.Contains(data.SQL, c.match) {
		if f := c.cancel.Load(); f != nil {
			(*f)()
		}
	}
	return ctx
}

func (c *cancelOnQuery) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// Run returns nil once its context ends, also when it ends during the
// start-up steps (Ctrl-C right after start): 'annals relay' exited 1 with
// "projection: register the instance: context canceled". A step that
// fails for another reason while ctx lives still fails Run.
func TestRunCanceledDuringStartReturnsNil(t *testing.T) {
	t.Parallel()
	for _, match := range []string{
		"instances (instance_id", // the instance's registration, the last step
		"subscriber_layouts",     // the kind and layout checks, the first ones
	} {
		t.Run(match, func(t *testing.T) {
			tracer := &cancelOnQuery{match: match}
			db := annalstest.NewDB(t, &annalstest.Options{PoolConfig: func(c *pgxpool.Config) { c.ConnConfig.Tracer = tracer }})
			r, err := projection.NewRunner(db.Pool, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := r.Register(namedObserver{"watcher"}, nil); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			tracer.cancel.Store(&cancel)
			if err := r.Run(ctx); err != nil {
				t.Fatalf("Run canceled during its start: %v, want nil", err)
			}
		})
	}
	t.Run("already canceled", func(t *testing.T) {
		db := annalstest.NewDB(t, nil)
		r, err := projection.NewRunner(db.Pool, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Register(namedObserver{"watcher"}, nil); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if err := r.Run(ctx); err != nil {
			t.Fatalf("Run with an ended context: %v, want nil", err)
		}
	})
}
