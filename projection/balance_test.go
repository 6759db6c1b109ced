package projection_test

// Balanced leadership across processes: runner children share the
// partitions of a transactional projection and of an observer, join,
// are SIGKILLed and stop gracefully while events are appended; the test
// checks the share of each at every step, that the counting projection
// equals the log at the end (exactly once through every handover) and that
// each observer process saw every stream's events in order.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/advisorylock"
	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/childproc"
	"github.com/annals-dev/annals/projection"
)

// kindBalanced runs streamCounter ("counter") and orderObserver
// ("watcher"), both with childMode.Partitions partitions.
const kindBalanced = "balanced"

// balanceTables: counted has a row per application of an event (no key:
// a second application is counted, not refused), counts the per-stream
// count the projection maintains, seen a row per delivery to the observer
// in delivery order.
const balanceTables = `
CREATE TABLE counted (event_id uuid NOT NULL, instance text NOT NULL, global_sequence bigint NOT NULL);
CREATE TABLE counts (stream_id text PRIMARY KEY, n bigint NOT NULL);
CREATE TABLE seen (id bigserial PRIMARY KEY, instance text NOT NULL, stream_id text NOT NULL,
                   stream_version bigint NOT NULL, global_sequence bigint NOT NULL);`

// counter is a transactional projection counting events per stream.
type streamCount struct{ instance string }

func streamCounter(instance string) projection.Projection { return streamCount{instance} }

func (streamCount) Name() string { return "counter" }

func (c streamCount) Handle(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	_, err := tx.Exec(ctx, `
		WITH rec AS (INSERT INTO counted (event_id, instance, global_sequence) VALUES ($1, $2, $3))
		INSERT INTO counts (stream_id, n) VALUES ($4, 1)
		ON CONFLICT (stream_id) DO UPDATE SET n = counts.n + 1`, e.ID, c.instance, e.GlobalSequence, e.StreamID)
	return err
}

// watcher is an observer recording each delivery through the pool.
type watcher struct {
	pool     *pgxpool.Pool
	instance string
}

func orderObserver(pool *pgxpool.Pool, instance string) projection.Observer {
	return watcher{pool, instance}
}

func (watcher) Name() string { return "watcher" }

func (w watcher) Handle(ctx context.Context, e eventstore.Event) error {
	_, err := w.pool.Exec(ctx, `INSERT INTO seen (instance, stream_id, stream_version, global_sequence) VALUES ($1, $2, $3, $4)`,
		w.instance, e.StreamID, e.StreamVersion, e.GlobalSequence)
	return err
}

