package catchup

import "context"

// Waker wakes led subscriptions when the head may have moved. Signals are
// coalesced and never trusted as data: a woken subscription re-reads from
// its cursor. *Listener (NOTIFY) is the default Waker; package walsource
// offers one fed by logical replication. A Waker need not wake a leader
// whose checkpoint was fenced: the engine's Listener, whatever the Waker,
// passes fence announcements to the fenced partition's leader (see
// "Announcing a fence" in the package documentation).
type Waker interface {
	// Subscribe returns a channel that receives a (coalesced) signal whenever
	// the head may have moved, and a function that unsubscribes.
	Subscribe() (<-chan struct{}, func())
	// Listening returns a channel that is closed while the Waker is sure to
	// signal every later commit. Before the first read a leader waits for it
	// (or a poll interval).
	Listening() <-chan struct{}
}

// WakeFor returns the Waker of one leadership of sub, and a function that
// stops it; it is called when a live leadership begins and the stop function
// when it ends. Config.WakeFor uses it instead of the engine's Listener, for
// example to follow a replication slot of the subscriber partition's own
// (package walsource).
type WakeFor func(ctx context.Context, sub *Subscription, lease *Lease) (Waker, func())

// waker returns the Waker of a live leadership and its stop function: the
// one Config.WakeFor makes, else the engine's Listener, else nil (poll).
func (e *Engine) waker(ctx context.Context, sub *Subscription, lease *Lease) (Waker, func()) {
	if e.cfg.WakeFor != nil && !lease.Ephemeral() {
		return e.cfg.WakeFor(ctx, sub, lease)
	}
	if e.listener == nil {
		return nil, func() {}
	}
	return e.listener, func() {}
}
