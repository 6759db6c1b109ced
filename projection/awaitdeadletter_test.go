package projection_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals"
	"github.com/annals-dev/annals/deadletter"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

// runFailingBalances runs balances whose negative deposits fail for good
// (annals.Permanent) while failing is set, under policy, until the test
// ends.
func runFailingBalances(t *testing.T, b *bundle, policy projection.DeadLetterPolicy, failing *atomic.Bool) *projection.Runner {
	t.Helper()
	r, err := projection.NewRunner(b.db.Pool, &projection.Config{PollInterval: 100 * time.Millisecond, ShutdownTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	p := projection.New("balances", b.reg)
	projection.On(p, func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[Deposited]) error {
		if e.Data.Amount < 0 && failing.Load() {
			return annals.Permanent(errors.Newf("negative deposit %d", e.Data.Amount))
		}
		_, err := tx.Exec(ctx, `INSERT INTO balances VALUES ($1, $2, 1)
			ON CONFLICT (account) DO UPDATE SET amount = balances.amount + $2, events = balances.events + 1`, e.StreamID, e.Data.Amount)
		return err
	})
	p.OnReset(func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `DELETE FROM balances`)
		return err
	})
	if err := r.Register(p, &projection.Options{OnDeadLetter: policy}); err != nil {
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

// awaitDeadLettered awaits pos and requires a *DeadLetteredError for it,
// returned before the wait's deadline.
func awaitDeadLettered(t *testing.T, r *projection.Runner, pos int64, stream, reason, status string) *projection.DeadLetteredError {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	err := r.Await(ctx, "balances", pos)
	var dl *projection.DeadLetteredError
	if !errors.As(err, &dl) || !errors.Is(err, projection.ErrDeadLettered) {
		t.Fatalf("Await of position %d = %v, want a *DeadLetteredError", pos, err)
	}
	if dl.Projection != "balances" || dl.Position != pos || dl.Stream != stream || dl.Reason != reason ||
		dl.Status != status || dl.DeadLetter <= 0 {
		t.Fatalf("DeadLetteredError %+v; want position %d, stream %s, reason %s, status %s", dl, pos, stream, reason, status)
	}
	return dl
}

func awaitNil(t *testing.T, r *projection.Runner, pos int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if err := r.Await(ctx, "balances", pos); err != nil {
		t.Fatalf("Await of position %d: %v", pos, err)
	}
}

// Await of an event the projection dead-lettered (it failed) or parked
// (behind a failure of its stream) returns a *DeadLetteredError once the
// checkpoint has passed it: the read model lacks it. Await returned nil, and
// the writer read a read model without its write. Under Stop, the
// BehindError of a wait behind the stopped partition says it is stopped
// and why.
func TestAwaitDeadLettered(t *testing.T) {
	t.Parallel()

	t.Run("ParkStream", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var failing atomic.Bool
		failing.Store(true)
		r := runFailingBalances(t, b, projection.ParkStream, &failing)
		failed := awaitDeadLettered(t, r, deposit(t, b, "acct-1", -1), "acct-1", "failed", "open")
		if !strings.Contains(failed.Error(), "annals dlq retry") {
			t.Fatalf("the error does not say what to do: %v", failed)
		}
		parked := deposit(t, b, "acct-1", 5)
		awaitDeadLettered(t, r, parked, "acct-1", "parked", "open")
		awaitNil(t, r, deposit(t, b, "acct-2", 5)) // other streams flow on
		if got := readBalances(t, b); got["acct-1"] != 0 || got["acct-2"] != 5 {
			t.Fatalf("balances %v", got)
		}

		dls, err := deadletter.New(b.db.Pool, nil)
		if err != nil {
			t.Fatal(err)
		}
		// Skipped by an operator: it will never be applied.
		pos := deposit(t, b, "acct-3", -1)
		dl := awaitDeadLettered(t, r, pos, "acct-3", "failed", "open")
		if _, err := dls.Skip(t.Context(), dl.DeadLetter); err != nil {
			t.Fatal(err)
		}
		awaitDeadLettered(t, r, pos, "acct-3", "failed", "skipped")

		// Retried by an operator: Await waits for the re-delivery and
		// returns nil once the events are applied.
		failing.Store(false)
		if _, err := dls.Retry(t.Context(), failed.DeadLetter); err != nil {
			t.Fatal(err)
		}
		awaitNil(t, r, parked)
		if got := readBalances(t, b)["acct-1"]; got != 4 {
			t.Fatalf("acct-1 at %d after the retry's Await, want 4", got)
		}
	})

	t.Run("SkipEvent", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var failing atomic.Bool
		failing.Store(true)
		r := runFailingBalances(t, b, projection.SkipEvent, &failing)
		failed := deposit(t, b, "acct-1", -1)
		awaitDeadLettered(t, r, failed, "acct-1", "failed", "open")
		awaitNil(t, r, deposit(t, b, "acct-1", 5))
		if got := readBalances(t, b)["acct-1"]; got != 5 {
			t.Fatalf("acct-1 at %d, want 5", got)
		}
		// Another dead letter, skipped by an operator.
		skipped := deposit(t, b, "acct-2", -2)
		dl := awaitDeadLettered(t, r, skipped, "acct-2", "failed", "open")
		dls, err := deadletter.New(b.db.Pool, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := dls.Skip(t.Context(), dl.DeadLetter); err != nil {
			t.Fatal(err)
		}
		// The handler fixed, a rebuild applies both events: Await reports
		// them applied, not dead-lettered (the rebuild left the dead
		// letters as they were, and Await said "skipped" for events the
		// rebuilt read model held).
		failing.Store(false)
		if err := r.Rebuild(t.Context(), "balances", nil); err != nil {
			t.Fatal(err)
		}
		awaitNil(t, r, failed)
		awaitNil(t, r, skipped)
		if got := readBalances(t, b); got["acct-1"] != 4 || got["acct-2"] != -2 {
			t.Fatalf("balances after the rebuild %v, want acct-1 4, acct-2 -2", got)
		}
	})

	t.Run("Stop", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var failing atomic.Bool
		failing.Store(true)
		r := runFailingBalances(t, b, projection.Stop, &failing)
		awaitDeadLettered(t, r, deposit(t, b, "acct-1", -1), "acct-1", "failed", "open")
		pos := deposit(t, b, "acct-2", 5)
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		err := r.Await(ctx, "balances", pos)
		var be *projection.BehindError
		if !errors.As(err, &be) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Await behind a stopped partition = %v, want a BehindError", err)
		}
		if !strings.Contains(be.Stopped, "negative deposit -1") || be.Checkpoint != pos-1 || be.Lag != 1 ||
			!strings.Contains(err.Error(), "the partition is stopped") {
			t.Fatalf("BehindError %+v (%v): want the stop reason, checkpoint %d, lag 1", be, err, pos-1)
		}
	})
}
