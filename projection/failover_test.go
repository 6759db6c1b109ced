package projection_test

// Adversarial leader-election tests: runners in child processes (see
// child_test.go) compete for one subscriber; the tests kill the leader with
// SIGKILL, terminate its lock's session with pg_terminate_backend, stop it
// with SIGTERM, and check that exactly one instance leads at a time, that a
// standby takes over within seconds from the checkpoint, that transactional
// projections apply every event exactly once and observers deliver every
// event at least once.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/advisorylock"
	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/childproc"
)

// takeoverLimit is how soon a standby must lead after the leader is gone.
// The children retry the lock every 200 ms ± 50%; the rest is slack for a
// loaded 2-core machine running the race detector.
const takeoverLimit = 5 * time.Second

// fleet is a database with runner children competing for one subscriber.
type fleet struct {
	t        *testing.T
	b        *bundle
	mode     childMode
	sub      string
	k1, k2   int32 // the subscriber's advisory-lock key
	rng      *rand.Rand
	children []*childproc.Child // every child ever started, for the log checks

	// The highest checkpoint epoch and position seen: neither may go back.
	seenEpoch, seenPos int64
}

func newFleet(t *testing.T, mode childMode) *fleet {
	t.Helper()
	b := setup(t)
	if _, err := b.db.Pool.Exec(t.Context(), childTables); err != nil {
		t.Fatal(err)
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("random seed %d", seed)
	f := &fleet{t: t, b: b, mode: mode, sub: mode.subscriber(), rng: rand.New(rand.NewPCG(seed, seed>>1))}
	f.k1, f.k2 = advisorylock.Key(catchup.LockKey("", f.sub, 0))
	return f
}

func (f *fleet) start(instanceID string) *childproc.Child {
	f.t.Helper()
	c := startChild(f.t, f.b.db, instanceID, f.mode)
	f.children = append(f.children, c)
	return c
}

// ctx bounds one query: a test fails rather than hangs on a stuck database.
func (f *fleet) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(f.t.Context(), 10*time.Second)
}

func (f *fleet) queryInt(sql string, args ...any) int64 {
	f.t.Helper()
	ctx, cancel := f.ctx()
	defer cancel()
	var n int64
	if err := f.b.db.Pool.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
		f.t.Fatalf("%s: %v", strings.Join(strings.Fields(sql), " "), err)
	}
	return n
}

// cpState is the subscriber's checkpoint row.
type cpState struct {
	Exists          bool
	Position, Epoch int64
	Owner           string
}

func (c cpState) String() string {
	if !c.Exists {
		return "no checkpoint row"
	}
	return fmt.Sprintf("position %d, epoch %d, owner %q", c.Position, c.Epoch, c.Owner)
}

// checkpoint reads the checkpoint row, and fails the test if its epoch or
// position went back since the last read.
func (f *fleet) checkpoint() cpState {
	f.t.Helper()
	ctx, cancel := f.ctx()
	defer cancel()
	var c cpState
	var owner *string
	err := f.b.db.Pool.QueryRow(ctx, `SELECT position, epoch, owner FROM annals.checkpoints WHERE subscriber_id = $1 AND partition = 0`, f.sub).
		Scan(&c.Position, &c.Epoch, &owner)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return c
	case err != nil:
		f.t.Fatalf("read the checkpoint: %v", err)
	}
	c.Exists = true
	if owner != nil {
		c.Owner = *owner
	}
	if c.Epoch < f.seenEpoch || c.Position < f.seenPos {
		f.t.Fatalf("the checkpoint went back: now %s, seen epoch %d and position %d before", c, f.seenEpoch, f.seenPos)
	}
	f.seenEpoch, f.seenPos = c.Epoch, c.Position
	return c
}

// lockHolder is a session holding the subscriber's advisory lock.
type lockHolder struct {
	PID int32
	App string // application_name: the child's instance ID
}

