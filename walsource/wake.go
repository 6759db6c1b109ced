package walsource

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/internal/lockkey"
	"github.com/annals-dev/annals/internal/schemaname"
	"github.com/annals-dev/annals/internal/telemetry"
)

// WakeConfig configures a Wake. A nil *WakeConfig means defaults.
type WakeConfig struct {
	// Schema is the annals schema. Defaults to "annals".
	Schema string
	// StatusInterval goes to each Source. Defaults to 500ms.
	StatusInterval time.Duration
	// Logger receives reconnects, the re-creation of an invalidated slot,
	// and a Source's permanent failure (Source.Run). Defaults to warnings
	// and errors on slog.Default() (information and debug records dropped).
	Logger *slog.Logger
	// OnCommit, when set, also receives every Commit a leadership's Source
	// decodes (for tests and metrics), after the Waker has signalled for it
	// or not. Defaults to nothing.
	OnCommit func(sub string, partition int, c Commit)
	// AdvanceAfter is how long after a commit the engine is woken at the
	// latest, whether the commit had events for it or not: once for all
	// the commits of that span. A commit without an event the filter
	// matches in the partition signals nothing by itself, and the slot is
	// confirmed only through the partition's checkpoint, so without this
	// wake the slot would retain the WAL of such commits, and the
	// checkpoint would stay behind them, until the next poll. Woken, the
	// engine reads, finds nothing for it, moves its checkpoint to the
	// head, and the slot's confirmed position follows. Defaults to 1s.
	AdvanceAfter time.Duration
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
	// utf8 reports a UTF8 server encoding: the stream IDs the WAL sends
	// (client encoding UTF8) are then the bytes stream_partition hashes.
	utf8 bool

	mu  sync.Mutex
	err error // the last permanent failure of a leadership's Source (Err)
}

// StoppingWaker is the catchup.Waker that Wake.For returns: it also tells
// when the leadership's Source has stopped for good.
type StoppingWaker interface {
	catchup.Waker
	// Stopped returns a channel that is closed when the Source has stopped
	// on a *PermanentError (Source.Run): the Waker signals nothing more,
	// and the engine polls.
	Stopped() <-chan struct{}
	// Err returns that *PermanentError once Stopped is closed, nil before.
	Err() error
}

// Err returns the *PermanentError on which a leadership's Source last
// stopped for good (see Source.Run), so that an application can tell, in a
// health check say, that the WAL does not wake its subscribers and why;
// nil when none has, or when a leadership's Source has streamed since.
// Each new leadership tries again.
func (w *Wake) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

func (w *Wake) setErr(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.err = err
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
		c.Logger = telemetry.DefaultLogger()
	}
	if c.AdvanceAfter <= 0 {
		c.AdvanceAfter = time.Second
	}
	var database, encoding string
	if err := pool.QueryRow(ctx, `SELECT current_database(), pg_catalog.current_setting('server_encoding')`).Scan(&database, &encoding); err != nil {
		return nil, errors.Wrap(err, "walsource: current database")
	}
	if _, err := EnsurePublication(ctx, pool, c.Schema); err != nil {
		return nil, err
	}
	cpSQL, err := checkpointSQL(c.Schema)
	if err != nil {
		return nil, err
	}
	return &Wake{pool: pool, cfg: c, database: database, cpSQL: cpSQL, utf8: encoding == "UTF8"}, nil
}

// Slot returns the replication slot of a subscriber partition.
func (w *Wake) Slot(subscriber string, partition int) string {
	return SlotName(w.database, w.cfg.Schema, subscriber, partition)
}

