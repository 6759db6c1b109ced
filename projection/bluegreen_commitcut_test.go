package projection_test

import (
	"context"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/projection"
)

// cutOnCommitAfter arms the connection of a query whose SQL contains match
// (once) to be cut right after it sends its transaction's COMMIT: the
// server commits, the client gets an error instead of the answer.
type cutOnCommitAfter struct {
	match string
	armed atomic.Bool
	// freeze, when set, stops the connection's backend (SIGSTOP) before
	// the COMMIT is sent and lets it go on that much later: the client sees
	// its connection cut while the server has not run the COMMIT yet.
	freeze time.Duration
	froze  atomic.Bool
}

func (c *cutOnCommitAfter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (c *cutOnCommitAfter) TraceQueryEnd(_ context.Context, conn *pgx.Conn, d pgx.TraceQueryEndData) {
	if d.Err == nil && strings.Contains(d.CommandTag.String(), "UPDATE") && conn != nil {
		if cc, ok := conn.PgConn().Conn().(*annalstest.CutConn); ok && c.armed.CompareAndSwap(false, true) {
			if c.freeze > 0 {
				pid := int(conn.PgConn().PID())
				if err := syscall.Kill(pid, syscall.SIGSTOP); err == nil {
					c.froze.Store(true)
					time.AfterFunc(c.freeze, func() { _ = syscall.Kill(pid, syscall.SIGCONT) })
				}
			}
			cc.CutAfter(annalstest.HasCommit)
		}
	}
}

// TestBlueGreenCutoverCommitLost: the cut-over of RebuildBlueGreen commits,
// but its connection is cut before the answer comes back. Readers have
// moved to generation 2; RebuildBlueGreen says so (a Cutover to it, no
// error) instead of failing with "conn closed", which had an operator run
// it again, and so build a generation 3 of the same version (after which a
// rollback goes to generation 2, not to version 1).
func TestBlueGreenCutoverCommitLost(t *testing.T) {
	t.Parallel()
	cutoverCommitLost(t, 0)
}

// TestBlueGreenCutoverCommitLostBeforeTheServerCommits: the same, with the
// server running the COMMIT only after the client has seen its connection
// cut (its backend stopped for half a second), as a loaded machine does now
// and then: RebuildBlueGreen read the generation's state at once, found it
// building, and failed with "conn closed" (make test failed so once); it
// reads it under the generations' lock, which the cut-over's transaction
// holds until it ends on the server. The backend is the test cluster's,
// on this machine (as the crash tests stop PostgreSQL's processes).
func TestBlueGreenCutoverCommitLostBeforeTheServerCommits(t *testing.T) {
	t.Parallel()
	cutoverCommitLost(t, 500*time.Millisecond)
}

func cutoverCommitLost(t *testing.T, freeze time.Duration) {
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	log := &bgLog{db: db}
	seedV1(t, db, log, 5, 5)

	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	var d net.Dialer
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &annalstest.CutConn{Conn: c}, nil
	}
	tracer := &queryTracerFor{}
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	r, err := projection.NewRunner(pool, &projection.Config{InstanceID: "v2", RetryBackoff: 100 * time.Millisecond, ShutdownTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Register(statsProjection(2), &projection.Options{BlueGreen: &projection.BlueGreen{Version: 2}}); err != nil {
		t.Fatal(err)
	}
	tracer.cut = &cutOnCommitAfter{freeze: freeze}
	c, err := r.RebuildBlueGreen(ctx, bgName, nil)
	t.Logf("RebuildBlueGreen: %+v, %v", c, err)
	if !tracer.cut.armed.Load() {
		t.Fatal("the cut-over's commit was not cut")
	}
	if freeze > 0 && !tracer.cut.froze.Load() {
		t.Fatal("the cut-over's backend was not stopped (SIGSTOP): is the test cluster on this machine?")
	}
	if s := state(t, db, 2); s != projection.GenerationLive {
		t.Fatalf("generation 2 is %s: the commit was lost?", s)
	}
	if err != nil || c.To != 2 {
		t.Errorf("RebuildBlueGreen returned %+v, %v, with generation 2 live", c, err)
	}
	readerSees(t, db, log, 2)
}

// queryTracerFor passes a query's end to cut when it is the cut-over's
// MarkLive.
type queryTracerFor struct {
	cut *cutOnCommitAfter
}

func (q *queryTracerFor) TraceQueryStart(ctx context.Context, conn *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if q.cut != nil && strings.Contains(d.SQL, "SET state = 'live', live_since") {
		return context.WithValue(ctx, markLiveKey{}, true)
	}
	return ctx
}

type markLiveKey struct{}

func (q *queryTracerFor) TraceQueryEnd(ctx context.Context, conn *pgx.Conn, d pgx.TraceQueryEndData) {
	if q.cut != nil && ctx.Value(markLiveKey{}) != nil {
		q.cut.TraceQueryEnd(ctx, conn, d)
	}
}