// holder returns the session that holds the subscriber's lock, if any. It
// fails the test if more than one does (which PostgreSQL should make
// impossible).
func (f *fleet) holder() (lockHolder, bool) {
	f.t.Helper()
	ctx, cancel := f.ctx()
	defer cancel()
	rows, err := f.b.db.Pool.Query(ctx, `
		SELECT l.pid, coalesce(a.application_name, '')
		  FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
		 WHERE l.locktype = 'advisory' AND l.granted
		   AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
		   AND l.classid = ($1::int4::int8 & 4294967295)::oid
		   AND l.objid = ($2::int4::int8 & 4294967295)::oid
		   AND l.objsubid = 2`, f.k1, f.k2)
	if err != nil {
		f.t.Fatalf("read pg_locks: %v", err)
	}
	hs, err := pgx.CollectRows(rows, pgx.RowToStructByPos[lockHolder])
	if err != nil {
		f.t.Fatalf("read pg_locks: %v", err)
	}
	if len(hs) > 1 {
		f.t.Fatalf("%d sessions hold the lock of %q: %+v", len(hs), f.sub, hs)
	}
	if len(hs) == 0 {
		return lockHolder{}, false
	}
	return hs[0], true
}

// terminate ends a backend with pg_terminate_backend.
func (f *fleet) terminate(pid int32) {
	f.t.Helper()
	ctx, cancel := f.ctx()
	defer cancel()
	var ok bool
	if err := f.b.db.Pool.QueryRow(ctx, `SELECT pg_terminate_backend($1)`, pid).Scan(&ok); err != nil || !ok {
		f.t.Fatalf("pg_terminate_backend(%d) = %v, %v", pid, ok, err)
	}
}

func (f *fleet) head() int64 {
	f.t.Helper()
	return f.queryInt(`SELECT coalesce(max(global_sequence), 0) FROM annals.events`)
}

// instanceLead is an entry of annals.instances.leads.
type instanceLead struct {
	Subscriber string `json:"subscriber"`
	Partition  int    `json:"partition"`
	Epoch      int64  `json:"epoch"`
}

// leads returns what an instance leads according to annals.instances, and
// whether it is registered.
func (f *fleet) leads(instance string) ([]instanceLead, bool) {
	f.t.Helper()
	ctx, cancel := f.ctx()
	defer cancel()
	var raw []byte
	err := f.b.db.Pool.QueryRow(ctx, `SELECT leads FROM annals.instances WHERE instance_id = $1`, instance).Scan(&raw)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, false
	}
	if err != nil {
		f.t.Fatalf("read instance %s: %v", instance, err)
	}
	var out []instanceLead
	if err := json.Unmarshal(raw, &out); err != nil {
		f.t.Fatalf("instance %s: leads %s: %v", instance, raw, err)
	}
	return out, true
}

// leadsEpoch reports whether instance's registry entry says it leads the
// subscriber at epoch.
func (f *fleet) leadsEpoch(instance string, epoch int64) bool {
	ls, _ := f.leads(instance)
	return slices.ContainsFunc(ls, func(l instanceLead) bool { return l.Subscriber == f.sub && l.Epoch == epoch })
}

// waitLeader waits until c leads: the checkpoint names it and its session
// holds the lock.
func (f *fleet) waitLeader(c *childproc.Child, timeout time.Duration) cpState {
	f.t.Helper()
	var cp cpState
	var h lockHolder
	var held bool
	if _, ok := eventually(timeout, func() bool {
		cp = f.checkpoint()
		h, held = f.holder()
		return cp.Owner == c.ID && held && h.App == c.ID
	}); !ok {
		f.t.Fatalf("%s does not lead after %v: checkpoint %s; lock holder %+v (held %v); %s is %s",
			c.ID, timeout, cp, h, held, c.ID, c.State())
	}
	return cp
}

// waitRegistered waits until c's runner has registered its instance: it is
// up and competing for the lock.
func (f *fleet) waitRegistered(c *childproc.Child) {
	f.t.Helper()
	if _, ok := eventually(10*time.Second, func() bool { _, ok := f.leads(c.ID); return ok }); !ok {
		f.t.Fatalf("%s has not registered in annals.instances within 10s; it is %s", c.ID, c.State())
	}
}

// waitCaughtUp waits until the checkpoint is at the head and returns it.
func (f *fleet) waitCaughtUp(timeout time.Duration) cpState {
	f.t.Helper()
	var cp cpState
	var head int64
	if _, ok := eventually(timeout, func() bool {
		cp, head = f.checkpoint(), f.head()
		return cp.Position == head
	}); !ok {
		h, held := f.holder()
		f.t.Fatalf("%q did not catch up within %v: checkpoint %s, head %d; lock holder %+v (held %v)%s",
			f.sub, timeout, cp, head, h, held, f.doubleApplications())
	}
	return cp
}

