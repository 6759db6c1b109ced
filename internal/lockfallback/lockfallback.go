package lockfallback

import (
	"sync/atomic"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/annals-dev/annals/internal/errmark"
	"github.com/annals-dev/annals/migrations"
)

// ErrSwitched marks the failure of a lock statement after which the
// Switch chose the other way to take the lock: the caller makes its
// attempt again.
var ErrSwitched = errors.New("annals: the lock's function changed")

// Switch is the choice of one client (a Store, a Repository) between the
// schema's lock function and PostgreSQL's. The zero value takes the
// schema's. It is safe for concurrent use.
type Switch struct{ direct atomic.Bool }

// Direct reports whether the lock is to be taken through PostgreSQL's
// advisory-lock function rather than the schema's.
func (s *Switch) Direct() bool { return s.direct.Load() }

// Failed returns what err, the failure of a lock statement sent as Direct
// said (direct), means: err itself, unless it is the error that switches
// the choice (42883 of the schema's function, 42501 of PostgreSQL's). Then
// the choice is switched and err is marked ErrSwitched, or, when last is
// set (the attempt was made again already), marked
// migrations.ErrNotMigrated, saying that fn (the schema's function) is
// missing and the role may not take the lock in its place.
func (s *Switch) Failed(err error, direct, last bool, fn string) error {
	switched := "42883" // undefined_function: the schema has no fn
	if direct {
		switched = "42501" // insufficient_privilege: advisory locks restricted
	}
	var pgErr *pgconn.PgError
	switch {
	case !errors.As(err, &pgErr) || pgErr.Code != switched:
		return err
	case last:
		return errmark.Mark(errors.Wrapf(err, "annals: the schema has no %s (migration 0034), and the role may not take "+
			"PostgreSQL's advisory lock in its place: run 'annals migrate'", fn), migrations.ErrNotMigrated)
	}
	s.direct.Store(!direct)
	return errmark.Mark(err, ErrSwitched)
}
