package catchup_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/eventstore"
)

// readCounter counts the batch reads (statements that read the events with
// the batch header) sent on a pool.
type readCounter struct{ n atomic.Int64 }

func (c *readCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "WITH h AS MATERIALIZED") {
		c.n.Add(1)
	}
	return ctx
}
func (c *readCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// signalProcessor reports each batch's events on a channel.
type signalProcessor struct {
	nopProcessor // Start, Redeliver, Idle, End
	mu           sync.Mutex
	seen         []int64
	got          chan struct{}
}

func (p *signalProcessor) Process(_ context.Context, _ *catchup.Lease, b catchup.Batch) (int64, error) {
	p.mu.Lock()
	for _, e := range b.Events {
		p.seen = append(p.seen, e.GlobalSequence)
	}
	p.mu.Unlock()
	if len(b.Events) > 0 {
		p.got <- struct{}{}
	}
	return b.Through, nil
}

// A live subscription reads once per event it is woken for: a batch that
// was not full reached the head of its read, so the engine waits for the
// next signal instead of reading again at once (which would find nothing).
// Every event still arrives, in order.
func TestLiveReadsOncePerWake(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	store, err := eventstore.New(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	counter := &readCounter{}
	cfg.ConnConfig.Tracer = counter
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	listener, err := catchup.NewListener(pool.Config().ConnConfig, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	lctx, stopListener := context.WithCancel(ctx)
	defer stopListener()
	go func() { _ = listener.Run(lctx) }()
	// A poll interval of a minute: every read in this test is one a
	// signal (or the start) caused.
	e, err := catchup.NewEngine(pool, listener, &catchup.Config{PollInterval: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	p := &signalProcessor{got: make(chan struct{}, 1)}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- e.Run(rctx, &catchup.Subscription{Name: "live", Processor: p}) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	// The first event: the subscription is leading and listening once it has
	// it.
	append1 := func() {
		t.Helper()
		if _, err := store.Append(ctx, "s-1", eventstore.Any, eventstore.EventData{Type: "t.x", Data: map[string]int{}}); err != nil {
			t.Fatal(err)
		}
		select {
		case <-p.got:
		case <-time.After(10 * time.Second):
			t.Fatal("an event was not delivered within 10 s")
		}
	}
	append1()
	before := counter.n.Load()
	const n = 20
	for range n {
		append1()
	}
	reads := counter.n.Load() - before
	t.Logf("%d batch reads for %d events appended one at a time", reads, n)
	if reads > n+2 {
		t.Fatalf("%d batch reads for %d events, one wake each: want at most %d", reads, n, n+2)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.seen) != n+1 {
		t.Fatalf("%d events delivered, want %d", len(p.seen), n+1)
	}
	for i := 1; i < len(p.seen); i++ {
		if p.seen[i] <= p.seen[i-1] {
			t.Fatalf("delivered out of order: %v", p.seen)
		}
	}
}