// appendEvents appends n events in batches of up to 20 to random streams
// of 50 accounts; ctx ending stops it.
func appendEvents(ctx context.Context, store *eventstore.Store, rng *rand.Rand, n int, pace <-chan time.Time) (int, error) {
	done := 0
	for done < n {
		k := min(n-done, 1+rng.IntN(20))
		evs := make([]eventstore.EventData, k)
		for i := range evs {
			if amount := 1 + rng.IntN(1000); rng.IntN(3) == 0 {
				evs[i] = eventstore.NewEvent(Withdrawn{Amount: amount})
			} else {
				evs[i] = eventstore.NewEvent(Deposited{Amount: amount})
			}
		}
		if _, err := store.Append(ctx, fmt.Sprintf("acct-%d", rng.IntN(50)), eventstore.Any, evs...); err != nil {
			return done, err
		}
		done += k
		if pace != nil && done < n {
			select {
			case <-ctx.Done():
				return done, ctx.Err()
			case <-pace:
			}
		}
	}
	return done, nil
}

// appendEvents appends n events at once.
func (f *fleet) appendEvents(n int) {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(f.t.Context(), 30*time.Second)
	defer cancel()
	if _, err := appendEvents(ctx, f.b.store, f.rng, n, nil); err != nil {
		f.t.Fatalf("append: %v", err)
	}
}

// appliedBy counts the events instance applied.
func (f *fleet) appliedBy(instance string) int64 {
	f.t.Helper()
	return f.queryInt(`SELECT count(*) FROM applied WHERE instance = $1`, instance)
}

// checkBalances compares the balances read model with the model computed
// from the log.
func (f *fleet) checkBalances() {
	f.t.Helper()
	ctx, cancel := f.ctx()
	defer cancel()
	read := func(sql string) map[string][2]int64 {
		rows, err := f.b.db.Pool.Query(ctx, sql)
		if err != nil {
			f.t.Fatal(err)
		}
		m := map[string][2]int64{}
		var a string
		var amount, n int64
		if _, err := pgx.ForEachRow(rows, []any{&a, &amount, &n}, func() error { m[a] = [2]int64{amount, n}; return nil }); err != nil {
			f.t.Fatal(err)
		}
		return m
	}
	want := read(`
		SELECT stream_id,
		       sum(CASE event_type WHEN 'account.withdrawn' THEN -(data->>'amount')::bigint
		                           ELSE (data->>'amount')::bigint END),
		       count(*)
		  FROM annals.events GROUP BY stream_id`)
	got := read(`SELECT account, amount, events::bigint FROM balances`)
	var diffs []string
	for a, w := range want {
		if g, ok := got[a]; !ok || g != w {
			diffs = append(diffs, fmt.Sprintf("%s: read model (amount, events) %v (present %v), log says %v", a, g, ok, w))
		}
	}
	for a, g := range got {
		if _, ok := want[a]; !ok {
			diffs = append(diffs, fmt.Sprintf("%s: in the read model %v but not in the log", a, g))
		}
	}
	sort.Strings(diffs)
	if len(diffs) > 0 {
		f.t.Errorf("balances differ from the log in %d accounts:\n%s", len(diffs), strings.Join(diffs, "\n"))
	}
}

