package aggregate_test

import (
	"context"
	stderrors "errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals/aggregate"
	"github.com/annals-dev/annals/eventstore"
)

func TestRepository(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("LoadSaveRoundTrip", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r := repo(t, b, nil)
		a, err := r.New("1")
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Open("ada"); err != nil {
			t.Fatal(err)
		}
		if err := a.Deposit(100); err != nil {
			t.Fatal(err)
		}
		if err := r.Save(ctx, a); err != nil {
			t.Fatal(err)
		}
		if a.Version() != 2 || len(a.Uncommitted()) != 0 {
			t.Fatalf("after save: version %d, %d uncommitted; want 2, 0", a.Version(), len(a.Uncommitted()))
		}
		if err := a.Withdraw(30); err != nil {
			t.Fatal(err)
		}
		if err := r.Save(ctx, a); err != nil {
			t.Fatal(err)
		}
		got, err := r.Load(ctx, "1")
		if err != nil {
			t.Fatal(err)
		}
		if got.ID() != "1" || got.Version() != 3 || got.Owner != "ada" || got.Balance != 70 || len(got.Uncommitted()) != 0 {
			t.Fatalf("loaded %+v (version %d), want ada/70 at version 3", *got, got.Version())
		}
		// The stream holds exactly the recorded events, under the default name.
		var types []string
		for e, err := range b.store.ReadStream(ctx, "account-1", 1) {
			if err != nil {
				t.Fatal(err)
			}
			types = append(types, e.Type)
		}
		if want := "account.opened account.deposited account.withdrawn"; strings.Join(types, " ") != want {
			t.Fatalf("stream holds %v, want %s", types, want)
		}
	})

	t.Run("SaveWithoutChangesIsNoop", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r := repo(t, b, nil)
		a, _ := r.Create(ctx, "1", func(a *Account) error { return a.Open("ada") })
		if err := r.Save(ctx, a); err != nil {
			t.Fatal(err)
		}
		fresh, _ := r.New("2")
		if err := r.Save(ctx, fresh); err != nil {
			t.Fatal(err)
		}
		if n := streamLen(t, b, "account-1"); n != 1 {
			t.Fatalf("stream has %d events, want 1", n)
		}
		if _, err := b.store.StreamVersion(ctx, "account-2"); !errors.Is(err, eventstore.ErrStreamNotFound) {
			t.Fatalf("saving an empty new aggregate created its stream (%v)", err)
		}
	})

	t.Run("StaleSaveConflicts", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r := repo(t, b, nil)
		if _, err := r.Create(ctx, "1", func(a *Account) error { return a.Open("ada") }); err != nil {
			t.Fatal(err)
		}
		x, _ := r.Load(ctx, "1")
		y, _ := r.Load(ctx, "1")
		_ = x.Deposit(1)
		_ = y.Deposit(2)
		if err := r.Save(ctx, x); err != nil {
			t.Fatal(err)
		}
		err := r.Save(ctx, y)
		if !errors.Is(err, eventstore.ErrWrongExpectedVersion) {
			t.Fatalf("stale save: %v, want ErrWrongExpectedVersion", err)
		}
		if y.Version() != 1 || len(y.Uncommitted()) != 1 {
			t.Fatalf("a failed save changed the aggregate: version %d, %d uncommitted", y.Version(), len(y.Uncommitted()))
		}
		if _, err := r.Create(ctx, "1", func(a *Account) error { return a.Open("bob") }); !stderrors.Is(err, aggregate.ErrAlreadyExists) || !errors.Is(err, eventstore.ErrWrongExpectedVersion) {
			t.Fatalf("Create of an existing aggregate: %v, want ErrAlreadyExists", err)
		}
	})

	t.Run("CustomStreamName", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r := repo(t, b, &aggregate.Config{StreamID: func(typ, id string) string { return "bank/" + typ + "/" + id }})
		if _, err := r.Create(ctx, "7", func(a *Account) error { return a.Open("ada") }); err != nil {
			t.Fatal(err)
		}
		if n := streamLen(t, b, "bank/account/7"); n != 1 {
			t.Fatalf("stream bank/account/7 has %d events", n)
		}
		if a, err := r.Load(ctx, "7"); err != nil || a.Owner != "ada" {
			t.Fatalf("load: %v %+v", err, a)
		}
	})

	t.Run("ConcurrentUpdatesApplyOnce", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r := repo(t, b, &aggregate.Config{UpdateRetries: 100})
		if _, err := r.Create(ctx, "1", func(a *Account) error { return a.Open("ada") }); err != nil {
			t.Fatal(err)
		}
		const workers, each = 8, 5
		var wg sync.WaitGroup
		errs := make(chan error, workers*each)
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range each {
					amount := 1 + w*each + i // distinct amounts: the sum proves each landed once
					if _, err := r.Update(ctx, "1", func(a *Account) error { return a.Deposit(amount) }); err != nil {
						errs <- err
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		n := workers * each
		a, err := r.Load(ctx, "1")
		if err != nil {
			t.Fatal(err)
		}
		if want := n * (n + 1) / 2; a.Balance != want || a.Deposits != n {
			t.Fatalf("balance %d after %d deposits, want %d after %d", a.Balance, a.Deposits, want, n)
		}
		if got := streamLen(t, b, "account-1"); got != int64(n+1) {
			t.Fatalf("stream has %d events, want %d", got, n+1)
		}
	})
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("MissingAggregate", func(t *testing.T) {
		t.Parallel()
		r := repo(t, setup(t), nil)
		_, err := r.Load(ctx, "nobody")
		if !errors.Is(err, aggregate.ErrNotFound) || !errors.Is(err, eventstore.ErrStreamNotFound) {
			t.Fatalf("Load of a missing aggregate: %v, want ErrNotFound", err)
		}
		// The standard library's errors.Is sees the same, and %+v keeps the stack.
		if !stderrors.Is(err, aggregate.ErrNotFound) || !stderrors.Is(err, eventstore.ErrStreamNotFound) {
			t.Fatalf("stdlib errors.Is does not match ErrNotFound: %v", err)
		}
		if s := fmt.Sprintf("%+v", err); !strings.Contains(s, "aggregate.(*Repository[...]).Load") {
			t.Errorf("%%+v of the error has no stack:\n%s", s)
		}
		if _, err := r.Update(ctx, "nobody", func(*Account) error { return nil }); !errors.Is(err, aggregate.ErrNotFound) {
			t.Fatalf("Update of a missing aggregate: %v, want ErrNotFound", err)
		}
	})

	t.Run("EmptyID", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r := repo(t, b, nil)
		if _, err := r.Load(ctx, ""); !errors.Is(err, aggregate.ErrInvalidID) {
			t.Fatalf("Load(\"\"): %v", err)
		}
		if _, err := r.New(""); !errors.Is(err, aggregate.ErrInvalidID) {
			t.Fatalf("New(\"\"): %v", err)
		}
		if _, err := r.Update(ctx, "", func(*Account) error { return nil }); !errors.Is(err, aggregate.ErrInvalidID) {
			t.Fatalf("Update(\"\"): %v", err)
		}
		a := newAccount() // never given an ID
		_ = a.Open("ada")
		if err := r.Save(ctx, a); !errors.Is(err, aggregate.ErrInvalidID) {
			t.Fatalf("Save without ID: %v", err)
		}
		if head, _ := b.store.Head(ctx); head != 0 {
			t.Fatalf("bad input wrote %d events", head)
		}
		bad := repo(t, b, &aggregate.Config{StreamID: func(string, string) string { return "" }})
		if _, err := bad.Load(ctx, "1"); !errors.Is(err, aggregate.ErrInvalidID) {
			t.Fatalf("empty stream name: %v", err)
		}
	})

	// An ID that makes a stream ID no append takes is refused by every
	// call as an invalid ID, before anything is read or written, and the
	// error does not carry the whole ID (it was ErrInvalidEvent on a save,
	// quoting a 5,000-byte ID twice, and ErrNotFound on a load).
	t.Run("IDNoStreamTakes", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r := repo(t, b, nil)
		for name, id := range map[string]string{
			"too long":          strings.Repeat("x", 5000),
			"control character": "a\x00b",
			"invalid UTF-8":     "a\xffb",
		} {
			check := func(call string, err error) {
				t.Helper()
				var inv *eventstore.InvalidEventError
				if !errors.Is(err, aggregate.ErrInvalidID) || !errors.As(err, &inv) || inv.Field != "stream_id" {
					t.Fatalf("%s, %s: %v, want ErrInvalidID with the stream ID's *InvalidEventError", name, call, err)
				}
				// The standard library's errors.Is, which most callers use,
				// sees the mark too (cockroachdb's errors.Mark is not seen by
				// it).
				if !stderrors.Is(err, aggregate.ErrInvalidID) || !stderrors.As(err, &inv) {
					t.Fatalf("%s, %s: %v: the standard library's errors.Is/As do not find ErrInvalidID and the *InvalidEventError", name, call, err)
				}
				if len(err.Error()) > 400 {
					t.Fatalf("%s, %s: a %d-byte message: %.200s…", name, call, len(err.Error()), err)
				}
			}
			_, err := r.Load(ctx, id)
			check("Load", err)
			_, err = r.New(id)
			check("New", err)
			_, err = r.Create(ctx, id, func(a *Account) error { return a.Open("ada") })
			check("Create", err)
			_, err = r.Update(ctx, id, func(*Account) error { return nil })
			check("Update", err)
		}
		if head, _ := b.store.Head(ctx); head != 0 {
			t.Fatalf("bad IDs wrote %d events", head)
		}
		// The longest that is taken still is.
		longest := strings.Repeat("x", eventstore.MaxStreamIDBytes-len(r.StreamID("")))
		if _, err := r.Create(ctx, longest, func(a *Account) error { return a.Open("ada") }); err != nil {
			t.Fatalf("an ID making a %d-byte stream ID: %v", len(r.StreamID(longest)), err)
		}
	})

	t.Run("UnhandledEventType", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r := repo(t, b, nil)
		if _, err := r.Create(ctx, "1", func(a *Account) error { return a.Open("ada") }); err != nil {
			t.Fatal(err)
		}
		if _, err := b.store.Append(ctx, "account-1", eventstore.Any, eventstore.NewEvent(Frozen{})); err != nil {
			t.Fatal(err)
		}
		_, err := r.Load(ctx, "1")
		if !errors.Is(err, aggregate.ErrUnhandledEvent) {
			t.Fatalf("Load: %v, want ErrUnhandledEvent", err)
		}
		for _, want := range []string{`"account.frozen"`, "aggregate_test.Frozen", "aggregate account", "version 2"} {
			if !strings.Contains(err.Error(), strings.Trim(want, `"`)) {
				t.Errorf("error %q does not name %s", err, want)
			}
		}
		// A type the registry does not know is named too.
		if _, err := b.store.Append(ctx, "account-9", eventstore.Any, eventstore.EventData{Type: "account.mystery", Data: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
		_, err = r.Load(ctx, "9")
		if !errors.Is(err, eventstore.ErrUnknownEventType) || !strings.Contains(err.Error(), "account.mystery") {
			t.Fatalf("Load of an unregistered type: %v", err)
		}
		// Recording an unhandled event fails at once and queues nothing.
		a, _ := r.Load(ctx, "1")
		if a != nil {
			t.Fatal("load should have failed")
		}
		fresh, _ := r.New("2")
		if err := aggregate.Record(fresh, Frozen{}); !errors.Is(err, aggregate.ErrUnhandledEvent) || len(fresh.Uncommitted()) != 0 {
			t.Fatalf("Record of an unhandled event: %v, %d uncommitted", err, len(fresh.Uncommitted()))
		}
	})

	t.Run("UpdateRetryBudgetSpent", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r := repo(t, b, &aggregate.Config{UpdateRetries: 2})
		if _, err := r.Create(ctx, "1", func(a *Account) error { return a.Open("ada") }); err != nil {
			t.Fatal(err)
		}
		// The command races a writer that always wins: every attempt conflicts.
		attempts := 0
		_, err := r.Update(ctx, "1", func(a *Account) error {
			attempts++
			if _, err := b.store.Append(ctx, "account-1", eventstore.Any, eventstore.NewEvent(Deposited{Amount: 1})); err != nil {
				return err
			}
			return a.Deposit(1000)
		})
		if !stderrors.Is(err, aggregate.ErrConflict) || !stderrors.Is(err, eventstore.ErrWrongExpectedVersion) || !errors.Is(err, aggregate.ErrConflict) {
			t.Fatalf("Update: %v, want ErrConflict", err)
		}
		if attempts != 3 || !strings.Contains(err.Error(), "3 attempt") {
			t.Fatalf("%d attempts (%v), want 3", attempts, err)
		}
		a, _ := r.Load(ctx, "1")
		if a.Balance != 3 {
			t.Fatalf("balance %d: a conflicting update was saved", a.Balance)
		}
		// A command's own error is returned as is and saves nothing.
		if _, err := r.Update(ctx, "1", func(a *Account) error { return a.Withdraw(1 << 20) }); !errors.Is(err, errInsufficient) {
			t.Fatalf("Update with a failing command: %v", err)
		}
		// With retries off, one conflict says so, not "kept changing
		// after 1 attempt(s)".
		once := repo(t, b, &aggregate.Config{UpdateRetries: -1})
		_, err = once.Update(ctx, "1", func(a *Account) error {
			if _, err := b.store.Append(ctx, "account-1", eventstore.Any, eventstore.NewEvent(Deposited{Amount: 1})); err != nil {
				return err
			}
			return a.Deposit(1000)
		})
		if !errors.Is(err, aggregate.ErrConflict) || !strings.Contains(err.Error(), "retries are off (UpdateRetries -1)") {
			t.Fatalf("Update with retries off: %v, want ErrConflict saying retries are off", err)
		}
	})

	// Nil inputs are errors that say what was nil, not panics.
	t.Run("NilInputs", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r := repo(t, b, nil)
		if _, err := r.Create(ctx, "1", func(a *Account) error { return a.Open("ada") }); err != nil {
			t.Fatal(err)
		}
		tx, err := b.db.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		for name, call := range map[string]func() (*Account, error){
			"Create":   func() (*Account, error) { return r.Create(ctx, "2", nil) },
			"Update":   func() (*Account, error) { return r.Update(ctx, "1", nil) },
			"CreateTx": func() (*Account, error) { return r.CreateTx(ctx, tx, "2", nil) },
			"UpdateTx": func() (*Account, error) { return r.UpdateTx(ctx, tx, "1", nil) },
		} {
			a, err := call()
			if err == nil || a != nil || !strings.Contains(err.Error(), name+" with a nil command") {
				t.Errorf("%s(nil command): %v, %v; want an error naming the nil command", name, a, err)
			}
		}
		if head, _ := b.store.Head(ctx); head != 1 {
			t.Fatalf("nil commands wrote %d events", head-1)
		}

		_, err = aggregate.FromHistory(newAccount, "x", Opened{Owner: "ada"}, nil)
		if !errors.Is(err, eventstore.ErrInvalidEvent) || !strings.Contains(err.Error(), "history event 2 is nil") {
			t.Errorf("FromHistory with a nil event: %v", err)
		}
		_, err = aggregate.FromHistory(newAccount, "x", (*Opened)(nil))
		if !errors.Is(err, eventstore.ErrInvalidEvent) || !strings.Contains(err.Error(), "history event 1 is nil (*aggregate_test.Opened)") {
			t.Errorf("FromHistory with a nil pointer event: %v", err)
		}
		if _, err := aggregate.FromHistory[*Account](nil, "x"); err == nil || !strings.Contains(err.Error(), "nil constructor") {
			t.Errorf("FromHistory with a nil constructor: %v", err)
		}
		if err := aggregate.Record((*Account)(nil), Opened{}); err == nil || !strings.Contains(err.Error(), "nil aggregate") {
			t.Errorf("Record on a nil aggregate: %v", err)
		}
	})

	t.Run("BadConfig", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// Each error names what is wrong (not another field of the same config).
		for name, c := range map[string]struct {
			cfg  *aggregate.Config
			want string
		}{
			"retries":               {&aggregate.Config{UpdateRetries: -2}, "UpdateRetries -2"},
			"snapshots":             {&aggregate.Config{Snapshots: &aggregate.SnapshotConfig{Every: 0}}, "Every must be at least 1"},
			"snapshotSchemaVersion": {&aggregate.Config{Snapshots: &aggregate.SnapshotConfig{Every: 1, SchemaVersion: -1}}, "SchemaVersion must be at least 1"},
		} {
			_, err := aggregate.NewRepository(b.store, "account", newAccount, c.cfg)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s: %v, want an error saying %q", name, err, c.want)
			}
		}
		if _, err := aggregate.NewRepository(b.store, "", newAccount, nil); err == nil {
			t.Error("empty type: no error")
		}
		if _, err := aggregate.NewRepository(b.store, "account", func() *Account { return nil }, nil); err == nil {
			t.Error("nil constructor result: no error")
		}
	})
}
