package aggregate_test

import (
	"context"
	stderrors "errors"
	"testing"

	"github.com/annals-dev/annals/aggregate"
	"github.com/annals-dev/annals/eventstore"
)

// A Save made again after an attempt whose outcome the caller did not learn
// re-appends the same events with the same IDs: if the attempt was written
// it is an idempotent re-append (nil, the stored version, nothing twice);
// a conflict with another writer's events still fails.
func TestSaveAgainAfterAnUnknownOutcome(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	// attempted returns account "1" at version 1 with a deposit recorded and
	// tried once with a context that had ended (nothing written), and a copy
	// of it taken after that attempt, which shares its event IDs: saving the
	// copy stands for the attempt's append having been written while its
	// caller never learned it.
	attempted := func(t *testing.T, r *aggregate.Repository[*Account]) (a, written *Account) {
		t.Helper()
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
		ended, cancel := context.WithCancel(ctx)
		cancel()
		if err := r.Save(ended, a); !stderrors.Is(err, eventstore.ErrNotWritten) {
			t.Fatalf("Save with an ended context: %v, want ErrNotWritten", err)
		}
		cp := *a
		return a, &cp
	}

	t.Run("WrittenAttemptIsIdempotent", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r := repo(t, b, nil)
		a, written := attempted(t, r)
		if err := r.Save(ctx, written); err != nil {
			t.Fatal(err)
		}
		if err := r.Save(ctx, a); err != nil {
			t.Fatalf("Save again after a written attempt: %v, want nil (an idempotent re-append)", err)
		}
		if a.Version() != 2 || len(a.Uncommitted()) != 0 {
			t.Errorf("after the save: version %d, %d uncommitted; want 2, 0", a.Version(), len(a.Uncommitted()))
		}
		if n := streamLen(t, b, "account-1"); n != 2 {
			t.Errorf("the stream has %d events, want 2 (the deposit once)", n)
		}
		// The aggregate goes on from there.
		if err := a.Deposit(5); err != nil {
			t.Fatal(err)
		}
		if err := r.Save(ctx, a); err != nil || a.Version() != 3 {
			t.Fatalf("the next save: %v at version %d", err, a.Version())
		}
	})

	t.Run("NotWrittenAttemptAppends", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r := repo(t, b, nil)
		a, _ := attempted(t, r)
		if err := r.Save(ctx, a); err != nil || a.Version() != 2 {
			t.Fatalf("Save again: %v at version %d; want nil at 2", err, a.Version())
		}
	})

	t.Run("OtherWriterStillConflicts", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r := repo(t, b, nil)
		a, _ := attempted(t, r)
		if _, err := r.Update(ctx, "1", func(o *Account) error { return o.Deposit(99) }); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if err := r.Save(ctx, a); !stderrors.Is(err, eventstore.ErrWrongExpectedVersion) {
				t.Fatalf("Save after another writer's append: %v, want ErrWrongExpectedVersion", err)
			}
		}
		if got, err := r.Load(ctx, "1"); err != nil || got.Balance != 99 || got.Version() != 2 {
			t.Fatalf("loaded %+v at version %d (%v); want only the other writer's deposit", got, got.Version(), err)
		}
	})

	t.Run("MoreEventsAfterAWrittenAttemptConflict", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r := repo(t, b, nil)
		a, written := attempted(t, r)
		if err := r.Save(ctx, written); err != nil {
			t.Fatal(err)
		}
		if err := a.Deposit(1); err != nil {
			t.Fatal(err)
		}
		if err := r.Save(ctx, a); !stderrors.Is(err, eventstore.ErrEventIDConflict) {
			t.Fatalf("Save of more events after a written attempt: %v, want ErrEventIDConflict", err)
		}
		if n := streamLen(t, b, "account-1"); n != 2 {
			t.Errorf("the stream has %d events, want 2", n)
		}
	})
}
