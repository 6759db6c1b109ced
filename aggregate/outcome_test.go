package aggregate_test

import (
	"context"
	stderrors "errors"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/aggregate"
	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/schemaname"
)

// cutProxy forwards TCP connections to a PostgreSQL server. cut closes the
// client side of every open connection and leaves the server side open: the
// client loses its connection, while the server goes on with the statement
// it was running (and commits it) without noticing.
type cutProxy struct {
	ln      net.Listener
	dial    func() (net.Conn, error)
	mu      sync.Mutex
	refuse  bool // cut: new connections are refused until heal
	clients []net.Conn
	servers []net.Conn
}

func newCutProxy(t *testing.T, network, addr string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, dial: func() (net.Conn, error) { return net.Dial(network, addr) }}
	go p.accept()
	t.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, c := range append(p.clients, p.servers...) {
			_ = c.Close()
		}
	})
	return p
}

func (p *cutProxy) accept() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		refuse := p.refuse
		p.mu.Unlock()
		if refuse {
			_ = client.Close()
			continue
		}
		server, err := p.dial()
		if err != nil {
			_ = client.Close()
			continue
		}
		p.mu.Lock()
		p.clients = append(p.clients, client)
		p.servers = append(p.servers, server)
		p.mu.Unlock()
		go func() { _, _ = io.Copy(server, client) }() // ends when the client side is cut
		go func() { _, _ = io.Copy(io.Discard, io.TeeReader(server, client)) }()
	}
}

// cut closes the client side of every connection open now and refuses
// new ones until heal: the client can reach the server in no way (not even
// to cancel the statement it sent).
func (p *cutProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refuse = true
	for _, c := range p.clients {
		_ = c.Close()
	}
	p.clients = nil
}

// heal accepts new connections again.
func (p *cutProxy) heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refuse = false
}

// proxiedPool returns a pool on db whose connections go through a cutProxy.
func proxiedPool(t *testing.T, db *annalstest.DB, mode ...pgx.QueryExecMode) (*pgxpool.Pool, *cutProxy) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	if len(mode) > 0 {
		cfg.ConnConfig.DefaultQueryExecMode = mode[0]
	}
	network, addr := "tcp", net.JoinHostPort(cfg.ConnConfig.Host, itoa(cfg.ConnConfig.Port))
	if strings.HasPrefix(cfg.ConnConfig.Host, "/") {
		network, addr = "unix", cfg.ConnConfig.Host+"/.s.PGSQL."+itoa(cfg.ConnConfig.Port)
	}
	p := newCutProxy(t, network, addr)
	host, port, _ := net.SplitHostPort(p.ln.Addr().String())
	cfg.ConnConfig.Host = host
	cfg.ConnConfig.Port = uint16(atoi(port))
	cfg.ConnConfig.TLSConfig = nil
	cfg.ConnConfig.Fallbacks = nil
	cfg.ConnConfig.RuntimeParams["application_name"] = "aggregate-proxied"
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, p
}

// A Save whose connection is lost after its append was sent gets
// ErrOutcomeUnknown while the server commits the append; saving the same
// aggregate again is then an idempotent re-append that returns the stored
// version and writes nothing twice. So too with a pool in
// QueryExecModeSimpleProtocol, where pgx (v5.12) reports the lost answer of
// a simple-protocol query as an error safe to retry, which Save took for
// ErrNotWritten ("nothing was written") while the append committed.
func TestSaveAgainAfterTheConnectionWasLost(t *testing.T) {
	t.Parallel()
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			saveAgainAfterTheConnectionWasLost(t, mode)
		})
	}
}

func saveAgainAfterTheConnectionWasLost(t *testing.T, mode pgx.QueryExecMode) {
	ctx := context.Background()
	b := setup(t)
	pool, proxy := proxiedPool(t, b.db, mode)
	store, err := eventstore.New(pool, &eventstore.Config{Registry: registry()})
	if err != nil {
		t.Fatal(err)
	}
	r, err := aggregate.NewRepository(store, "account", newAccount, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Create(ctx, "1", func(a *Account) error { return a.Open("ada") }); err != nil {
		t.Fatal(err)
	}
	a, err := r.Load(ctx, "1")
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Deposit(10); err != nil {
		t.Fatal(err)
	}

	// Hold the log's ordering lock, so that the save's append waits on the
	// server once sent.
	lock, err := b.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lock.Rollback(ctx) }()
	k1, k2 := schemaname.AppendLockKey("annals")
	if _, err := lock.Exec(ctx, `SELECT pg_advisory_xact_lock($1, $2)`, k1, k2); err != nil {
		t.Fatal(err)
	}
	saved := make(chan error, 1)
	go func() { saved <- r.Save(ctx, a) }()
	annalstest.WaitForErr(t, 30*time.Second, func() error {
		var n int
		if err := b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = 'aggregate-proxied'
			  AND wait_event_type = 'Lock' AND wait_event = 'advisory'`).Scan(&n); err != nil {
			return err
		}
		if n != 1 {
			return stderrors.New("the save's append is not waiting for the ordering lock yet")
		}
		return nil
	})
	proxy.cut()
	var first error
	select {
	case first = <-saved:
	case <-time.After(30 * time.Second):
		t.Fatal("Save did not return within 30s of losing its connection")
	}
	if !stderrors.Is(first, eventstore.ErrOutcomeUnknown) || !strings.Contains(first.Error(), "Save the same aggregate again") {
		t.Fatalf("Save on a lost connection: %v; want ErrOutcomeUnknown, advising to save again", first)
	}
	// The server still runs the append: let it commit.
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	annalstest.WaitFor(t, 30*time.Second, func() bool { return streamLen(t, b, "account-1") == 2 })
	proxy.heal()

	if err := r.Save(ctx, a); err != nil {
		t.Fatalf("Save again after the written attempt: %v, want nil", err)
	}
	if a.Version() != 2 || len(a.Uncommitted()) != 0 {
		t.Errorf("after saving again: version %d, %d uncommitted; want 2, 0", a.Version(), len(a.Uncommitted()))
	}
	if n := streamLen(t, b, "account-1"); n != 2 {
		t.Errorf("the stream has %d events, want 2 (the deposit once)", n)
	}
}

func itoa(n uint16) string { return strconv.Itoa(int(n)) }

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}
