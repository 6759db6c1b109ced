package main

import (
	"context"
	"fmt"
	"io"
	"sync"

	"github.com/google/uuid"

	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

// notifierName is the observer's subscriber name.
const notifierName = "bank.large-withdrawal-notifier"

// largeWithdrawal is the amount (in cents) from which a withdrawal is
// notified.
const largeWithdrawal = 1000_00

// Mailer sends a notification. Like a real e-mail or SMS provider's API, it
// takes an idempotency key: sending twice with the same key delivers once.
type Mailer interface {
	Send(ctx context.Context, key uuid.UUID, message string) error
}

// newNotifier returns the observer that notifies large withdrawals. It runs
// outside the database, at least once: after a crash the runner may deliver
// an event again, so it passes the event ID to the mailer as the
// idempotency key.
func newNotifier(reg *eventstore.Registry, mailer Mailer) *projection.TypedObserver {
	o := projection.NewObserver(notifierName, reg)
	projection.Observe(o, func(ctx context.Context, e eventstore.Envelope[MoneyWithdrawn]) error {
		if e.Data.Amount < largeWithdrawal {
			return nil
		}
		return mailer.Send(ctx, e.ID, fmt.Sprintf("large withdrawal of %s from account %s",
			money(e.Data.Amount), accountID(e.StreamID)))
	})
	return o
}

// logMailer is the demo's mailer: it prints each notification once per key.
type logMailer struct {
	w    io.Writer
	mu   sync.Mutex
	sent map[uuid.UUID]bool
}

func newLogMailer(w io.Writer) *logMailer { return &logMailer{w: w, sent: map[uuid.UUID]bool{}} }

// Send prints "notification: message" unless key was sent before.
func (m *logMailer) Send(_ context.Context, key uuid.UUID, message string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.sent[key] {
		return nil // already delivered: a re-delivery after a crash
	}
	m.sent[key] = true
	_, err := fmt.Fprintf(m.w, "   notification: %s (key %s)\n", message, key)
	return err
}

// count returns the number of notifications sent.
func (m *logMailer) count() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.sent)
}
