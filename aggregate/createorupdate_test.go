package aggregate_test

import (
	"sync"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/aggregate"
	"github.com/annals-dev/annals/eventstore"
)

// depositOpening is a command any first command may start with: it opens
// the account when nothing has (version 0, nothing recorded yet).
func depositOpening(amount int) func(*Account) error {
	return func(a *Account) error {
		if a.Version() == 0 && len(a.Uncommitted()) == 0 {
			if err := a.Open("ada"); err != nil {
				return err
			}
		}
		return a.Deposit(amount)
	}
}

// CreateOrUpdate on an aggregate nobody has created yet, from 8 goroutines
// at once: exactly one of the first commands opens the account (the
// others lose the race to create the stream, load the winner's events and
// run again), and every deposit lands exactly once.
func TestCreateOrUpdateAnyFirstCommand(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t)
	r := repo(t, b, &aggregate.Config{UpdateRetries: 100})
	const workers, each = 8, 5
	var wg sync.WaitGroup
	errs := make(chan error, workers*each)
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				if _, err := r.CreateOrUpdate(ctx, "7", depositOpening(1+w*each+i)); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	n := workers * each
	a, err := r.Load(ctx, "7")
	if err != nil {
		t.Fatal(err)
	}
	if want := n * (n + 1) / 2; a.Owner != "ada" || a.Balance != want || a.Deposits != n {
		t.Fatalf("owner %q, balance %d after %d deposits; want ada, %d after %d", a.Owner, a.Balance, a.Deposits, want, n)
	}
	if got := streamLen(t, b, "account-7"); got != int64(n+1) {
		t.Fatalf("stream has %d events, want %d (one opening)", got, n+1)
	}
	// With retries off, a lost race is ErrConflict, as for Update.
	off := repo(t, b, &aggregate.Config{UpdateRetries: -1})
	if _, err := off.CreateOrUpdate(ctx, "7", func(a *Account) error {
		// Another writer deposits between this load and this save.
		if _, err := r.Update(ctx, "7", func(a *Account) error { return a.Deposit(1) }); err != nil {
			return err
		}
		return a.Deposit(1)
	}); !errors.Is(err, aggregate.ErrConflict) || !errors.Is(err, eventstore.ErrWrongExpectedVersion) {
		t.Fatalf("CreateOrUpdate losing a race with retries off: %v, want ErrConflict", err)
	}
	if _, err := r.CreateOrUpdate(ctx, "7", nil); err == nil {
		t.Fatal("CreateOrUpdate with a nil command succeeded")
	}
	if _, err := r.CreateOrUpdate(ctx, "", depositOpening(1)); !errors.Is(err, aggregate.ErrInvalidID) {
		t.Fatalf("CreateOrUpdate of an empty ID: %v, want ErrInvalidID", err)
	}
}

// CreateOrUpdateTx creates in one transaction and updates in the next; a
// rolled-back one leaves nothing; a race lost to a concurrent first command
// fails its transaction with ErrWrongExpectedVersion.
func TestCreateOrUpdateTx(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t)
	r := repo(t, b, nil)
	run := func(amount int) (*Account, error) {
		var a *Account
		err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) (err error) {
			a, err = r.CreateOrUpdateTx(ctx, tx, "3", depositOpening(amount))
			return err
		})
		return a, err
	}
	if a, err := run(10); err != nil || a.Version() != 2 || a.Balance != 10 {
		t.Fatalf("first CreateOrUpdateTx: %v, %+v", err, a)
	}
	if a, err := run(5); err != nil || a.Version() != 3 || a.Balance != 15 {
		t.Fatalf("second CreateOrUpdateTx: %v, %+v", err, a)
	}
	errRollback := errors.New("roll back")
	if err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		if _, err := r.CreateOrUpdateTx(ctx, tx, "4", depositOpening(1)); err != nil {
			return err
		}
		return errRollback
	}); !errors.Is(err, errRollback) {
		t.Fatal(err)
	}
	if _, err := r.Load(ctx, "4"); !errors.Is(err, aggregate.ErrNotFound) {
		t.Fatalf("after a rolled-back CreateOrUpdateTx: %v, want ErrNotFound", err)
	}
	// A first command in a transaction that another first command beats
	// between its load and its save: the transaction fails with
	// ErrWrongExpectedVersion, and the winner's events stand alone.
	err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		_, err := r.CreateOrUpdateTx(ctx, tx, "5", func(a *Account) error {
			if _, err := r.CreateOrUpdate(ctx, "5", depositOpening(2)); err != nil {
				return err
			}
			return depositOpening(3)(a)
		})
		return err
	})
	if !errors.Is(err, eventstore.ErrWrongExpectedVersion) {
		t.Fatalf("CreateOrUpdateTx beaten by a concurrent first command: %v, want ErrWrongExpectedVersion", err)
	}
	if a, err := r.Load(ctx, "5"); err != nil || a.Balance != 2 || a.Version() != 2 {
		t.Fatalf("after a first command that lost a race: %v, %+v; want the winner's 2 events alone", err, a)
	}
	// Retried, the transaction loads the winner's events and updates.
	if err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		_, err := r.CreateOrUpdateTx(ctx, tx, "5", depositOpening(3))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if a, err := r.Load(ctx, "5"); err != nil || a.Balance != 5 || a.Version() != 3 {
		t.Fatalf("after the retry: %v, %+v; want balance 5 at version 3", err, a)
	}
	if _, err := r.CreateOrUpdateTx(ctx, nil, "6", depositOpening(1)); err == nil {
		t.Fatal("CreateOrUpdateTx with a nil transaction succeeded")
	}
}
