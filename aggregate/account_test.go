package aggregate_test

import (
	"context"
	"testing"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals/aggregate"
	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
)

// The test domain: a bank account.

type Opened struct {
	Owner string `json:"owner"`
}

type Deposited struct {
	Amount int `json:"amount"`
}

type Withdrawn struct {
	Amount int `json:"amount"`
}

// Frozen is registered but Account does not handle it.
type Frozen struct{}

var errInsufficient = errors.New("insufficient funds")

type Account struct {
	aggregate.Base
	Owner    string `json:"owner"`
	Balance  int    `json:"balance"`
	Deposits int    `json:"deposits"`
}

func newAccount() *Account { return &Account{} }

func (a *Account) Apply(event any) error {
	switch e := event.(type) {
	case Opened:
		a.Owner = e.Owner
	case Deposited:
		a.Balance += e.Amount
		a.Deposits++
	case Withdrawn:
		a.Balance -= e.Amount
	default:
		return aggregate.ErrUnhandledEvent
	}
	return nil
}

func (a *Account) Open(owner string) error {
	if a.Version() > 0 || len(a.Uncommitted()) > 0 {
		return errors.New("already open")
	}
	return aggregate.Record(a, Opened{Owner: owner})
}

func (a *Account) Deposit(n int) error {
	if n <= 0 {
		return errors.New("deposit must be positive")
	}
	return aggregate.Record(a, Deposited{Amount: n})
}

func (a *Account) Withdraw(n int) error {
	if n > a.Balance {
		return errInsufficient
	}
	return aggregate.Record(a, Withdrawn{Amount: n})
}

func registry() *eventstore.Registry {
	reg := eventstore.NewRegistry()
	eventstore.MustRegister[Opened](reg, "account.opened")
	eventstore.MustRegister[Deposited](reg, "account.deposited")
	eventstore.MustRegister[Withdrawn](reg, "account.withdrawn")
	eventstore.MustRegister[Frozen](reg, "account.frozen")
	return reg
}

type bundle struct {
	db    *annalstest.DB
	store *eventstore.Store
}

func setup(t *testing.T) *bundle {
	t.Helper()
	db := annalstest.NewDB(t, nil)
	store, err := eventstore.New(db.Pool, &eventstore.Config{Registry: registry()})
	if err != nil {
		t.Fatal(err)
	}
	return &bundle{db: db, store: store}
}

func repo(t *testing.T, b *bundle, cfg *aggregate.Config) *aggregate.Repository[*Account] {
	t.Helper()
	r, err := aggregate.NewRepository(b.store, "account", newAccount, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func streamLen(t *testing.T, b *bundle, stream string) int64 {
	t.Helper()
	v, err := b.store.StreamVersion(context.Background(), stream)
	if err != nil {
		t.Fatal(err)
	}
	return v
}
