package annals_test

// The claims of docs/operations.md, "Backups, restores and failover", run
// for real on clusters of the tests' own: a dump restored with and without
// owners and grants, and a failover to an asynchronous streaming replica.

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/pgcluster"
	"github.com/annals-dev/annals/migrations"
	"github.com/annals-dev/annals/projection"
	"github.com/annals-dev/annals/verify"
)

// bkSeen is a projection that records the position and ID of every event
// it handles in table seen. gate, when set, is called before each event.
type bkSeen struct {
	gate func(ctx context.Context, pos int64) error
}

func (*bkSeen) Name() string { return "seen" }

func (p *bkSeen) Handle(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	if p.gate != nil {
		if err := p.gate(ctx, e.GlobalSequence); err != nil {
			return err
		}
	}
	_, err := tx.Exec(ctx, `INSERT INTO public.seen (position, id) VALUES ($1, $2)`, e.GlobalSequence, e.ID)
	return err
}

// bkURL is the URL of database db on c as user.
func bkURL(c *pgcluster.Cluster, user, db string) string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", user, c.Port(), db)
}

// bkPool connects a pool to url, closed when the test ends.
func bkPool(t *testing.T, ctx context.Context, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// bkStore is an event store on pool, in schema annals.
func bkStore(t *testing.T, pool *pgxpool.Pool) *eventstore.Store {
	t.Helper()
	s, err := eventstore.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// bkEvent is one event of type bk.happened.
func bkEvent(n int) eventstore.EventData {
	return eventstore.EventData{Type: "bk.happened", Data: json.RawMessage(fmt.Sprintf(`{"n": %d}`, n))}
}

// bkAppend appends n events, one per append, to streams s-0 .. s-4, and
// returns their IDs by position.
func bkAppend(t *testing.T, ctx context.Context, s *eventstore.Store, n int) map[int64]uuid.UUID {
	t.Helper()
	got := map[int64]uuid.UUID{}
	for i := range n {
		res, err := s.Append(ctx, fmt.Sprintf("s-%d", i%5), eventstore.Any, bkEvent(i))
		if err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
		got[res.Events[0].GlobalSequence] = res.Events[0].ID
	}
	return got
}

// bkTool runs one of the PostgreSQL client programs (pg_dump, createdb,
// pg_restore) of the server's installation, failing the test with its
// output unless it exits 0.
func bkTool(t *testing.T, ctx context.Context, name string, args ...string) {
	t.Helper()
	dir, err := pgcluster.FindBinaries()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, filepath.Join(dir, name), args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

// bkRunner runs a projection runner with p on pool until the test ends or
// the returned stop is called.
func bkRunner(t *testing.T, ctx context.Context, pool *pgxpool.Pool, p projection.Projection) (stop func()) {
	t.Helper()
	r, err := projection.NewRunner(pool, &projection.Config{
		PollInterval:    100 * time.Millisecond,
		RetryBackoff:    50 * time.Millisecond,
		ShutdownTimeout: 5 * time.Second,
		Logger:          slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Register(p, &projection.Options{BatchSize: 10}); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("runner: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// bkSeenIsLog reports whether table seen on pool holds exactly the log's
// events (positions and IDs).
func bkSeenIsLog(t *testing.T, ctx context.Context, pool *pgxpool.Pool) bool {
	t.Helper()
	var differ int64
	err := pool.QueryRow(ctx, `SELECT count(*) FROM public.seen s FULL JOIN annals.events e
		ON e.global_sequence = s.position AND e.event_id = s.id
		WHERE s.position IS NULL OR e.global_sequence IS NULL`).Scan(&differ)
	if err != nil {
		t.Fatal(err)
	}
	return differ == 0
}

// bkLeadsSeen counts the runner instances registered on pool as leading
// projection seen.
func bkLeadsSeen(t *testing.T, ctx context.Context, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM annals.instances WHERE leads::text LIKE '%"seen"%'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// bkVerify runs what `annals verify` runs and requires it to pass with
// the head and sequence given (any sequence when seq is negative); it
// returns the sequence.
func bkVerify(t *testing.T, ctx context.Context, pool *pgxpool.Pool, head, seq int64) int64 {
	t.Helper()
	rep, err := verify.Log(ctx, pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() || rep.Head != head || rep.Sequence == nil || (seq >= 0 && *rep.Sequence != seq) {
		got := "nil"
		if rep.Sequence != nil {
			got = fmt.Sprint(*rep.Sequence)
		}
		t.Fatalf("verify: ok %v (%+v), head %d, sequence %s; want ok, head %d, sequence %d",
			rep.OK(), rep.Problems, rep.Head, got, head, seq)
	}
	return *rep.Sequence
}

// bkOwnedBy requires every table, sequence and function of schema annals
// to be owned by owner, and the append functions to be SECURITY DEFINER.
func bkOwnedBy(t *testing.T, ctx context.Context, pool *pgxpool.Pool, owner string) {
	t.Helper()
	var others, definers int
	err := pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM pg_class WHERE relnamespace = 'annals'::regnamespace
			AND relkind IN ('r', 'S', 'v') AND pg_get_userbyid(relowner) <> $1)
		+ (SELECT count(*) FROM pg_proc WHERE pronamespace = 'annals'::regnamespace
			AND pg_get_userbyid(proowner) <> $1),
		(SELECT count(*) FROM pg_proc WHERE pronamespace = 'annals'::regnamespace
			AND proname LIKE 'append%' AND prosecdef)`, owner).Scan(&others, &definers)
	if err != nil {
		t.Fatal(err)
	}
	if others != 0 || definers == 0 {
		t.Fatalf("schema annals: %d objects not owned by %s, %d SECURITY DEFINER append functions", others, owner, definers)
	}
}

// TestDumpAndRestore: pg_dump -Fc of a database in use, restored twice
// (docs/operations.md, "Dump and restore", "A restored database is the log
// as it was"). The dump is taken while a projection's batch is open (its
// handler held at event 61, so its checkpoint is behind the head) and an
// AppendTx of 5 events is uncommitted (it drew positions 101..105); then
// that transaction commits and 10 more events are appended (106..115).
//
// Restored as a superuser: every object is owned by the schema's owner
// and the append functions are SECURITY DEFINER; verify passes with head
// 100, sequence 105; the writer role appends without a grant, at 106, a
// position the source gave to another event; the projection's checkpoint
// and read model match (its rows are the events up to the checkpoint), and
// a runner resumes from them to a read model equal to the log; the runner
// that led at the dump is in the restored instance registry.
//
// Restored with --no-owner --no-acl as the owner role: the writer's append
// is refused with eventstore.ErrNotGranted until migrations.Grant (what
// `annals grant` runs); then it appends, at 106.
func TestDumpAndRestore(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	c, err := pgcluster.Start(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	port := fmt.Sprint(c.Port())
	super := bkPool(t, ctx, c.URL())
	for _, s := range []string{
		`CREATE ROLE app_owner LOGIN`,
		`CREATE ROLE app_writer LOGIN`,
		`CREATE DATABASE app OWNER app_owner`,
	} {
		if _, err := super.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	owner := bkPool(t, ctx, bkURL(c, "app_owner", "app"))
	if _, err := migrations.Up(ctx, owner, nil); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Grant(ctx, owner, "app_writer", migrations.Writer, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := owner.Exec(ctx, `CREATE TABLE public.seen (position bigint PRIMARY KEY, id uuid NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	writerPool := bkPool(t, ctx, bkURL(c, "app_writer", "app"))
	writer := bkStore(t, writerPool)
	bkAppend(t, ctx, writer, 100)

	// The projection's batch that holds event 61 stays open during the dump.
	held, release := make(chan struct{}), make(chan struct{})
	var holdOnce sync.Once
	stopRunner := bkRunner(t, ctx, owner, &bkSeen{gate: func(ctx context.Context, pos int64) error {
		if pos != 61 {
			return nil
		}
		holdOnce.Do(func() { close(held) })
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}})
	select {
	case <-held:
	case <-ctx.Done():
		t.Fatal("the projection never reached event 61")
	}
	annalstest.WaitFor(t, 10*time.Second, func() bool { return bkLeadsSeen(t, ctx, owner) == 1 })
	// So does an append: it has drawn 101..105 from the sequence.
	tx, err := writerPool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := writer.AppendTx(ctx, tx, "in-flight", eventstore.Any, bkEvent(1), bkEvent(2), bkEvent(3), bkEvent(4), bkEvent(5)); err != nil {
		t.Fatal(err)
	}
	dump := filepath.Join(t.TempDir(), "app.dump")
	bkTool(t, ctx, "pg_dump", "-Fc", "-f", dump, "-d", bkURL(c, "postgres", "app"))
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	close(release)
	after := bkAppend(t, ctx, writer, 10)
	if _, ok := after[106]; !ok {
		t.Fatalf("the appends after the dump are at %v, want 106..115", after)
	}
	annalstest.WaitFor(t, 20*time.Second, func() bool { return bkSeenIsLog(t, ctx, owner) })
	stopRunner()

	t.Run("as superuser", func(t *testing.T) {
		bkTool(t, ctx, "createdb", "-h", "127.0.0.1", "-p", port, "-U", "postgres", "restored")
		bkTool(t, ctx, "pg_restore", "-h", "127.0.0.1", "-p", port, "-U", "postgres", "-d", "restored", dump)
		ownerR := bkPool(t, ctx, bkURL(c, "app_owner", "restored"))
		bkOwnedBy(t, ctx, ownerR, "app_owner")
		bkVerify(t, ctx, ownerR, 100, 105)

		// The checkpoint and the read model are of one snapshot.
		var cp, rows, maxRow int64
		if err := ownerR.QueryRow(ctx, `SELECT position FROM annals.checkpoints WHERE subscriber_id = 'seen'`).Scan(&cp); err != nil {
			t.Fatal(err)
		}
		if err := ownerR.QueryRow(ctx, `SELECT count(*), coalesce(max(position), 0) FROM public.seen`).Scan(&rows, &maxRow); err != nil {
			t.Fatal(err)
		}
		if cp >= 61 || rows != cp || maxRow != cp {
			t.Fatalf("restored checkpoint %d, read model of %d events up to %d: want the events up to the checkpoint, below 61", cp, rows, maxRow)
		}

		// The writer appends without a grant, at a position the source gave
		// to an event the restored log does not have.
		res, err := bkStore(t, bkPool(t, ctx, bkURL(c, "app_writer", "restored"))).Append(ctx, "s-0", eventstore.Any, bkEvent(1000))
		if err != nil {
			t.Fatalf("the writer's append on the restored database: %v", err)
		}
		if ev := res.Events[0]; ev.GlobalSequence != 106 || ev.ID == after[106] {
			t.Fatalf("appended at %d (%s); want 106, where the source holds %s", ev.GlobalSequence, ev.ID, after[106])
		}

		// The runner that ran at the dump is in the restored registry, with
		// the partition it led: annals status lists it as lost or stale.
		if n := bkLeadsSeen(t, ctx, ownerR); n != 1 {
			t.Fatalf("%d instances leading seen restored, want the one of the dump", n)
		}

		// A runner resumes from the restored checkpoint.
		bkRunner(t, ctx, ownerR, &bkSeen{})
		annalstest.WaitFor(t, 20*time.Second, func() bool { return bkSeenIsLog(t, ctx, ownerR) })
	})

	t.Run("no owner, no acl", func(t *testing.T) {
		bkTool(t, ctx, "createdb", "-h", "127.0.0.1", "-p", port, "-U", "postgres", "-O", "app_owner", "restored_bare")
		bkTool(t, ctx, "pg_restore", "--no-owner", "--no-acl", "-h", "127.0.0.1", "-p", port, "-U", "app_owner", "-d", "restored_bare", dump)
		ownerR := bkPool(t, ctx, bkURL(c, "app_owner", "restored_bare"))
		bkOwnedBy(t, ctx, ownerR, "app_owner")
		bkVerify(t, ctx, ownerR, 100, 105)
		w := bkStore(t, bkPool(t, ctx, bkURL(c, "app_writer", "restored_bare")))
		if _, err := w.Append(ctx, "s-0", eventstore.Any, bkEvent(1000)); !errors.Is(err, eventstore.ErrNotGranted) {
			t.Fatalf("the writer's append before the grant: %v, want ErrNotGranted", err)
		}
		if err := migrations.Grant(ctx, ownerR, "app_writer", migrations.Writer, nil); err != nil {
			t.Fatal(err)
		}
		res, err := w.Append(ctx, "s-0", eventstore.Any, bkEvent(1000))
		if err != nil {
			t.Fatalf("the writer's append after the grant: %v", err)
		}
		if p := res.Events[0].GlobalSequence; p != 106 {
			t.Fatalf("appended at %d, want 106", p)
		}
	})
}

// TestFailoverToAsyncReplica: a replica that is asynchronous lacks the
// appends it had not received when the primary died; promoted, it gives
// their positions to new events (docs/operations.md, "Failover to a
// streaming replica"). As in the doc: 40 events replicated (the last 30
// streamed, so that the replica's sequence is what the WAL logged, not what
// the base backup copied), the replica stopped, 100 events appended and
// acknowledged, the primary killed, the replica started again and
// promoted. Its log ends at 40 and verify passes; the next appends leave
// a gap above 40 of at most 32 positions (the sequence is WAL-logged 32
// values ahead), so they land inside 41..140: on positions the old primary
// had acknowledged for other events.
func TestFailoverToAsyncReplica(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	primary, pool := annalstest.PrivateCluster(t, ctx, nil)
	store := bkStore(t, pool)
	bkAppend(t, ctx, store, 10)
	replica, err := pgcluster.StartReplica(ctx, primary.URL(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = replica.Stop(context.Background()) })
	bkAppend(t, ctx, store, 30)
	standby, err := pgx.Connect(ctx, replica.URL())
	if err != nil {
		t.Fatal(err)
	}
	annalstest.WaitFor(t, 30*time.Second, func() bool {
		var n int64
		if err := standby.QueryRow(ctx, `SELECT count(*) FROM annals.events`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 40
	})
	_ = standby.Close(ctx)

	if err := replica.Down(ctx); err != nil {
		t.Fatal(err)
	}
	lost := bkAppend(t, ctx, store, 100)
	for p := int64(41); p <= 140; p++ {
		if _, ok := lost[p]; !ok {
			t.Fatalf("the appends while the replica was down are at %v, want 41..140", lost)
		}
	}
	pool.Close()
	if err := primary.Crash(ctx); err != nil {
		t.Fatal(err)
	}
	if err := replica.Up(ctx); err != nil {
		t.Fatal(err)
	}
	promoted := bkPool(t, ctx, replica.URL())
	var ok bool
	if err := promoted.QueryRow(ctx, `SELECT pg_promote(true, 60)`).Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_promote: %v, %v", ok, err)
	}
	seq := bkVerify(t, ctx, promoted, 40, -1)
	after := bkStore(t, promoted)
	var got []int64
	for i := range 3 {
		res, err := after.Append(ctx, "s-0", eventstore.Any, bkEvent(1000+i))
		if err != nil {
			t.Fatal(err)
		}
		ev := res.Events[0]
		if ev.ID == lost[ev.GlobalSequence] {
			t.Fatalf("event %s at %d again", ev.ID, ev.GlobalSequence)
		}
		got = append(got, ev.GlobalSequence)
	}
	if got[0] <= 41 || got[0] > 40+33 || got[0] != seq+1 || got[1] != got[0]+1 || got[2] != got[0]+2 {
		t.Fatalf("the promoted replica, its sequence at %d, appended at %v; want consecutive positions from 42..73, after the sequence", seq, got)
	}
	if _, ok := lost[got[0]]; !ok {
		t.Fatalf("position %d was not one the old primary had acknowledged", got[0])
	}
	t.Logf("log ended at 40; the next appends got %v", got)
}

// bkAck is an append a writer was told had succeeded.
type bkAck struct {
	id  uuid.UUID
	pos int64
	// on is the server that acknowledged it: 'o' the old primary (answered
	// before it was killed), 'n' the promoted one (asked after the
	// promotion), '?' either.
	on byte
}

// TestMultiHostFailover: a runner and a writer (one append every 5 ms) on
// a URL that names the primary and a synchronous replica, with
// target_session_attrs=read-write; the primary is killed and the replica
// promoted (docs/operations.md, "Failover to a streaming replica"). The
// writer has appends refused during the switch (it appends each refused
// event again, with its ID, until it is acknowledged), then appends on the
// promoted server; every event it meant to append is in the log once, the
// acknowledged ones at their positions; the runner leads again and its read
// model ends equal to the log; the positions acknowledged after the switch
// are above the old primary's.
func TestMultiHostFailover(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	// Commits wait for the replica once it is named synchronous, below.
	primary, admin := annalstest.PrivateCluster(t, ctx, &pgcluster.Options{Settings: map[string]string{"synchronous_commit": "on"}})
	if _, err := admin.Exec(ctx, `CREATE TABLE public.seen (position bigint PRIMARY KEY, id uuid NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	replica, err := pgcluster.StartReplica(ctx, primary.URL(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = replica.Stop(context.Background()) })
	for _, s := range []string{`ALTER SYSTEM SET synchronous_standby_names = '*'`, `SELECT pg_reload_conf()`} {
		if _, err := admin.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	annalstest.WaitFor(t, 30*time.Second, func() bool {
		var n int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	})
	admin.Close()

	both := bkPool(t, ctx, fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=5&target_session_attrs=read-write",
		primary.Port(), replica.Port()))
	store := bkStore(t, both)
	bkRunner(t, ctx, both, &bkSeen{})

	var (
		mu       sync.Mutex
		acks     []bkAck
		sent     []uuid.UUID // every event the writer meant to append, in order
		refused  []error
		phase    int // 0 primary up, 1 killed, 2 replica promoted
		stopping = make(chan struct{})
		done     = make(chan struct{})
	)
	acked := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(acks)
	}
	go func() {
		defer close(done)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		var next *eventstore.EventData
		for n := 0; ; {
			select {
			case <-stopping:
				if next == nil {
					return
				}
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if next == nil {
				ev := bkEvent(n)
				ev.ID = uuid.Must(uuid.NewV7())
				next = &ev
				n++
				mu.Lock()
				sent = append(sent, ev.ID)
				mu.Unlock()
			}
			mu.Lock()
			from := phase
			mu.Unlock()
			actx, acancel := context.WithTimeout(ctx, 5*time.Second)
			res, err := store.Append(actx, "writer", eventstore.Any, *next)
			acancel()
			mu.Lock()
			if err != nil {
				refused = append(refused, err)
			} else {
				on := byte('?')
				if phase == 0 {
					on = 'o'
				} else if from == 2 {
					on = 'n'
				}
				acks = append(acks, bkAck{id: res.Events[0].ID, pos: res.Events[0].GlobalSequence, on: on})
				next = nil
			}
			mu.Unlock()
		}
	}()
	annalstest.WaitFor(t, 20*time.Second, func() bool { return acked() >= 50 })

	mu.Lock()
	phase = 1
	mu.Unlock()
	if err := primary.Crash(ctx); err != nil {
		t.Fatal(err)
	}
	direct, err := pgx.Connect(ctx, replica.URL())
	if err != nil {
		t.Fatal(err)
	}
	var ok bool
	if err := direct.QueryRow(ctx, `SELECT pg_promote(true, 60)`).Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_promote: %v, %v", ok, err)
	}
	_ = direct.Close(ctx)
	mu.Lock()
	phase = 2
	mu.Unlock()
	before := acked()
	annalstest.WaitFor(t, 30*time.Second, func() bool { return acked() >= before+50 })
	close(stopping)
	<-done

	promoted := bkPool(t, ctx, replica.URL())
	annalstest.WaitFor(t, 30*time.Second, func() bool { return bkSeenIsLog(t, ctx, promoted) })
	mu.Lock()
	defer mu.Unlock()
	var log []uuid.UUID
	var maxOld int64
	minNew := int64(-1)
	for _, a := range acks {
		var pos int64
		if err := promoted.QueryRow(ctx, `SELECT global_sequence FROM annals.events WHERE event_id = $1`, a.id).Scan(&pos); err != nil || pos != a.pos {
			t.Fatalf("acknowledged event %s at %d: on the promoted server at %d, %v", a.id, a.pos, pos, err)
		}
		switch {
		case a.on == 'o':
			maxOld = max(maxOld, a.pos)
		case a.on == 'n' && (minNew < 0 || a.pos < minNew):
			minNew = a.pos
		}
	}
	rows, err := promoted.Query(ctx, `SELECT event_id FROM annals.events WHERE stream_id = 'writer' ORDER BY global_sequence`)
	if err != nil {
		t.Fatal(err)
	}
	log, err = pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(log) != fmt.Sprint(sent) {
		t.Fatalf("the log holds %d of the writer's events, it sent %d: not the same, once each, in order", len(log), len(sent))
	}
	if len(refused) == 0 || minNew <= maxOld {
		t.Fatalf("%d appends refused; positions up to %d before the switch, from %d after; want some refused, and above",
			len(refused), maxOld, minNew)
	}
	unknown := 0
	for _, err := range refused {
		if errors.Is(err, eventstore.ErrOutcomeUnknown) {
			unknown++
		}
	}
	t.Logf("%d appends refused during the switch (%d ErrOutcomeUnknown); positions up to %d before it, from %d after",
		len(refused), unknown, maxOld, minNew)
}