// checkExactlyOnce checks that every event of the log was applied exactly
// once, by one leader per epoch, in epoch order, and that the read model is
// the log's.
func (f *fleet) checkExactlyOnce(total int64) {
	f.t.Helper()
	if n := f.queryInt(`SELECT count(*) FROM annals.events`); n != total {
		f.t.Fatalf("the log holds %d events, want %d", n, total)
	}
	if n := f.queryInt(`SELECT count(*) FROM applied`); n != total {
		f.t.Errorf("applied holds %d rows for %d events", n, total)
	}
	if n := f.queryInt(`SELECT count(*) FROM annals.events e WHERE NOT EXISTS (SELECT 1 FROM applied a WHERE a.event_id = e.event_id)`); n != 0 {
		f.t.Errorf("%d events were never applied", n)
	}
	if n := f.queryInt(`SELECT count(*) FROM applied a WHERE NOT EXISTS (SELECT 1 FROM annals.events e WHERE e.event_id = a.event_id AND e.global_sequence = a.global_sequence)`); n != 0 {
		f.t.Errorf("%d applied rows match no event of the log", n)
	}
	// An epoch is one leadership: all its events come from one instance.
	if n := f.queryInt(`SELECT count(*) FROM (SELECT epoch FROM applied GROUP BY epoch HAVING count(DISTINCT instance) > 1) x`); n != 0 {
		f.t.Errorf("%d epochs have events applied by more than one instance", n)
	}
	// A fenced-off leader never commits after its successor: along the log,
	// the epoch that applied an event never goes back.
	ctx, cancel := f.ctx()
	defer cancel()
	var seq, epoch, prev int64
	err := f.b.db.Pool.QueryRow(ctx, `
		SELECT global_sequence, epoch, prev FROM (
		    SELECT global_sequence, epoch, lag(epoch) OVER (ORDER BY global_sequence) AS prev FROM applied) x
		 WHERE epoch < prev ORDER BY global_sequence LIMIT 1`).Scan(&seq, &epoch, &prev)
	if err == nil {
		f.t.Errorf("event %d was applied at epoch %d, after an earlier event at epoch %d", seq, epoch, prev)
	} else if !errors.Is(err, pgx.ErrNoRows) {
		f.t.Fatal(err)
	}
	f.checkBalances()
	f.checkNoDoubleApplication()
}

// checkNoDoubleApplication fails the test if a child's log shows that an
// event was applied a second time (refused by applied's primary key).
func (f *fleet) checkNoDoubleApplication() {
	f.t.Helper()
	if msg := f.doubleApplications(); msg != "" {
		f.t.Error(strings.TrimPrefix(msg, "; "))
	}
}

// doubleApplications returns, for a failure message, the first line of
// each child's log that shows an event applied a second time: the batch
// fails on applied's primary key and is retried forever, so the runner is
// stuck. "" if there is none.
func (f *fleet) doubleApplications() string {
	var b strings.Builder
	for _, c := range f.children {
		for line := range strings.Lines(c.Log()) {
			if strings.Contains(line, "applied_pkey") {
				i := strings.Index(line, "applied_pkey")
				fmt.Fprintf(&b, "; %s tried to apply an event a second time (refused by applied's primary key): ...%s",
					c.ID, strings.TrimSpace(line[max(0, i-400):min(len(line), i+100)]))
				break
			}
		}
	}
	return b.String()
}

// slot is one runner seat of a chaos run: a killed child is replaced by a
// new incarnation with a new instance ID.
type slot struct {
	name string
	gen  int
	c    *childproc.Child
}

func (s *slot) instance() string { return fmt.Sprintf("%s.%d", s.name, s.gen) }

// chaosPlan describes a chaos run.
type chaosPlan struct {
	Before  int // events appended before the runners start
	Total   int // events in all; the rest is appended while the leaders are killed
	Runners int
	Kills   int // alternately SIGKILL of the leader's process and pg_terminate_backend of its lock's session
}

