package saga_test

// Exactly-once through crashes: runners of the counter saga in child
// processes (commanding the Tally aggregate through saga.Create and
// saga.Update as well); a writer appends correlated events from several streams per
// instance while the test kills the leader again and again (SIGKILL of its
// process, pg_terminate_backend of its lock's session). Afterwards every
// instance's state, every effect event and every pending timer must equal
// a model computed in Go from the input events, and so must every Tally
// aggregate's events (the aggregate refuses an addition out of sequence,
// so a doubled command would fail rather than be stored).

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/advisorylock"
	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/childproc"
	"github.com/annals-dev/annals/saga"
)

// modelInstance is what the counter saga must have made of one instance.
type modelInstance struct {
	state     counterState
	version   int64
	completed bool
	effects   []string // "seq:n:causation" in stream order
	tally     []string // the Tally aggregate's events, "seq:n:causation"
}

// model replays the input events (in log order) as the saga must.
func model(t *testing.T, b *bundle) map[string]*modelInstance {
	t.Helper()
	rows, err := b.db.Pool.Query(t.Context(), `SELECT event_id, stream_id, stream_version, event_type, data
		  FROM annals.events WHERE event_type IN ('test.added', 'test.closed') ORDER BY global_sequence`)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]*modelInstance{}
	var e eventstore.Event
	var raw []byte
	_, err = pgx.ForEachRow(rows, []any{&e.ID, &e.StreamID, &e.StreamVersion, &e.Type, &raw}, func() error {
		var d Added // Closed has the same id field
		if err := json.Unmarshal(raw, &d); err != nil {
			return err
		}
		inst := m[d.ID]
		if inst == nil {
			inst = &modelInstance{}
			m[d.ID] = inst
		}
		if inst.completed {
			return nil
		}
		inst.version++
		if e.Type == "test.closed" {
			inst.completed = true
			return nil
		}
		inst.state.Sum += d.N
		inst.state.Seen = append(inst.state.Seen, fmt.Sprintf("%s@%d", e.StreamID, e.StreamVersion))
		inst.state.Effects++
		inst.effects = append(inst.effects, fmt.Sprintf("%d:%d:%s", inst.version, d.N, e.ID))
		inst.tally = append(inst.tally, fmt.Sprintf("%d:%d:%s", len(inst.tally)+1, d.N, e.ID))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// compareWithModel checks saga_states, the effect streams and the pending
// timers against the model; with tally, the Tally aggregates the saga
// commanded too.
func compareWithModel(t *testing.T, b *bundle, withTimers, tally bool) {
	t.Helper()
	ctx := t.Context()
	want := model(t, b)
	var diffs []string

	rows, err := b.db.Pool.Query(ctx, `SELECT correlation_id, state, version, completed FROM annals.saga_states WHERE saga = $1`, counterName)
	if err != nil {
		t.Fatal(err)
	}
	var id string
	var raw []byte
	var version int64
	var completed bool
	got := map[string]bool{}
	_, err = pgx.ForEachRow(rows, []any{&id, &raw, &version, &completed}, func() error {
		got[id] = true
		var st counterState
		if err := json.Unmarshal(raw, &st); err != nil {
			return err
		}
		w := want[id]
		if w == nil {
			diffs = append(diffs, fmt.Sprintf("%s: stored but not in the model", id))
			return nil
		}
		st.Timer = w.state.Timer // not modelled: timer IDs are random
		if version != w.version || completed != w.completed || st.Sum != w.state.Sum || st.Effects != w.state.Effects || !slices.Equal(st.Seen, w.state.Seen) {
			diffs = append(diffs, fmt.Sprintf("%s: stored version %d completed %v sum %d effects %d seen %d; model version %d completed %v sum %d effects %d seen %d",
				id, version, completed, st.Sum, st.Effects, len(st.Seen), w.version, w.completed, w.state.Sum, w.state.Effects, len(w.state.Seen)))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for id := range want {
		if !got[id] {
			diffs = append(diffs, fmt.Sprintf("%s: in the model but not stored", id))
		}
	}

	effects := map[string][]string{}
	rows, err = b.db.Pool.Query(ctx, `SELECT data, coalesce(metadata->>'causation_id', '') FROM annals.events
		 WHERE event_type = 'test.effect' ORDER BY stream_id, stream_version`)
	if err != nil {
		t.Fatal(err)
	}
	var cause string
	_, err = pgx.ForEachRow(rows, []any{&raw, &cause}, func() error {
		var ef Effect
		if err := json.Unmarshal(raw, &ef); err != nil {
			return err
		}
		effects[ef.ID] = append(effects[ef.ID], fmt.Sprintf("%d:%d:%s", ef.Seq, ef.N, cause))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	nEffects := 0
	for id, w := range want {
		nEffects += len(w.effects)
		if g := effects[id]; !slices.Equal(g, w.effects) {
			diffs = append(diffs, fmt.Sprintf("%s: %d effect events, model %d; first difference: %s", id, len(g), len(w.effects), firstDiff(g, w.effects)))
		}
	}
	for id := range effects {
		if want[id] == nil {
			diffs = append(diffs, fmt.Sprintf("%s: effects of an instance not in the model", id))
		}
	}

	if tally {
		// The Tally aggregate of each instance: loaded through its
		// repository, and its events one for one with the model.
		tallied := map[string][]string{}
		rows, err = b.db.Pool.Query(ctx, `SELECT stream_id, data, coalesce(metadata->>'causation_id', '') FROM annals.events
			 WHERE event_type = 'test.tallied' ORDER BY stream_id, stream_version`)
		if err != nil {
			t.Fatal(err)
		}
		var stream string
		_, err = pgx.ForEachRow(rows, []any{&stream, &raw, &cause}, func() error {
			var tl Tallied
			if err := json.Unmarshal(raw, &tl); err != nil {
				return err
			}
			id := strings.TrimPrefix(stream, "tally-")
			tallied[id] = append(tallied[id], fmt.Sprintf("%d:%d:%s", tl.Seq, tl.N, cause))
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		repo := tallies(t, b.store)
		for id, w := range want {
			if g := tallied[id]; !slices.Equal(g, w.tally) {
				diffs = append(diffs, fmt.Sprintf("%s: %d tally events, model %d; first difference: %s", id, len(g), len(w.tally), firstDiff(g, w.tally)))
			}
			if len(w.tally) == 0 {
				continue
			}
			agg, err := repo.Load(ctx, id)
			if err != nil {
				diffs = append(diffs, fmt.Sprintf("%s: load tally: %v", id, err))
			} else if agg.Count != int64(len(w.tally)) || agg.Count != w.state.Effects || agg.Sum != w.state.Sum {
				diffs = append(diffs, fmt.Sprintf("%s: tally count %d sum %d; model %d and %d", id, agg.Count, agg.Sum, len(w.tally), w.state.Sum))
			}
		}
		for id := range tallied {
			if want[id] == nil {
				diffs = append(diffs, fmt.Sprintf("%s: tally of an instance not in the model", id))
			}
		}
	}

	if withTimers {
		// One pending timer per open instance, none for a completed one, and
		// none fired (they are due in an hour).
		pending := map[string]int{}
		rows, err = b.db.Pool.Query(ctx, `SELECT coalesce(owner, '') FROM annals.timers`)
		if err != nil {
			t.Fatal(err)
		}
		var owner string
		if _, err = pgx.ForEachRow(rows, []any{&owner}, func() error { pending[owner]++; return nil }); err != nil {
			t.Fatal(err)
		}
		for id, w := range want {
			n := pending[saga.Owner(counterName, id)]
			if (w.completed && n != 0) || (!w.completed && n != 1) {
				diffs = append(diffs, fmt.Sprintf("%s (completed %v): %d pending timers", id, w.completed, n))
			}
		}
		if n := b.count(t, `SELECT count(*) FROM annals.events WHERE event_type = 'test.deadline'`); n != 0 {
			diffs = append(diffs, fmt.Sprintf("%d deadline events fired, want none", n))
		}
	}
	sort.Strings(diffs)
	if len(diffs) > 0 {
		t.Fatalf("%d differences from the model:\n%s", len(diffs), strings.Join(diffs, "\n"))
	}
	t.Logf("state of %d instances and %d effect events equal the model", len(want), nEffects)
}

func firstDiff(a, b []string) string {
	for i := range max(len(a), len(b)) {
		var x, y string
		if i < len(a) {
			x = a[i]
		}
		if i < len(b) {
			y = b[i]
		}
		if x != y {
			return fmt.Sprintf("at %d: stored %q, model %q", i, x, y)
		}
	}
	return "none"
}

// writeWorkload appends n correlated events to instances o-0..o-(ids-1),
// each instance's events spread over three streams, in appends of 1-4
// events; about 1 in 60 events closes its instance.
func writeWorkload(ctx context.Context, store *eventstore.Store, rng *rand.Rand, ids, n int, pace <-chan time.Time) error {
	for done := 0; done < n; {
		id := fmt.Sprintf("o-%d", rng.IntN(ids))
		stream := fmt.Sprintf("in-%s-%d", id, rng.IntN(3))
		k := min(n-done, 1+rng.IntN(4))
		evs := make([]eventstore.EventData, k)
		for i := range evs {
			if rng.IntN(60) == 0 {
				evs[i] = eventstore.NewEvent(Closed{ID: id})
			} else {
				evs[i] = eventstore.NewEvent(Added{ID: id, N: 1 + rng.IntN(100)})
			}
		}
		if _, err := store.Append(ctx, stream, eventstore.Any, evs...); err != nil {
			return err
		}
		done += k
		if pace != nil {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-pace:
			}
		}
	}
	return nil
}

func TestExactlyOnceThroughLeaderKills(t *testing.T) {
	t.Parallel()
	const (
		runners = 3
		kills   = 10
		ids     = 40
		before  = 300
		during  = 1500
	)
	b := setup(t)
	seed := uint64(time.Now().UnixNano())
	t.Logf("random seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, seed>>1))
	k1, k2 := advisorylock.Key(catchup.LockKey("", counterName, 0))
	ctx := t.Context()
	queryCtx := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, 10*time.Second) }

	type cp struct {
		pos, epoch int64
		owner      string
	}
	checkpoint := func() cp {
		t.Helper()
		c, cancel := queryCtx()
		defer cancel()
		var r cp
		var owner *string
		err := b.db.Pool.QueryRow(c, `SELECT position, epoch, owner FROM annals.checkpoints WHERE subscriber_id = $1 AND partition = 0`, counterName).
			Scan(&r.pos, &r.epoch, &owner)
		if err != nil && err != pgx.ErrNoRows {
			t.Fatal(err)
		}
		if owner != nil {
			r.owner = *owner
		}
		return r
	}
	// holder returns the backend PID and application name of the lock's session.
	holder := func() (int32, string, bool) {
		t.Helper()
		c, cancel := queryCtx()
		defer cancel()
		var pid int32
		var app string
		err := b.db.Pool.QueryRow(c, `
			SELECT l.pid, coalesce(a.application_name, '')
			  FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
			 WHERE l.locktype = 'advisory' AND l.granted
			   AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
			   AND l.classid = ($1::int4::int8 & 4294967295)::oid
			   AND l.objid = ($2::int4::int8 & 4294967295)::oid
			   AND l.objsubid = 2`, k1, k2).Scan(&pid, &app)
		if err == pgx.ErrNoRows {
			return 0, "", false
		}
		if err != nil {
			t.Fatal(err)
		}
		return pid, app, true
	}
	lastInput := func() int64 {
		return int64(b.count(t, `SELECT coalesce(max(global_sequence), 0) FROM annals.events WHERE event_type IN ('test.added', 'test.closed')`))
	}

	if err := writeWorkload(ctx, b.store, rng, ids, before, nil); err != nil {
		t.Fatal(err)
	}
	const timerAfter = time.Hour
	type slot struct {
		name string
		gen  int
		c    *childproc.Child
	}
	instance := func(s *slot) string { return fmt.Sprintf("%s.%d", s.name, s.gen) }
	slots := make([]*slot, runners)
	for i := range slots {
		slots[i] = &slot{name: fmt.Sprintf("r%d", i)}
		slots[i].c = startTallyChild(t, b.db, instance(slots[i]), timerAfter, true)
	}
	byInstance := func(id string) *slot {
		for _, s := range slots {
			if instance(s) == id {
				return s
			}
		}
		return nil
	}

	wctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var werr error
	writerDone := make(chan struct{})
	wrng := rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64()))
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(writerDone)
		pace := time.NewTicker(10 * time.Millisecond)
		defer pace.Stop()
		werr = writeWorkload(wctx, b.store, wrng, ids, during, pace.C)
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })

	var lastPos, lastEpoch int64
	var lastPID int32
	var takeovers []time.Duration
	for k := range kills {
		// A live leader at a new epoch that has committed some progress.
		step := int64(1 + rng.IntN(150))
		var c cp
		var pid int32
		var app string
		var held bool
		var leader *slot
		if !eventually(20*time.Second, func() bool {
			c = checkpoint()
			pid, app, held = holder()
			leader = byInstance(c.owner)
			return c.epoch > lastEpoch && held && pid != lastPID && app == c.owner && leader != nil && leader.c.Alive() &&
				(c.pos >= lastPos+step || c.pos >= lastInput())
		}) {
			dumpStall(t, b, c.pos)
			t.Fatalf("kill %d: no live leader made progress within 20s: checkpoint %+v, lock holder %d %q (held %v)", k+1, c, pid, app, held)
		}
		lastPos, lastEpoch, lastPID = c.pos, c.epoch, pid
		// Land the kill anywhere in the next batch.
		time.Sleep(time.Duration(rng.IntN(40)) * time.Millisecond)
		method := "SIGKILL"
		start := time.Now()
		if k%2 == 0 {
			leader.c.Kill()
			leader.gen++
			leader.c = startTallyChild(t, b.db, instance(leader), timerAfter, true)
		} else {
			method = "pg_terminate_backend"
			qc, qcancel := queryCtx()
			if _, err := b.db.Pool.Exec(qc, `SELECT pg_terminate_backend($1)`, pid); err != nil {
				t.Fatal(err)
			}
			qcancel()
		}
		var now cp
		if !eventually(10*time.Second, func() bool {
			now = checkpoint()
			npid, napp, nheld := holder()
			return now.epoch > lastEpoch && nheld && npid != lastPID && napp == now.owner
		}) {
			t.Fatalf("kill %d (%s of %s): no new leader within 10s; checkpoint %+v", k+1, method, c.owner, now)
		}
		d := time.Since(start)
		takeovers = append(takeovers, d)
		lastPos = now.pos
		t.Logf("kill %2d: %-20s of %s at position %5d: %s took over (epoch %d) after %v",
			k+1, method, c.owner, c.pos, now.owner, now.epoch, d.Round(time.Millisecond))
	}
	select {
	case <-writerDone:
	case <-time.After(60 * time.Second):
		t.Fatal("the writer has not finished within 60s after the kills")
	}
	if werr != nil {
		t.Fatal(werr)
	}
	// The last leader catches up with the input. On a loaded machine (the
	// whole suite shares one cluster, and every notifying commit of the
	// cluster, annals' appends among them, takes PostgreSQL's one NOTIFY
	// lock through its WAL flush) that can take longer than the test's
	// usual few seconds, so a stall is judged by progress: the checkpoint
	// must move at least every 30s, and reach the input within 3 minutes.
	last := lastInput()
	from, started := checkpoint().pos, time.Now()
	if err := progresses(30*time.Second, 3*time.Minute, func() (int64, bool) {
		pos := checkpoint().pos
		return pos, pos >= last
	}); err != nil {
		pid, app, held := holder()
		t.Logf("lock holder %d %q (held %v)", pid, app, held)
		dumpStall(t, b, checkpoint().pos)
		if s := byInstance(checkpoint().owner); s != nil {
			quit(t, s.c)
		}
		t.Fatalf("the saga did not catch up with position %d: %v; checkpoint %+v", last, err, checkpoint())
	}
	t.Logf("the last leader caught up from %d to %d in %v", from, last, time.Since(started).Round(time.Millisecond))
	if n := b.count(t, `SELECT count(*) FROM annals.dead_letters`); n != 0 {
		t.Fatalf("%d dead letters", n)
	}
	slices.Sort(takeovers)
	t.Logf("%d kills; takeover min %v, median %v, max %v", kills, takeovers[0].Round(time.Millisecond),
		takeovers[len(takeovers)/2].Round(time.Millisecond), takeovers[len(takeovers)-1].Round(time.Millisecond))
	compareWithModel(t, b, true, true)
}

// dumpStall logs what the database shows when the saga stops short of the
// log's end: every session's activity, every lock not granted, and the
// events after the checkpoint, so a stall can be told from a lost wake-up.
func dumpStall(t *testing.T, b *bundle, from int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dump := func(title, sql string, args ...any) {
		rows, err := b.db.Pool.Query(ctx, sql, args...)
		if err != nil {
			t.Logf("%s: %v", title, err)
			return
		}
		defer rows.Close()
		var lines []string
		for rows.Next() {
			vals, err := rows.Values()
			if err != nil {
				t.Logf("%s: %v", title, err)
				return
			}
			lines = append(lines, fmt.Sprint(vals...))
		}
		t.Logf("%s (%d rows):\n%s", title, len(lines), strings.Join(lines, "\n"))
	}
	dump("sessions", `SELECT pid, ' ', coalesce(application_name, ''), ' ', coalesce(state, ''), ' ', coalesce(wait_event_type, ''), '/', coalesce(wait_event, ''),
		' xact ', coalesce(now() - xact_start, '0'::interval)::text, ' ', left(coalesce(query, ''), 200)
		  FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() ORDER BY pid`)
	dump("locks not granted", `SELECT pid, ' ', locktype, ' ', coalesce(relation::regclass::text, ''), ' ', coalesce(classid::text, ''), '/', coalesce(objid::text, ''), '/', coalesce(objsubid::text, ''), ' ', mode
		  FROM pg_locks WHERE NOT granted`)
	dump("advisory locks", `SELECT pid, ' ', classid, '/', objid, '/', objsubid, ' ', mode, ' ', granted FROM pg_locks WHERE locktype = 'advisory' ORDER BY pid`)
	dump("checkpoints", `SELECT subscriber_id, ' ', partition, ' pos ', position, ' epoch ', epoch, ' owner ', coalesce(owner, '') FROM annals.checkpoints ORDER BY 1, 3`)
	dump("events after the checkpoint", `SELECT global_sequence, ' ', stream_id, '@', stream_version, ' ', event_type
		  FROM annals.events WHERE global_sequence > $1 ORDER BY global_sequence LIMIT 60`, from)
	dump("dead letters", `SELECT * FROM annals.dead_letters LIMIT 5`)
	dump("failures", `SELECT * FROM annals.failures LIMIT 5`)
	// Five looks at the sessions in transaction, 100 ms apart: a leader
	// that loops shows a new transaction each time.
	for i := range 5 {
		dump(fmt.Sprintf("sessions in transaction, look %d", i+1), `SELECT pid, ' ', coalesce(application_name, ''), ' ', coalesce(state, ''), ' ', coalesce(wait_event_type, ''), '/', coalesce(wait_event, ''),
			' xact ', xact_start::text, ' ', left(coalesce(query, ''), 300)
			  FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() AND xact_start IS NOT NULL ORDER BY pid`)
		time.Sleep(100 * time.Millisecond) // the spacing of the looks, not a wait for a condition
	}
}

// quit makes child c print every goroutine's stack to its log and exit
// (SIGQUIT, with GOTRACEBACK=all from startTallyChild), so that the log a
// failed test shows says where a stuck leader is.
func quit(t *testing.T, c *childproc.Child) {
	t.Helper()
	if err := syscall.Kill(c.PID(), syscall.SIGQUIT); err != nil {
		t.Logf("SIGQUIT to %d: %v", c.PID(), err)
		return
	}
	select {
	case <-c.Exited():
	case <-time.After(10 * time.Second):
		t.Logf("child %d has not exited within 10s of SIGQUIT", c.PID())
	}
}

// progresses polls at, every 10 ms, until it reports done. It fails when
// the value at reports has not changed for stall, or when bound has passed:
// a slow but moving catch-up is not a stall.
func progresses(stall, bound time.Duration, at func() (int64, bool)) error {
	start := time.Now()
	last, moved := int64(-1), start
	for {
		v, done := at()
		if done {
			return nil
		}
		now := time.Now()
		if v != last {
			last, moved = v, now
		}
		switch {
		case now.Sub(moved) > stall:
			return errors.Newf("no progress for %v (at %d)", stall, last)
		case now.Sub(start) > bound:
			return errors.Newf("still moving, at %d, after %v", last, bound)
		}
		time.Sleep(10 * time.Millisecond) // the polling period, not a wait for the condition
	}
}
