package walsource

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/internal/schemaname"
	"github.com/annals-dev/annals/internal/telemetry"
)

// WakeConfig configures a Wake. A nil *WakeConfig means defaults.
type WakeConfig struct {
	// Schema is the annals schema. Defaults to "annals".
	Schema string
	// StatusInterval goes to each Source. Defaults to 500ms.
	StatusInterval time.Duration
	// Logger receives reconnects. Defaults to discarding.
	Logger *slog.Logger
	// OnCommit, when set, also receives every Commit a leadership's Source
	// decodes (for tests and metrics). Defaults to nothing.
	OnCommit func(sub string, partition int, c Commit)
}

// Wake wakes led subscriber partitions from the WAL instead of NOTIFY:
// each leadership streams from a replication slot of its own partition and
// confirms it as the partition's checkpoint commits. Pass its For method as
// projection.Config.Wake or catchup.Config.WakeFor.
type Wake struct {
	pool     *pgxpool.Pool
	cfg      WakeConfig
	database string
	cpSQL    string
}

// NewWake returns a Wake on pool (whose role needs the REPLICATION
// attribute, and CREATE on the database for the publication's first use).
func NewWake(ctx context.Context, pool *pgxpool.Pool, cfg *WakeConfig) (*Wake, error) {
	if pool == nil {
		return nil, errors.New("walsource: pool is nil")
	}
	var c WakeConfig
	if cfg != nil {
		c = *cfg
	}
	var err error
	if c.Schema, err = schemaname.Resolve(c.Schema); err != nil {
		return nil, err
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	var database string
	if err := pool.QueryRow(ctx, `SELECT current_database()`).Scan(&database); err != nil {
		return nil, errors.Wrap(err, "walsource: current database")
	}
	if _, err := EnsurePublication(ctx, pool, c.Schema); err != nil {
		return nil, err
	}
	cpSQL, err := checkpointSQL(c.Schema)
	if err != nil {
		return nil, err
	}
	return &Wake{pool: pool, cfg: c, database: database, cpSQL: cpSQL}, nil
}

// Slot returns the replication slot of a subscriber partition.
func (w *Wake) Slot(subscriber string, partition int) string {
	return SlotName(w.database, w.cfg.Schema, subscriber, partition)
}

// For is a catchup.WakeFor: it starts streaming from the partition's slot
// and returns a Waker that signals whenever a transaction appended an event
// the subscription's filter matches, and at every (re)connect. The slot is
// confirmed only through what the partition's checkpoint holds.
func (w *Wake) For(ctx context.Context, sub *catchup.Subscription, lease *catchup.Lease) (catchup.Waker, func()) {
	b := newBroadcaster()
	name, part := sub.Name, sub.Partition
	src, err := New(w.pool, &Config{
		Schema:         w.cfg.Schema,
		Slot:           w.Slot(name, part),
		StatusInterval: w.cfg.StatusInterval,
		Logger:         w.cfg.Logger,
		Confirmed: func(ctx context.Context) (int64, error) {
			var pos int64
			err := w.pool.QueryRow(ctx, w.cpSQL, name, part).Scan(&pos)
			return pos, errors.Wrap(err, "walsource: read the checkpoint")
		},
		OnCommit: func(c Commit) {
			if w.cfg.OnCommit != nil {
				w.cfg.OnCommit(name, part, c)
			}
			for _, e := range c.Events {
				if sub.Filter.Match(e.Type) {
					b.signal()
					return
				}
			}
		},
		OnStreaming: func(on bool) {
			b.setUp(on)
			if on {
				b.signal() // anything committed while nobody streamed: re-read
			}
		},
	})
	if err != nil { // only for invalid configuration, which For never makes
		w.cfg.Logger.ErrorContext(ctx, "annals: WAL wake-up unavailable; polling", telemetry.Err(err))
		return b, func() {}
	}
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() { defer close(done); _ = src.Run(sctx) }()
	return b, func() { cancel(); <-done }
}

// broadcaster is a catchup.Waker fed by a Source.
type broadcaster struct {
	mu        sync.Mutex
	subs      map[chan struct{}]struct{}
	listening chan struct{}
	up        bool
}

func newBroadcaster() *broadcaster {
	return &broadcaster{subs: map[chan struct{}]struct{}{}, listening: make(chan struct{})}
}

func (b *broadcaster) Subscribe() (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	b.mu.Lock()
	b.subs[ch] = struct{}{}
	b.mu.Unlock()
	return ch, func() {
		b.mu.Lock()
		delete(b.subs, ch)
		b.mu.Unlock()
	}
}

func (b *broadcaster) Listening() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.listening
}

func (b *broadcaster) signal() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for ch := range b.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

func (b *broadcaster) setUp(up bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if up == b.up {
		return
	}
	b.up = up
	if up {
		close(b.listening)
	} else {
		b.listening = make(chan struct{})
	}
}