// chaos runs plan: it starts the runners and a writer, kills the current
// leader plan.Kills times, each time after it has made some progress (a
// random amount), waits for a new leader after each kill, then waits for
// the writer and for the subscriber to catch up with the head. It returns
// the takeover times.
func (f *fleet) chaos(plan chaosPlan) []time.Duration {
	t := f.t
	t.Helper()
	f.appendEvents(plan.Before)

	slots := make([]*slot, plan.Runners)
	for i := range slots {
		slots[i] = &slot{name: fmt.Sprintf("r%d", i)}
		slots[i].c = f.start(slots[i].instance())
	}
	byInstance := func(id string) *slot {
		for _, s := range slots {
			if s.instance() == id {
				return s
			}
		}
		return nil
	}

	// The writer appends the rest in small batches, one every 10 ms, while
	// the leaders are killed.
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var written int
	var werr error
	writerDone := make(chan struct{})
	wg.Add(1)
	wrng := rand.New(rand.NewPCG(f.rng.Uint64(), f.rng.Uint64()))
	go func() {
		defer wg.Done()
		defer close(writerDone)
		pace := time.NewTicker(10 * time.Millisecond)
		defer pace.Stop()
		written, werr = appendEvents(ctx, f.b.store, wrng, plan.Total-plan.Before, pace.C)
	}()
	t.Cleanup(func() { cancel(); wg.Wait() }) // before the children are killed and the database dropped

	var takeovers []time.Duration
	var lastPos, lastEpoch int64
	var lastPID int32
	busy := 0 // kills of a leader with events to catch up on
	for k := range plan.Kills {
		// A live leader, leading at a new epoch, that has made progress: a
		// random number of events past where its predecessor was killed (or
		// is at the head).
		step := int64(1 + f.rng.IntN(400))
		var cp cpState
		var h lockHolder
		var held bool
		var leader *slot
		var head int64
		if _, ok := eventually(20*time.Second, func() bool {
			if msg := f.doubleApplications(); msg != "" {
				t.Fatalf("kill %d: an event was applied twice%s", k+1, msg)
			}
			cp = f.checkpoint()
			h, held = f.holder()
			head = f.head()
			leader = byInstance(cp.Owner)
			return cp.Epoch > lastEpoch && held && h.PID != lastPID && h.App == cp.Owner &&
				leader != nil && leader.c.Alive() &&
				(cp.Position >= lastPos+step || cp.Position == head)
		}); !ok {
			t.Fatalf("kill %d: no live leader made progress within 20s: checkpoint %s, head %d, lock holder %+v (held %v); last kill at position %d, epoch %d%s",
				k+1, cp, head, h, held, lastPos, lastEpoch, f.doubleApplications())
		}

		lastPos, lastEpoch, lastPID = cp.Position, cp.Epoch, h.PID
		killed, killedAt := leader.c.ID, cp.Position
		if cp.Position < head {
			busy++
		}
		// Progress shows right after a commit; a random pause of up to about
		// one batch's time lands the kill anywhere in the next batch.
		time.Sleep(time.Duration(f.rng.IntN(50)) * time.Millisecond)
		method := "SIGKILL"
		start := time.Now()
		if k%2 == 0 {
			leader.c.Kill()
			leader.gen++
			leader.c = f.start(leader.instance())
		} else {
			method = "pg_terminate_backend"
			f.terminate(h.PID)
		}
		var now cpState
		var nh lockHolder
		var nheld bool
		if _, ok := eventually(takeoverLimit, func() bool {
			now = f.checkpoint()
			nh, nheld = f.holder()
			return now.Epoch > lastEpoch && nheld && nh.PID != lastPID && nh.App == now.Owner
		}); !ok {
			t.Fatalf("kill %d (%s of leader %s, epoch %d, position %d): no new leader within %v; checkpoint %s, lock holder %+v (held %v)",
				k+1, method, killed, lastEpoch, lastPos, takeoverLimit, now, nh, nheld)
		}
		d := time.Since(start)
		takeovers = append(takeovers, d)
		// The next kill waits for progress beyond where the new leadership
		// was first seen, so that every leadership commits something.
		lastPos = now.Position
		t.Logf("kill %2d: %-20s of %s at position %5d (head %5d): %s took over (epoch %d) after %v",
			k+1, method, killed, killedAt, head, now.Owner, now.Epoch, d.Round(time.Millisecond))
	}

	select {
	case <-writerDone:
	case <-time.After(60 * time.Second):
		t.Fatalf("the writer has not finished within 60s after the kills")
	}
	if werr != nil {
		t.Fatalf("the writer failed after %d of %d events: %v", written, plan.Total-plan.Before, werr)
	}
	cp := f.waitCaughtUp(30 * time.Second)
	t.Logf("caught up at %d after %d kills (%d of a leader with events to catch up on); takeovers: %s",
		cp.Position, plan.Kills, busy, summarize(takeovers))
	return takeovers
}

// summarize returns the min, median and max of ds.
func summarize(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	r := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
	return fmt.Sprintf("min %v, median %v, max %v", r(s[0]), r(s[len(s)/2]), r(s[len(s)-1]))
}