// For is a catchup.WakeFor: it starts streaming from the partition's slot
// and returns a Waker that signals whenever a transaction appended an event
// the subscription's filter matches and that falls in its partition (when
// partitioned by stream or category; by a metadata field, an event of any
// partition signals), at every (re)connect, and AdvanceAfter after any
// commit at the latest. The slot is confirmed only through what the
// partition's checkpoint holds.
//
// When PostgreSQL refuses the stream for good (Source.Run's
// *PermanentError: a role without REPLICATION, wal_level below logical),
// the Source logs it once and stops; the Waker (a StoppingWaker) then
// signals nothing, the engine polls at its PollInterval, and Err reports
// the failure. The next leadership tries again.
func (w *Wake) For(ctx context.Context, sub *catchup.Subscription, lease *catchup.Lease) (catchup.Waker, func()) {
	b := newBroadcaster(w.cfg.AdvanceAfter)
	name, part := sub.Name, sub.Partition
	inPartition := w.partitionOf(sub)
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
			for _, e := range c.Events {
				if sub.Filter.Match(e.Type) && inPartition(e.StreamID) {
					b.signal()
					break
				}
			}
			// Also for a commit just signalled: its read may have come a
			// moment before the commit was visible, and found nothing.
			b.signalLater()
			if w.cfg.OnCommit != nil {
				w.cfg.OnCommit(name, part, c)
			}
		},
		OnStreaming: func(on bool) {
			b.setUp(on)
			if on {
				w.setErr(nil)
				b.signal() // anything committed while nobody streamed: re-read
			}
		},
	})
	if err != nil { // only for invalid configuration, which For never makes
		w.cfg.Logger.ErrorContext(ctx, "annals: WAL wake-up unavailable; polling", errAttrs(err)...)
		return b, func() {}
	}
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := src.Run(sctx); err != nil {
			w.setErr(err)
			b.fail(err)
		}
	}()
	return b, func() { cancel(); <-done; b.stop() }
}

// partitionOf returns whether an event of a stream falls in sub's
// partition, as the engine's read computes it (annals.stream_partition of
// the partition key): for unpartitioned subscribers always, and also for
// keys that the decoded event cannot reproduce byte for byte (a metadata
// field, whose JSON text PostgreSQL renders; stream IDs in a server
// encoding other than UTF8). Erring that way costs an empty read.
func (w *Wake) partitionOf(sub *catchup.Subscription) func(streamID string) bool {
	n, part := sub.Partitions, sub.Partition
	if n <= 1 || !w.utf8 {
		return func(string) bool { return true }
	}
	switch sub.PartitionBy {
	case "", catchup.PartitionByStream:
		return func(id string) bool { return streamPartition(id, n) == part }
	case catchup.PartitionByCategory:
		return func(id string) bool {
			category, _, _ := strings.Cut(id, "-") // split_part(stream_id, '-', 1)
			return streamPartition(category, n) == part
		}
	}
	return func(string) bool { return true }
}

// streamPartition is annals.stream_partition (migrations/sql/0002): the
// first four bytes of md5(key) as an int4, masked to non-negative, modulo n.
func streamPartition(key string, n int) int {
	k1, _ := lockkey.Pair(key)
	return int(int64(k1)&0x7fffffff) % n
}

// broadcaster is a catchup.Waker fed by a Source.
type broadcaster struct {
	mu        sync.Mutex
	subs      map[chan struct{}]struct{}
	listening chan struct{}
	up        bool
	// later signals after advanceAfter (signalLater); armed while it runs.
	advanceAfter time.Duration
	later        *time.Timer
	armed        bool
	stopped      bool
	// failed is closed, and err set, when the Source stopped for good.
	failed chan struct{}
	err    error
}

func newBroadcaster(advanceAfter time.Duration) *broadcaster {
	return &broadcaster{subs: map[chan struct{}]struct{}{}, listening: make(chan struct{}), advanceAfter: advanceAfter, failed: make(chan struct{})}
}

var _ StoppingWaker = (*broadcaster)(nil)

func (b *broadcaster) Stopped() <-chan struct{} { return b.failed }

func (b *broadcaster) Err() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.err
}

// fail records the Source's permanent failure.
func (b *broadcaster) fail(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.err = err
	close(b.failed)
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

// signalLater signals advanceAfter from now, unless a signal is already
// due then: one signal for every commit of the span.
func (b *broadcaster) signalLater() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.armed || b.stopped {
		return
	}
	b.armed = true
	if b.later == nil {
		b.later = time.AfterFunc(b.advanceAfter, b.fire)
	} else {
		b.later.Reset(b.advanceAfter)
	}
}

func (b *broadcaster) fire() {
	b.mu.Lock()
	b.armed = false
	b.mu.Unlock()
	b.signal()
}

// stop ends signalLater's timer.
func (b *broadcaster) stop() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.stopped = true
	if b.later != nil {
		b.later.Stop()
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
