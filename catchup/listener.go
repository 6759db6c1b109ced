package catchup

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/checkpoint"
	"github.com/annals-dev/annals/internal/poolconn"
	"github.com/annals-dev/annals/internal/schemaname"
	"github.com/annals-dev/annals/internal/telemetry"
)

// Listener holds the process's one LISTEN connection and fans wake-up
// signals out to every local subscription. Signals are coalesced (a
// subscription only learns "the head moved", never which events) and never
// trusted as data: a subscription always re-reads from its checkpoint. When
// the connection is lost, Listener reconnects with backoff and, once it
// listens again, signals every subscription so that none waits for a
// notification sent while nobody listened.
//
// The same connection listens to the schema's fence channel
// (checkpoint.FenceChannel) and passes each announcement to the engine's
// leader of the fenced partition only, whatever wakes that leader for new
// events (see "Announcing a fence" in the package documentation).
type Listener struct {
	connConfig   *pgx.ConnConfig
	connect      poolconn.ConnectFunc
	channel      string
	fenceChannel string
	logger       *slog.Logger

	mu        sync.Mutex
	subs      map[chan struct{}]struct{}
	fences    map[string]map[chan struct{}]struct{} // by checkpoint.FencePayload
	listening chan struct{}                         // closed while LISTEN is active; replaced on loss
	up        bool

	// listened is set at the first successful LISTEN; reconnects counts
	// the successful ones after it.
	listened   atomic.Bool
	reconnects atomic.Int64
	// failures logs the reconnect attempts of an outage (Run's goroutine).
	failures failureLog
}

// NewListener returns a Listener for the schema's channel on connections
// made from connConfig (which is copied) with pgx.ConnectConfig. logger may
// be nil. For connections made as a pool makes its own (its BeforeConnect
// and AfterConnect hooks), use NewPoolListener.
func NewListener(connConfig *pgx.ConnConfig, schema string, logger *slog.Logger) (*Listener, error) {
	return newListener(connConfig, pgx.ConnectConfig, schema, logger)
}

// NewPoolListener returns a Listener for the schema's channel whose
// connection is opened, at every (re)connect, the way pool opens its own:
// from a copy of pool's ConnConfig, with pool's BeforeConnect run on it
// (where rotating credentials such as an IAM token are supplied) and its
// AfterConnect run on the new connection. The connection is not taken
// from the pool. logger may be nil.
func NewPoolListener(pool *pgxpool.Pool, schema string, logger *slog.Logger) (*Listener, error) {
	if pool == nil {
		return nil, errors.New("catchup: listener needs a pool")
	}
	cc, hooks := poolconn.Of(pool)
	return newListener(cc, hooks.Connect, schema, logger)
}

func newListener(connConfig *pgx.ConnConfig, connect poolconn.ConnectFunc, schema string, logger *slog.Logger) (*Listener, error) {
	if connConfig == nil {
		return nil, errors.New("catchup: listener needs a connection config")
	}
	var err error
	if schema, err = schemaname.Resolve(schema); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = telemetry.DefaultLogger()
	}
	return &Listener{
		failures:     failureLog{log: logger},
		connConfig:   connConfig.Copy(),
		connect:      connect,
		channel:      schemaname.Channel(schema),
		fenceChannel: checkpoint.FenceChannel(schema),
		logger:       logger,
		subs:         map[chan struct{}]struct{}{},
		fences:       map[string]map[chan struct{}]struct{}{},
		listening:    make(chan struct{}),
	}, nil
}

// Subscribe returns a channel that receives a (coalesced) signal whenever
// the head may have moved, and a function that unsubscribes.
func (l *Listener) Subscribe() (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	l.mu.Lock()
	l.subs[ch] = struct{}{}
	l.mu.Unlock()
	return ch, func() {
		l.mu.Lock()
		delete(l.subs, ch)
		l.mu.Unlock()
	}
}