func TestLeaderElection(t *testing.T) {
	t.Parallel()

	// setup starts two runners of the balances projection: a, which leads,
	// and b, a standby that is up and competing for the lock.
	setup := func(t *testing.T) (*fleet, *childproc.Child, *childproc.Child) {
		t.Helper()
		f := newFleet(t, childMode{Kind: kindProjection, BatchSize: 100})
		a := f.start("a")
		f.waitLeader(a, 15*time.Second)
		b := f.start("b")
		f.waitRegistered(b)
		return f, a, b
	}

	t.Run("OneLeaderAmongTwo", func(t *testing.T) {
		t.Parallel()
		f, a, b := setup(t)
		for round := 1; round <= 3; round++ {
			f.appendEvents(200)
			cp := f.waitCaughtUp(15 * time.Second)
			if cp.Owner != a.ID {
				t.Fatalf("round %d: the checkpoint's owner is %q, want the leader %s", round, cp.Owner, a.ID)
			}
			if h, held := f.holder(); !held || h.App != a.ID {
				t.Fatalf("round %d: lock holder %+v (held %v), want a session of %s", round, h, held, a.ID)
			}
			if n := f.appliedBy(b.ID); n != 0 {
				t.Fatalf("round %d: the standby %s applied %d events while %s leads", round, b.ID, n, a.ID)
			}
			if n := f.appliedBy(a.ID); n != cp.Position {
				t.Fatalf("round %d: the leader %s applied %d events, want %d", round, a.ID, n, cp.Position)
			}
		}
		// The registry agrees: a leads at the current epoch, b leads nothing.
		cp := f.checkpoint()
		if _, ok := eventually(5*time.Second, func() bool { return f.leadsEpoch(a.ID, cp.Epoch) }); !ok {
			ls, _ := f.leads(a.ID)
			t.Fatalf("annals.instances: %s leads %+v, want %q at epoch %d", a.ID, ls, f.sub, cp.Epoch)
		}
		if ls, ok := f.leads(b.ID); !ok || len(ls) != 0 {
			t.Fatalf("annals.instances: the standby %s leads %+v (registered %v), want nothing", b.ID, ls, ok)
		}
		if cp.Epoch != 1 {
			t.Fatalf("epoch %d: the leadership changed hands while the leader lived", cp.Epoch)
		}
		f.checkExactlyOnce(f.head())
	})

	// takeover appends events after the leader is gone and measures when
	// the new leadership is claimed, when the new leader applies its first
	// event, and when it has caught up.
	takeover := func(t *testing.T, f *fleet, before cpState, gone time.Time, what string, newLeader func(cpState) bool) cpState {
		t.Helper()
		f.appendEvents(50)
		var cp cpState
		_, ok := eventually(takeoverLimit, func() bool { cp = f.checkpoint(); return cp.Epoch > before.Epoch && newLeader(cp) })
		claimed := time.Since(gone)
		if !ok {
			h, held := f.holder()
			t.Fatalf("%s: no standby took over within %v; the checkpoint is still %s (before: %s); lock holder %+v (held %v)",
				what, takeoverLimit, cp, before, h, held)
		}
		// The events of the new leadership are those applied at a later epoch.
		newer := func() int64 { return f.queryInt(`SELECT count(*) FROM applied WHERE epoch > $1`, before.Epoch) }
		if _, ok := eventually(takeoverLimit, func() bool { return newer() > 0 }); !ok {
			t.Fatalf("%s: the new leader %s (claimed epoch %d) applied nothing within %v of its claim", what, cp.Owner, cp.Epoch, takeoverLimit)
		}
		first := time.Since(gone)
		after := f.waitCaughtUp(15 * time.Second)
		t.Logf("%s: %s claimed epoch %d after %v, applied its first event after %v, caught up after %v (limit %v)",
			what, cp.Owner, cp.Epoch, claimed.Round(time.Millisecond), first.Round(time.Millisecond),
			time.Since(gone).Round(time.Millisecond), takeoverLimit)
		if first > takeoverLimit {
			t.Errorf("%s: takeover took %v, more than %v", what, first, takeoverLimit)
		}
		// It went on from the checkpoint: the new leadership applied exactly
		// the events after it, and the old one nothing after it.
		if n := f.queryInt(`SELECT count(*) FROM applied WHERE epoch > $1 AND global_sequence <= $2`, before.Epoch, before.Position); n != 0 {
			t.Errorf("%s: the new leadership applied %d events at or before the checkpoint %d it took over", what, n, before.Position)
		}
		if n := f.queryInt(`SELECT count(*) FROM applied WHERE epoch <= $1 AND global_sequence > $2`, before.Epoch, before.Position); n != 0 {
			t.Errorf("%s: the old leadership (epoch %d) applied %d events after it was gone", what, before.Epoch, n)
		}
		if n := newer(); n != after.Position-before.Position {
			t.Errorf("%s: the new leadership applied %d events, want the %d after the checkpoint", what, n, after.Position-before.Position)
		}
		f.checkExactlyOnce(after.Position)
		return cp
	}

	t.Run("KillLeaderProcess", func(t *testing.T) {
		t.Parallel()
		f, a, b := setup(t)
		f.appendEvents(300)
		before := f.waitCaughtUp(15 * time.Second)
		gone := time.Now()
		a.Kill()
		takeover(t, f, before, gone, "SIGKILL of the leader", func(cp cpState) bool { return cp.Owner == b.ID })
	})

	t.Run("TerminateLockSession", func(t *testing.T) {
		t.Parallel()
		f, a, _ := setup(t)
		f.appendEvents(300)
		before := f.waitCaughtUp(15 * time.Second)
		h, held := f.holder()
		if !held || h.App != a.ID {
			t.Fatalf("lock holder %+v (held %v), want a session of %s", h, held, a.ID)
		}
		gone := time.Now()
		f.terminate(h.PID)
		// Either runner may lead next (the old leader stands by again at
		// once, from a new session), but from a new session at a new epoch.
		cp := takeover(t, f, before, gone, "pg_terminate_backend of the leader's lock session", func(cp cpState) bool {
			nh, ok := f.holder()
			return ok && nh.PID != h.PID && nh.App == cp.Owner
		})
		if !a.Alive() {
			t.Fatalf("%s exited after losing its lock's session (%s); a runner must go back to standby", a.ID, a.State())
		}
		// The old leader noticed: its registry entry no longer claims the old epoch.
		if _, ok := eventually(5*time.Second, func() bool { return !f.leadsEpoch(a.ID, before.Epoch) }); !ok {
			ls, _ := f.leads(a.ID)
			t.Errorf("%s still claims epoch %d in annals.instances 5s after losing its lock: %+v (new leader %s at epoch %d)",
				a.ID, before.Epoch, ls, cp.Owner, cp.Epoch)
		}
	})

	t.Run("GracefulHandover", func(t *testing.T) {
		t.Parallel()
		f, a, b := setup(t)
		f.appendEvents(300)
		before := f.waitCaughtUp(15 * time.Second)
		gone := time.Now()
		// The events come after the old leader has exited: until then it may
		// legitimately finish the batch in hand.
		a.Term(15 * time.Second)
		t.Logf("SIGTERM: %s exited after %v", a.ID, time.Since(gone).Round(time.Millisecond))
		if _, ok := f.leads(a.ID); ok {
			t.Errorf("%s is still registered in annals.instances after a graceful stop", a.ID)
		}
		takeover(t, f, before, gone, "SIGTERM of the leader", func(cp cpState) bool { return cp.Owner == b.ID })
	})
}

