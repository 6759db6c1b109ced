package main

import (
	"fmt"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals/aggregate"
	"github.com/annals-dev/annals/eventstore"
)

// The domain events of an account: plain Go structs, stored as JSON.
// Amounts are in cents.
type (
	// AccountOpened starts an account's stream.
	AccountOpened struct {
		Owner string `json:"owner"`
	}
	// MoneyDeposited adds to the balance.
	MoneyDeposited struct {
		Amount int64 `json:"amount"`
	}
	// MoneyWithdrawn takes from the balance; never more than it holds.
	MoneyWithdrawn struct {
		Amount int64 `json:"amount"`
	}
)

// Event type names, as stored in the log.
const (
	typeOpened    = "bank.account.opened"
	typeDeposited = "bank.account.deposited"
	typeWithdrawn = "bank.account.withdrawn"
)

// newRegistry names the event types once, for the store, the aggregate and
// the projections.
func newRegistry() *eventstore.Registry {
	reg := eventstore.NewRegistry()
	eventstore.MustRegister[AccountOpened](reg, typeOpened)
	eventstore.MustRegister[MoneyDeposited](reg, typeDeposited)
	eventstore.MustRegister[MoneyWithdrawn](reg, typeWithdrawn)
	return reg
}

// The account's rule violations. Commands return them and record nothing.
var (
	// ErrAlreadyOpen refuses opening an open account.
	ErrAlreadyOpen = errors.New("account is already open")
	// ErrNotOpen refuses deposits and withdrawals before the account opens.
	ErrNotOpen = errors.New("account is not open")
	// ErrInvalidAmount refuses amounts of zero or less.
	ErrInvalidAmount = errors.New("amount must be positive")
	// ErrNoOwner refuses opening an account without an owner.
	ErrNoOwner = errors.New("an account needs an owner")
	// ErrInsufficientFunds refuses a withdrawal larger than the balance.
	ErrInsufficientFunds = errors.New("insufficient funds")
)

// Account is the aggregate: its state is folded from its events by Apply,
// and its commands (Open, Deposit, Withdraw) check the rules against that
// state and record new events. The repository stores it in the stream
// "account-<id>".
type Account struct {
	aggregate.Base
	// Owner is the account holder's name.
	Owner string `json:"owner"`
	// Open is set by AccountOpened.
	Open bool `json:"open"`
	// Balance is in cents; never below zero.
	Balance int64 `json:"balance"`
}

// newAccount is the repository's constructor.
func newAccount() *Account { return &Account{} }

// Apply folds one event into the state. It never rejects history.
func (a *Account) Apply(event any) error {
	switch e := event.(type) {
	case AccountOpened:
		a.Owner, a.Open = e.Owner, true
	case MoneyDeposited:
		a.Balance += e.Amount
	case MoneyWithdrawn:
		a.Balance -= e.Amount
	default:
		return aggregate.ErrUnhandledEvent
	}
	return nil
}

// OpenAccount opens the account for owner.
func (a *Account) OpenAccount(owner string) error {
	switch {
	case a.Open:
		return errors.Wrapf(ErrAlreadyOpen, "account %s (owner %s)", a.ID(), a.Owner)
	case owner == "":
		return ErrNoOwner
	}
	return aggregate.Record(a, AccountOpened{Owner: owner})
}

// Deposit adds amount cents.
func (a *Account) Deposit(amount int64) error {
	if err := a.check(amount); err != nil {
		return err
	}
	return aggregate.Record(a, MoneyDeposited{Amount: amount})
}

// Withdraw takes amount cents, if the balance covers it.
func (a *Account) Withdraw(amount int64) error {
	if err := a.check(amount); err != nil {
		return err
	}
	if amount > a.Balance {
		return errors.Wrapf(ErrInsufficientFunds, "withdraw %s from %s: the balance is %s",
			money(amount), a.ID(), money(a.Balance))
	}
	return aggregate.Record(a, MoneyWithdrawn{Amount: amount})
}

func (a *Account) check(amount int64) error {
	switch {
	case !a.Open:
		return errors.Wrapf(ErrNotOpen, "account %s", a.ID())
	case amount <= 0:
		return errors.Wrapf(ErrInvalidAmount, "%s", money(amount))
	}
	return nil
}

// money formats cents as dollars: 150000 → "$1500.00".
func money(cents int64) string {
	sign := ""
	if cents < 0 {
		sign, cents = "-", -cents
	}
	return fmt.Sprintf("%s$%d.%02d", sign, cents/100, cents%100)
}
