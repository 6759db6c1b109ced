package projection_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/migrations"
	"github.com/annals-dev/annals/projection"
)

// runBalances runs the balances projection in the background until the test
// ends. The runner's own poll is long: it is woken by appends' notifications.
func runBalances(t *testing.T, b *bundle, partitions int) *projection.Runner {
	t.Helper()
	r, err := projection.NewRunner(b.db.Pool, &projection.Config{PollInterval: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Register(balances(b.reg), &projection.Options{Partitions: partitions}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return r
}

func deposit(t *testing.T, b *bundle, stream string, amount int) int64 {
	t.Helper()
	res, err := b.store.Append(t.Context(), stream, eventstore.Any, eventstore.NewEvent(Deposited{Amount: amount}))
	if err != nil {
		t.Fatal(err)
	}
	return res.Events[len(res.Events)-1].GlobalSequence
}

func TestAwait(t *testing.T) {
	t.Parallel()

	// The awaiters' own poll is a minute in these tests: a wait that
	// returns within seconds was woken by a notification.
	const noPoll = time.Minute

	t.Run("ReturnsOnceTheProjectionHasTheEvent", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// Three partitions: each append is awaited in its stream's
		// partition, while the runner starts them (Runner.Await knows how
		// many there are), then through an Awaiter told the count.
		r := runBalances(t, b, 3)
		a, err := projection.NewAwaiter(b.db.Pool, &projection.AwaitOptions{PollInterval: noPoll})
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		for i := range 20 {
			pos := deposit(t, b, "acct-"+string(rune('a'+i%5)), 1)
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			if i < 10 {
				err = r.Await(ctx, "balances", pos)
			} else {
				err = a.AwaitPartitions(ctx, "balances", 3, pos)
			}
			cancel()
			if err != nil {
				t.Fatalf("append %d: %v", i, err)
			}
			// Read-your-writes: the read model has the event now.
			var events int
			if err := b.db.Pool.QueryRow(t.Context(), `SELECT coalesce(sum(events), 0) FROM balances`).Scan(&events); err != nil {
				t.Fatal(err)
			}
			if events != i+1 {
				t.Fatalf("after Await of append %d the read model has %d events", i, events)
			}
		}
		// The package function, one Awaiter per call (it counts the
		// partitions' checkpoint rows: all three exist by now).
		pos := deposit(t, b, "acct-z", 5)
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		if err := projection.Await(ctx, b.db.Pool, "balances", pos, &projection.AwaitOptions{PollInterval: noPoll}); err != nil {
			t.Fatal(err)
		}
		if got := readBalances(t, b)["acct-z"]; got != 5 {
			t.Fatalf("acct-z at %d after Await", got)
		}
	})

	t.Run("StoppedProjectionTimesOut", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// The projection ran once, through the first 3 events, and stopped.
		for range 3 {
			deposit(t, b, "acct-1", 1)
		}
		r, err := projection.NewRunner(b.db.Pool, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Register(balances(b.reg), nil); err != nil {
			t.Fatal(err)
		}
		if err := r.RunUntilCaughtUp(t.Context()); err != nil {
			t.Fatal(err)
		}
		var pos int64
		for range 4 {
			pos = deposit(t, b, "acct-1", 1)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
		defer cancel()
		err = projection.Await(ctx, b.db.Pool, "balances", pos, nil)
		var be *projection.BehindError
		if !errors.As(err, &be) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Await on a stopped projection: %v, want a BehindError matching DeadlineExceeded", err)
		}
		if be.Projection != "balances" || be.Target != pos || be.Checkpoint != 3 || be.Lag != 4 {
			t.Fatalf("BehindError %+v; want checkpoint 3, target %d, lag 4", be, pos)
		}
		// A projection that never ran: checkpoint 0, every event behind.
		ctx, cancel = context.WithTimeout(t.Context(), 100*time.Millisecond)
		defer cancel()
		err = projection.Await(ctx, b.db.Pool, "never-ran", pos, nil)
		if !errors.As(err, &be) || be.Checkpoint != 0 || be.Lag != 7 {
			t.Fatalf("Await on a projection that never ran: %+v (%v)", be, err)
		}
	})

	t.Run("ManyWaitersAreWoken", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		a, err := projection.NewAwaiter(b.db.Pool, &projection.AwaitOptions{PollInterval: noPoll})
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		const waiters = 64
		positions := make([]int64, waiters)
		for i := range waiters {
			positions[i] = deposit(t, b, "acct-"+string(rune('a'+i%7)), 1)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
		defer cancel()
		var wg sync.WaitGroup
		errs := make([]error, waiters)
		for i := range waiters {
			wg.Go(func() { errs[i] = a.Await(ctx, "balances", positions[i]) })
		}
		// All wait (none can return: the projection has not run).
		annalstest.WaitFor(t, 5*time.Second, func() bool { return listeners(t, b) == 1 })
		runBalances(t, b, 1)
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("waiter %d: %v", i, err)
			}
		}
	})

	t.Run("LostConnectionAndLostNotification", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		a, err := projection.NewAwaiter(b.db.Pool, &projection.AwaitOptions{PollInterval: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		pos := deposit(t, b, "acct-1", 1)
		ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- a.Await(ctx, "balances", pos) }()
		annalstest.WaitFor(t, 5*time.Second, func() bool { return listeners(t, b) == 1 })
		// Kill the listening connection: the Awaiter reconnects.
		if _, err := b.db.Pool.Exec(t.Context(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE datname = current_database() AND query ILIKE 'LISTEN%' AND pid <> pg_backend_pid()`); err != nil {
			t.Fatal(err)
		}
		annalstest.WaitFor(t, 5*time.Second, func() bool { return listeners(t, b) == 1 }) // reconnected
		// A checkpoint move that sends no notification (as if it were lost):
		// the waiter's poll finds it.
		if _, err := b.db.Pool.Exec(t.Context(), `INSERT INTO annals.checkpoints (subscriber_id, partition, position, epoch)
			VALUES ('balances', 0, $1, 1)`, pos); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		annalstest.WaitFor(t, 5*time.Second, func() bool { return listeners(t, b) == 0 })
	})
}

// listeners counts the connections listening in the test's database.
func listeners(t *testing.T, b *bundle) int {
	t.Helper()
	var n int
	err := b.db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND query ILIKE 'LISTEN%' AND pid <> pg_backend_pid()`).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// A writer awaits its own appends (read-your-writes) through an Awaiter on
// its own pool. A role granted by an older annals may not read
// read_model_generations or subscriber_layouts: its Awaiter does not look
// for blue/green generations or the layout. Every Await of such a role
// failed with "permission denied" once Await began looking them up.
func TestAwaitAsAWriter(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runBalances(t, b, 1)
	ctx := t.Context()
	for _, older := range []bool{false, true} {
		pool := writerPool(t, b)
		if older {
			revokeAwaitReads(t, b, pool)
		}
		awaitAsWriter(ctx, t, b, pool, older)
	}
}

// revokeAwaitReads takes from pool's role what an older annals grant did
// not give a writer: SELECT on the recorded layouts and the generations.
func revokeAwaitReads(t *testing.T, b *bundle, pool *pgxpool.Pool) {
	t.Helper()
	role := pgx.Identifier{pool.Config().ConnConfig.User}.Sanitize()
	schema := pgx.Identifier{b.db.Schema}.Sanitize()
	if _, err := b.db.Pool.Exec(t.Context(), "REVOKE SELECT ON "+schema+".subscriber_layouts, "+schema+".read_model_generations FROM "+role); err != nil {
		t.Fatal(err)
	}
}

func awaitAsWriter(ctx context.Context, t *testing.T, b *bundle, pool *pgxpool.Pool, older bool) {
	t.Helper()
	a, err := projection.NewAwaiter(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	before := readBalances(t, b)["acct-w"]
	for i := range 3 {
		pos := deposit(t, b, "acct-w", 1)
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		err := a.Await(wctx, "balances", pos)
		cancel()
		if err != nil {
			t.Fatalf("await %d as a writer (older grant %v): %v", i, older, err)
		}
	}
	if got := readBalances(t, b)["acct-w"]; got != before+3 {
		t.Fatalf("acct-w at %d after the awaits (older grant %v), want %d", got, older, before+3)
	}
}

// writerPool returns a pool of the test's own role, granted what annals
// grant gives a writer; the role is dropped when the test ends.
func writerPool(t *testing.T, b *bundle) *pgxpool.Pool {
	t.Helper()
	ctx := t.Context()
	role := fmt.Sprintf("annals_await_writer_%d", time.Now().UnixNano())
	if _, err := b.db.Pool.Exec(ctx, fmt.Sprintf("CREATE ROLE %s LOGIN PASSWORD 'pw-await'", role)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, s := range []string{"DROP OWNED BY " + role, "DROP ROLE " + role} {
			if _, err := b.db.Pool.Exec(context.Background(), s); err != nil {
				t.Errorf("%s: %v", s, err)
			}
		}
	})
	if err := migrations.Grant(ctx, b.db.Pool, role, migrations.Writer, nil); err != nil {
		t.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(b.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User, cfg.ConnConfig.Password = role, "pw-await"
	writer, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(writer.Close) // before the role is dropped: cleanups run last first
	return writer
}

// Await of a projection partitioned by category waits until the event is
// applied: its partition is its category's, not its stream's. Runner.Await
// computed the stream's and could return while the event's own partition
// was behind; the package function Await and an Awaiter, used where the
// projection is not registered (an API process), still did: they read the
// subscriber's recorded layout now, as a writer may. A role granted by an
// older annals may not read it: its Awaiter waits for every partition.
func TestAwaitPartitionedByCategory(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r, err := projection.NewRunner(b.db.Pool, &projection.Config{PollInterval: time.Minute, ShutdownTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var gate atomic.Pointer[chan struct{}] // the handler of category "slow" waits until it is closed
	open := make(chan struct{})
	close(open)
	gate.Store(&open)
	if err := r.Register(balancesGate(b.reg, &gate), &projection.Options{Partitions: 4, PartitionBy: catchup.PartitionByCategory}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	// A category whose partition is not "slow"'s: its events go on while
	// the slow partition waits.
	part := func(key string) int {
		var p int
		if err := b.db.Pool.QueryRow(t.Context(), `SELECT `+pgx.Identifier{b.db.Schema}.Sanitize()+`.stream_partition($1, 4)`, key).Scan(&p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	fast := "fast0"
	for k := 0; part(fast) == part("slow"); k++ {
		fast = fmt.Sprintf("fast%d", k+1)
	}
	writer, err := projection.NewAwaiter(writerPool(t, b), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Close()
	olderPool := writerPool(t, b)
	revokeAwaitReads(t, b, olderPool)
	older, err := projection.NewAwaiter(olderPool, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer older.Close()
	waiters := map[string]func(ctx context.Context, pos int64) error{
		"Runner.Await": func(ctx context.Context, pos int64) error { return r.Await(ctx, "balances", pos) },
		"Await": func(ctx context.Context, pos int64) error {
			return projection.Await(ctx, b.db.Pool, "balances", pos, nil)
		},
		"a writer's Awaiter":        func(ctx context.Context, pos int64) error { return writer.Await(ctx, "balances", pos) },
		"an older writer's Awaiter": func(ctx context.Context, pos int64) error { return older.Await(ctx, "balances", pos) },
	}
	for i := range 12 {
		shut := make(chan struct{})
		gate.Store(&shut)
		pos := deposit(t, b, fmt.Sprintf("slow-%d", i), 1)
		deposit(t, b, fmt.Sprintf("%s-%d", fast, i), 1)
		type result struct {
			how string
			err error
		}
		returned := make(chan result, len(waiters))
		for how, wait := range waiters {
			go func() {
				// Longer than the two waits below together, so that a
				// loaded machine's slow catch-up is not taken for an
				// Await that returned early (its deadline's error).
				wctx, wcancel := context.WithTimeout(t.Context(), 2*time.Minute)
				defer wcancel()
				returned <- result{how, wait(wctx, pos)}
			}()
		}
		// The slow event cannot be applied while the gate is held: Await
		// must still be waiting once the other partitions have caught up
		// (the fast one, and the idle ones, which move on with the head).
		annalstest.WaitFor(t, 30*time.Second, func() bool { return readBalances(t, b)[fmt.Sprintf("%s-%d", fast, i)] == 1 })
		var head int64
		annalstest.WaitFor(t, 30*time.Second, func() bool {
			if err := b.db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM annals.checkpoints
				WHERE subscriber_id = 'balances' AND position >= $1`, pos).Scan(&head); err != nil {
				t.Fatal(err)
			}
			return head == 3
		})
		select {
		case res := <-returned:
			t.Fatalf("event %d: %s returned (%v) before its partition applied it", i, res.how, res.err)
		case <-time.After(50 * time.Millisecond):
		}
		close(shut)
		for range waiters {
			if res := <-returned; res.err != nil {
				t.Fatalf("event %d: %s: %v", i, res.how, res.err)
			}
		}
		if got := readBalances(t, b)[fmt.Sprintf("slow-%d", i)]; got != 1 {
			t.Fatalf("after Await, slow-%d at %d", i, got)
		}
	}
}

// balancesGate is balances whose deposits to category "slow" wait until
// the channel gate holds is closed (or their context ends: a failed test's
// runner stops).
func balancesGate(reg *eventstore.Registry, gate *atomic.Pointer[chan struct{}]) *projection.Typed {
	p := projection.New("balances", reg)
	projection.On(p, func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[Deposited]) error {
		if strings.HasPrefix(e.StreamID, "slow-") {
			select {
			case <-*gate.Load():
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		_, err := tx.Exec(ctx, `INSERT INTO balances VALUES ($1, $2, 1)
			ON CONFLICT (account) DO UPDATE SET amount = balances.amount + $2, events = balances.events + 1`, e.StreamID, e.Data.Amount)
		return err
	})
	return p
}

// A runner started on a writer's pool with no subscriber of its own (what
// Client.Start runs for the scheduler's dispatcher in a service that only
// appends) fails at its first write, the instance's registration, with
// eventstore.ErrNotGranted and what to do; it was a bare 42501
// ("permission denied for table instances"). (With a subscriber, the
// layout check's write refuses it first, saying the same.)
func TestRunnerOnAWriterPoolIsNotGranted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r, err := projection.NewRunner(writerPool(t, b), &projection.Config{PollInterval: time.Minute, ShutdownTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.AddService("idle", idleService{}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done, err := r.Start(ctx)
	if err == nil {
		cancel()
		<-done
	}
	if !errors.Is(err, eventstore.ErrNotGranted) || !strings.Contains(err.Error(), "register the instance") || !strings.Contains(err.Error(), "annals grant runner") {
		t.Fatalf("a runner on a writer's pool: %v; want ErrNotGranted at its registration, naming 'annals grant runner'", err)
	}
}

// idleService is a projection.Service that waits for its end.
type idleService struct{}

func (idleService) Run(ctx context.Context) error {
	<-ctx.Done()
	return nil
}
