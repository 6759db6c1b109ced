package annalstest

import (
	"context"
	"sort"
	"sync"
)

// Provider starts a PostgreSQL server for the tests when neither
// ANNALS_TEST_DATABASE_URL nor local server binaries are available. It
// returns an admin URL (a superuser, or a role with CREATEDB, connected to a
// database that is not used by the tests) and a function that stops the
// server; stop may be nil.
type Provider func(ctx context.Context) (adminURL string, stop func(context.Context) error, err error)

// registry holds the registered providers.
type registry struct {
	mu     sync.Mutex
	byName map[string]Provider
}

// providers is the registry RegisterProvider adds to.
var providers registry

// RegisterProvider makes p a fallback server for [NewDB], usually from an
// init function (see package annalstest/pgcontainer). Providers are tried in
// name order. It panics if p is nil or name is taken, like sql.Register.
func RegisterProvider(name string, p Provider) { providers.register(name, p) }

func (r *registry) register(name string, p Provider) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if p == nil {
		panic("annalstest: RegisterProvider " + name + " with a nil Provider")
	}
	if _, dup := r.byName[name]; dup {
		panic("annalstest: RegisterProvider called twice for " + name)
	}
	if r.byName == nil {
		r.byName = map[string]Provider{}
	}
	r.byName[name] = p
}

type namedProvider struct {
	name string
	p    Provider
}

// list returns the providers in name order.
func (r *registry) list() []namedProvider {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]namedProvider, 0, len(r.byName))
	for name, p := range r.byName {
		out = append(out, namedProvider{name, p})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}