// TestExactlyOnceAcrossLeaderKills appends 10,000 events, most of them
// while three runners of a transactional projection compete and the leader
// is killed 20 times (SIGKILL of the process or pg_terminate_backend of the
// lock's session, alternately); every event must be applied exactly once.
func TestExactlyOnceAcrossLeaderKills(t *testing.T) {
	t.Parallel()
	f := newFleet(t, childMode{Kind: kindProjection, BatchSize: 100})
	const total = 10000
	start := time.Now()
	takeovers := f.chaos(chaosPlan{Before: 2000, Total: total, Runners: 3, Kills: 20})
	for i, d := range takeovers {
		if d > takeoverLimit {
			t.Errorf("takeover %d took %v, more than %v", i+1, d, takeoverLimit)
		}
	}
	f.checkExactlyOnce(total)
	epochs := f.queryInt(`SELECT count(DISTINCT epoch) FROM applied`)
	instances := f.queryInt(`SELECT count(DISTINCT instance) FROM applied`)
	t.Logf("%d events applied exactly once by %d instances in %d epochs; %v in all", total, instances, epochs, time.Since(start).Round(time.Millisecond))
}

func TestObserverAtLeastOnce(t *testing.T) {
	t.Parallel()

	// The leader is killed 12 times while 4,000 events are appended; every
	// event must be delivered at least once.
	t.Run("AcrossLeaderKills", func(t *testing.T) {
		t.Parallel()
		f := newFleet(t, childMode{Kind: kindObserver, BatchSize: 100, CheckpointEvery: 50, CheckpointInterval: 200 * time.Millisecond})
		const total = 4000
		f.chaos(chaosPlan{Before: 1000, Total: total, Runners: 2, Kills: 12})
		if n := f.queryInt(`SELECT count(*) FROM annals.events e WHERE NOT EXISTS (SELECT 1 FROM delivered d WHERE d.event_id = e.event_id)`); n != 0 {
			t.Errorf("%d of %d events were never delivered", n, total)
		}
		if n := f.queryInt(`SELECT count(*) FROM delivered d WHERE NOT EXISTS (SELECT 1 FROM annals.events e WHERE e.event_id = d.event_id AND e.global_sequence = d.global_sequence)`); n != 0 {
			t.Errorf("%d deliveries match no event of the log", n)
		}
		distinct := f.queryInt(`SELECT count(DISTINCT event_id) FROM delivered`)
		all := f.queryInt(`SELECT count(*) FROM delivered`)
		if distinct != total {
			t.Errorf("%d distinct events delivered, want %d", distinct, total)
		}
		t.Logf("%d deliveries of %d events: %d redeliveries", all, distinct, all-distinct)
	})

	// An observer that checkpoints rarely (every 1,000,000 events or hour)
	// is stopped with SIGTERM in the middle of catching up: the graceful
	// stop flushes its checkpoint at the last event it handled, so its
	// successor delivers nothing a second time.
	t.Run("GracefulStopFlushesCheckpoint", func(t *testing.T) {
		t.Parallel()
		f := newFleet(t, childMode{Kind: kindObserver, BatchSize: 50, CheckpointEvery: 1_000_000, CheckpointInterval: time.Hour, HandleDelay: 2 * time.Millisecond})
		const total = 1500
		f.appendEvents(total)
		first := f.start("obs-1")
		var n int64
		if _, ok := eventually(30*time.Second, func() bool {
			n = f.queryInt(`SELECT count(*) FROM delivered`)
			return n >= 200
		}); !ok {
			t.Fatalf("%s delivered %d events within 30s, want at least 200; it is %s", first.ID, n, first.State())
		}
		if cp := f.checkpoint(); cp.Position != 0 {
			t.Fatalf("the checkpoint is at %d before the stop; the test needs it unflushed (CheckpointEvery and CheckpointInterval are huge)", cp.Position)
		}
		first.Term(15 * time.Second)

		cp := f.checkpoint()
		last := f.queryInt(`SELECT coalesce(max(global_sequence), 0) FROM delivered`)
		delivered := f.queryInt(`SELECT count(*) FROM delivered`)
		t.Logf("SIGTERM after %d deliveries: stopped with %d delivered, checkpoint %s", n, delivered, cp)
		if cp.Position >= total {
			t.Fatalf("%s delivered all %d events before the stop: the test did not stop it mid-way", first.ID, total)
		}
		if cp.Position != last {
			t.Fatalf("after a graceful stop the checkpoint is at %d, want %d, the last event delivered", cp.Position, last)
		}
		if d := f.queryInt(`SELECT count(DISTINCT event_id) FROM delivered`); d != delivered || d != last {
			t.Fatalf("before the restart: %d deliveries of %d distinct events, want one of each of the first %d", delivered, d, last)
		}

		// The successor delivers the rest. With these settings it writes its
		// checkpoint only when it stops, so wait for the deliveries, then
		// stop it too: the checkpoint must end at the head.
		second := f.start("obs-2")
		var distinct int64
		if _, ok := eventually(30*time.Second, func() bool {
			distinct = f.queryInt(`SELECT count(DISTINCT event_id) FROM delivered`)
			return distinct == total
		}); !ok {
			t.Fatalf("%s did not deliver the rest within 30s: %d of %d events delivered; checkpoint %s; %s is %s",
				second.ID, distinct, total, f.checkpoint(), second.ID, second.State())
		}
		second.Term(15 * time.Second)
		if end, head := f.checkpoint(), f.head(); end.Position != head {
			t.Fatalf("after the second graceful stop the checkpoint is %s, want the head %d", end, head)
		}
		if all := f.queryInt(`SELECT count(*) FROM delivered`); all != total {
			t.Fatalf("%d deliveries of %d events: %d re-delivered after a graceful stop", all, total, all-total)
		}
		if n := f.queryInt(`SELECT count(*) FROM delivered WHERE instance = $1 AND global_sequence <= $2`, second.ID, cp.Position); n != 0 {
			t.Fatalf("%s re-delivered %d events at or before the flushed checkpoint %d", second.ID, n, cp.Position)
		}
	})
}