// subscribeFence returns a channel that receives a (coalesced) signal
// whenever the fence of subscriber's partition is announced, and at every
// (re)connect and loss of the connection (an announcement may have been
// missed), and a function that unsubscribes. A signal is a hint: the
// leader reads its checkpoint's epoch again.
func (l *Listener) subscribeFence(subscriber string, partition int) (<-chan struct{}, func()) {
	key := checkpoint.FencePayload(subscriber, partition)
	ch := make(chan struct{}, 1)
	l.mu.Lock()
	if l.fences[key] == nil {
		l.fences[key] = map[chan struct{}]struct{}{}
	}
	l.fences[key][ch] = struct{}{}
	l.mu.Unlock()
	return ch, func() {
		l.mu.Lock()
		delete(l.fences[key], ch)
		if len(l.fences[key]) == 0 {
			delete(l.fences, key)
		}
		l.mu.Unlock()
	}
}

// Listening returns a channel that is closed while the listener's LISTEN is
// active. After a loss, a new (open) channel is returned until it is back.
func (l *Listener) Listening() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.listening
}

// Reconnects returns how many times the listener's LISTEN was re-established
// after a lost connection: failed attempts in between do not count.
func (l *Listener) Reconnects() int64 { return l.reconnects.Load() }

// broadcast signals every subscription; with fences, every fence
// subscription too (the connection was lost or is back: an announcement
// may have been missed).
func (l *Listener) broadcast(fences bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for ch := range l.subs {
		poke(ch)
	}
	if fences {
		for _, chs := range l.fences {
			for ch := range chs {
				poke(ch)
			}
		}
	}
}

// fenced signals the fence subscriptions of the partition whose
// checkpoint.FencePayload is key.
func (l *Listener) fenced(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for ch := range l.fences[key] {
		poke(ch)
	}
}

// poke sends on ch (of capacity 1) unless a signal is pending already:
// coalesced.
func poke(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

func (l *Listener) setUp(up bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if up == l.up {
		return
	}
	l.up = up
	if up {
		close(l.listening)
	} else {
		l.listening = make(chan struct{})
	}
}

// Run listens until ctx ends, reconnecting with backoff (100 ms doubling to
// 1 s, with jitter) after any failure, so that subscriptions are woken again
// within a second of the database accepting connections, whatever their
// PollInterval. It returns nil when ctx ends.
func (l *Listener) Run(ctx context.Context) error {
	backoff := 100 * time.Millisecond
	for {
		wasUp, err := l.listen(ctx)
		l.setUp(false)
		if ctx.Err() != nil {
			return nil
		}
		// Once per attempt while the database is down: the first is a
		// WARN, the repeats DEBUG (see failureLog), and listen logs the
		// LISTEN that ends them.
		l.failures.failed(ctx, "annals: listener connection lost; reconnecting",
			slog.String("channel", l.channel), telemetry.Err(err), slog.Duration("backoff", backoff))
		// Subscriptions fall back to polling meanwhile; wake them to re-read now.
		l.broadcast(true)
		d := backoff/2 + rand.N(backoff/2+1)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(d):
		}
		if backoff *= 2; backoff > time.Second {
			backoff = time.Second
		}
		if wasUp { // it had been listening: start the backoff over
			backoff = 100 * time.Millisecond
		}
	}
}

// listen runs one connection: LISTEN, then wait for notifications, until
// the connection fails or ctx ends. wasUp reports whether LISTEN succeeded.
func (l *Listener) listen(ctx context.Context) (wasUp bool, err error) {
	conn, err := l.connect(ctx, l.connConfig)
	if err != nil {
		return false, errors.Wrap(err, "catchup: connect listener")
	}
	defer conn.Close(context.WithoutCancel(ctx))
	// Both channels in one round trip (one simple-protocol query).
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{l.channel}.Sanitize()+"; LISTEN "+pgx.Identifier{l.fenceChannel}.Sanitize()); err != nil {
		return false, errors.Wrap(err, "catchup: LISTEN")
	}
	if l.listened.Swap(true) {
		l.reconnects.Add(1)
	}
	l.failures.recovered(ctx, "annals: listener listening again", slog.String("channel", l.channel))
	l.setUp(true)
	l.broadcast(true) // anything committed before LISTEN took effect: re-read
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return true, errors.Wrap(err, "catchup: wait for notification")
		}
		if n.Channel == l.fenceChannel {
			l.fenced(n.Payload)
			continue
		}
		l.broadcast(false)
	}
}
