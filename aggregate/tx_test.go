package aggregate_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/aggregate"
	"github.com/annals-dev/annals/eventstore"
)

// The transactional twins: LoadTx, SaveTx, CreateTx and UpdateTx work inside
// the caller's transaction, so the events commit with it or not at all.
func TestTransactional(t *testing.T) {
	t.Parallel()

	t.Run("CommitAndRollback", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r := repo(t, b, &aggregate.Config{Snapshots: &aggregate.SnapshotConfig{Every: 2}})
		ctx := t.Context()
		// Create and update in one transaction: the update loads what the
		// create appended in it.
		err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
			if _, err := r.CreateTx(ctx, tx, "1", func(a *Account) error { return a.Open("ada") }); err != nil {
				return err
			}
			a, err := r.UpdateTx(ctx, tx, "1", func(a *Account) error { return a.Deposit(50) })
			if err == nil && (a.Version() != 2 || a.Balance != 50) {
				t.Errorf("UpdateTx in the creating transaction: version %d balance %d", a.Version(), a.Balance)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if v := streamLen(t, b, "account-1"); v != 2 {
			t.Fatalf("stream at %d after commit, want 2", v)
		}
		// Rolled back: nothing kept.
		err = pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
			if _, err := r.UpdateTx(ctx, tx, "1", func(a *Account) error { return a.Withdraw(20) }); err != nil {
				return err
			}
			return errors.New("abandon")
		})
		if err == nil || streamLen(t, b, "account-1") != 2 {
			t.Fatalf("a rolled-back UpdateTx was kept: %v, version %d", err, streamLen(t, b, "account-1"))
		}
		// A rule's refusal is the command's error, and tx stays usable.
		err = pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
			_, err := r.UpdateTx(ctx, tx, "1", func(a *Account) error { return a.Withdraw(1000) })
			if !errors.Is(err, errInsufficient) {
				t.Errorf("overdraft: %v, want errInsufficient", err)
			}
			_, err = r.UpdateTx(ctx, tx, "1", func(a *Account) error { return a.Withdraw(5) })
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		a, err := r.Load(ctx, "1")
		if err != nil || a.Balance != 45 || a.Version() != 3 {
			t.Fatalf("account %+v (%v), want balance 45 at version 3", a, err)
		}
		// CreateTx of an existing aggregate.
		err = pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
			_, err := r.CreateTx(ctx, tx, "1", func(a *Account) error { return a.Open("bob") })
			return err
		})
		if !errors.Is(err, aggregate.ErrAlreadyExists) {
			t.Fatalf("CreateTx of an existing aggregate: %v", err)
		}
		// LoadTx of a missing one.
		err = pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
			_, err := r.LoadTx(ctx, tx, "nobody")
			return err
		})
		if !errors.Is(err, aggregate.ErrNotFound) {
			t.Fatalf("LoadTx of a missing aggregate: %v", err)
		}
		if _, err := r.LoadTx(ctx, nil, "1"); err == nil {
			t.Fatal("LoadTx with a nil transaction succeeded")
		}
	})

	t.Run("ConflictFailsTheTransaction", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r := repo(t, b, nil)
		ctx := t.Context()
		if _, err := r.Create(ctx, "2", func(a *Account) error { return a.Open("ada") }); err != nil {
			t.Fatal(err)
		}
		err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
			_, err := r.UpdateTx(ctx, tx, "2", func(a *Account) error {
				// Another writer saves between the load and the save.
				if _, err := r.Update(context.Background(), "2", func(a *Account) error { return a.Deposit(1) }); err != nil {
					return err
				}
				return a.Deposit(7)
			})
			return err
		})
		if !errors.Is(err, eventstore.ErrWrongExpectedVersion) {
			t.Fatalf("UpdateTx that lost a race: %v, want ErrWrongExpectedVersion", err)
		}
		a, err := r.Load(ctx, "2")
		if err != nil || a.Balance != 1 || a.Version() != 2 {
			t.Fatalf("account %+v (%v): only the other writer's deposit must be stored", a, err)
		}
	})
}