// holders returns, for each subscriber in subs, the application_name (the
// child's instance ID) of the session holding each partition's lock ("" for
// none).
func holders(t *testing.T, db *annalstest.DB, subs []string, parts int) map[string][]string {
	t.Helper()
	var k1, k2 []int32
	for _, s := range subs {
		for p := range parts {
			a, b := advisorylock.Key(catchup.LockKey("", s, p))
			k1, k2 = append(k1, a), append(k2, b)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	rows, err := db.Pool.Query(ctx, `
		SELECT k.i, coalesce(a.application_name, '?')
		  FROM unnest($1::int4[], $2::int4[]) WITH ORDINALITY AS k(k1, k2, i)
		  JOIN pg_locks l ON l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
		   AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
		   AND l.classid = (k.k1::int8 & 4294967295)::oid AND l.objid = (k.k2::int8 & 4294967295)::oid
		  LEFT JOIN pg_stat_activity a ON a.pid = l.pid`, k1, k2)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, s := range subs {
		out[s] = make([]string, parts)
	}
	var i int64
	var app string
	if _, err := pgx.ForEachRow(rows, []any{&i, &app}, func() error {
		s, p := subs[(i-1)/int64(parts)], int((i-1)%int64(parts))
		if out[s][p] != "" {
			t.Fatalf("%s/%d is held by two sessions: %s and %s", s, p, out[s][p], app)
		}
		out[s][p] = app
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// shares counts the partitions each holder holds.
func shares(hs []string) map[string]int {
	m := map[string]int{}
	for _, h := range hs {
		m[h]++
	}
	return m
}

// balanced reports whether every partition of every subscriber is held by
// one of live, each holding ⌊P/N⌋ or ⌈P/N⌉.
func balanced(hs map[string][]string, live []string, parts int) bool {
	lo, hi := parts/len(live), (parts+len(live)-1)/len(live)
	for _, h := range hs {
		sh := shares(h)
		for who, n := range sh {
			if !slices.Contains(live, who) || n < lo || n > hi {
				return false
			}
		}
		if len(sh) != len(live) && lo > 0 {
			return false
		}
	}
	return true
}

// allLed reports whether every partition is held by one of live.
func allLed(hs map[string][]string, live []string) bool {
	for _, h := range hs {
		for _, who := range h {
			if !slices.Contains(live, who) {
				return false
			}
		}
	}
	return true
}

func describe(hs map[string][]string) string {
	var b strings.Builder
	keys := make([]string, 0, len(hs))
	for k := range hs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "%s: %v %v; ", k, shares(hs[k]), hs[k])
	}
	return b.String()
}

// waitBalanced waits until balanced(live) and returns how long it took.
func waitBalanced(t *testing.T, db *annalstest.DB, subs []string, parts int, live []string, timeout time.Duration) time.Duration {
	t.Helper()
	var hs map[string][]string
	d, ok := eventually(timeout, func() bool {
		hs = holders(t, db, subs, parts)
		return balanced(hs, live, parts)
	})
	if !ok {
		t.Fatalf("not balanced across %v after %v: %s", live, timeout, describe(hs))
	}
	return d
}

// TestBalancedLeadership: 3 processes × 12 partitions balance 4/4/4; a 4th
// joins: 3/3/3/3; one is SIGKILLed and one stops gracefully: the other two
// lead everything, 6/6. Events are appended throughout; at the end the
// counting projection equals the log exactly, every event was delivered to
// the observer, and every observer process saw each stream in order.
func TestBalancedLeadership(t *testing.T) {
	t.Parallel()
	const parts = 12
	subs := []string{"counter", "watcher"}
	b := setup(t)
	if _, err := b.db.Pool.Exec(t.Context(), balanceTables); err != nil {
		t.Fatal(err)
	}
	mode := childMode{Kind: kindBalanced, Partitions: parts, BatchSize: 50, Defaults: true}
	ctx, stopAppends := context.WithCancel(t.Context())
	defer stopAppends()
	appended := make(chan error, 1)
	go func() {
		tick := time.NewTicker(25 * time.Millisecond)
		defer tick.Stop()
		rng := rand.New(rand.NewPCG(1, 2))
		_, err := appendEvents(ctx, b.store, rng, 1<<30, tick.C)
		appended <- err
	}()
	start := func(id string) *childproc.Child { return startChild(t, b.db, id, mode) }
	registered := func(c *childproc.Child) time.Time {
		t.Helper()
		if _, ok := eventually(20*time.Second, func() bool {
			var n int
			_ = b.db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM annals.instances WHERE instance_id = $1`, c.ID).Scan(&n)
			return n == 1
		}); !ok {
			t.Fatalf("%s did not register within 20s; it is %s", c.ID, c.State())
		}
		return time.Now()
	}

	a, bb, c := start("a"), start("b"), start("c")
	for _, ch := range []*childproc.Child{a, bb, c} {
		registered(ch)
	}
	d := waitBalanced(t, b.db, subs, parts, []string{"a", "b", "c"}, 20*time.Second)
	t.Logf("3 instances: balanced 4/4/4 %v after the last registered", d)

	dd := start("d")
	joined := registered(dd)
	waitBalanced(t, b.db, subs, parts, []string{"a", "b", "c", "d"}, 10*time.Second)
	t.Logf("a 4th instance has its share (3/3/3/3) %v after it registered", time.Since(joined).Round(time.Millisecond))

	killed := time.Now()
	a.Kill()
	var hs map[string][]string
	if _, ok := eventually(5*time.Second, func() bool {
		hs = holders(t, b.db, subs, parts)
		return allLed(hs, []string{"b", "c", "d"})
	}); !ok {
		t.Fatalf("a's partitions are not led 5s after its SIGKILL: %s", describe(hs))
	}
	t.Logf("every partition led again %v after SIGKILL of a", time.Since(killed).Round(time.Millisecond))
	waitBalanced(t, b.db, subs, parts, []string{"b", "c", "d"}, 10*time.Second)
	t.Logf("balanced 4/4/4 %v after SIGKILL of a", time.Since(killed).Round(time.Millisecond))

	stopped := time.Now()
	bb.SIGTERM()
	if _, ok := eventually(10*time.Second, func() bool {
		hs = holders(t, b.db, subs, parts)
		return allLed(hs, []string{"c", "d"})
	}); !ok {
		t.Fatalf("b's partitions are not led 10s after its SIGTERM: %s", describe(hs))
	}
	t.Logf("every partition led by c and d %v after SIGTERM of b", time.Since(stopped).Round(time.Millisecond))
	waitBalanced(t, b.db, subs, parts, []string{"c", "d"}, 10*time.Second)
	bb.WaitStopped(10 * time.Second)

	stopAppends()
	if err := <-appended; err != nil && ctx.Err() == nil {
		t.Fatalf("append: %v", err)
	}
	// An append whose context ended may still commit (its group was sent):
	// the log's size is read with the rest, until they agree.
	var events, counted, seen int64
	if _, ok := eventually(60*time.Second, func() bool {
		_ = b.db.Pool.QueryRow(t.Context(), `SELECT (SELECT count(*) FROM annals.events), (SELECT count(DISTINCT event_id) FROM counted), (SELECT count(DISTINCT global_sequence) FROM seen)`).Scan(&events, &counted, &seen)
		return counted == events && seen == events
	}); !ok {
		var cps string
		_ = b.db.Pool.QueryRow(t.Context(), `SELECT string_agg(format('%s/%s@%s e%s %s', subscriber_id, partition, position, epoch, owner), ', ' ORDER BY subscriber_id, partition) FROM annals.checkpoints`).Scan(&cps)
		t.Fatalf("not caught up after 60s: %d events, %d counted, %d seen; holders %s; checkpoints %s",
			events, counted, seen, describe(holders(t, b.db, subs, parts)), cps)
	}
	var rows, distinct, sum int64
	if err := b.db.Pool.QueryRow(t.Context(), `SELECT (SELECT count(*) FROM counted), (SELECT count(DISTINCT event_id) FROM counted), (SELECT coalesce(sum(n), 0) FROM counts)`).Scan(&rows, &distinct, &sum); err != nil {
		t.Fatal(err)
	}
	if rows != events || distinct != events || sum != events {
		t.Fatalf("the log has %d events; the projection applied %d (%d distinct) and counts %d: not exactly once", events, rows, distinct, sum)
	}
	// Per-stream order in each observer process's output.
	r, err := b.db.Pool.Query(t.Context(), `SELECT instance, stream_id, stream_version FROM seen ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	last := map[[2]string]int64{}
	var inst, stream string
	var ver int64
	var deliveries int
	if _, err := pgx.ForEachRow(r, []any{&inst, &stream, &ver}, func() error {
		deliveries++
		k := [2]string{inst, stream}
		if ver <= last[k] {
			return fmt.Errorf("observer %s delivered %s v%d after v%d", inst, stream, ver, last[k])
		}
		last[k] = ver
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d events: applied exactly once; %d deliveries to the observer, each process in stream order", events, deliveries)
}
