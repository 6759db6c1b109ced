package lockfallback

import (
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/annals-dev/annals/migrations"
)

// Failed switches on 42883 of the schema's function and on 42501 of
// PostgreSQL's, not on the other code; after the attempt made again, the
// switching error is ErrNotMigrated; any other error is returned as is.
func TestFailed(t *testing.T) {
	undefined := errors.Wrap(&pgconn.PgError{Code: "42883"}, "lock")
	denied := errors.Wrap(&pgconn.PgError{Code: "42501"}, "lock")
	other := errors.New("connection lost")
	var s Switch
	if err := s.Failed(other, false, false, "f"); err != other || s.Direct() {
		t.Fatalf("another error: %v, direct %v", err, s.Direct())
	}
	if err := s.Failed(denied, false, false, "f"); err != denied || s.Direct() {
		t.Fatalf("42501 of the schema's function: %v, direct %v; want it as is", err, s.Direct())
	}
	if err := s.Failed(undefined, false, false, "f"); !errors.Is(err, ErrSwitched) || !s.Direct() {
		t.Fatalf("42883 of the schema's function: %v, direct %v; want switched to PostgreSQL's", err, s.Direct())
	}
	if err := s.Failed(undefined, true, false, "f"); err != undefined || !s.Direct() {
		t.Fatalf("42883 of PostgreSQL's function: %v, direct %v; want it as is", err, s.Direct())
	}
	if err := s.Failed(denied, true, false, "f"); !errors.Is(err, ErrSwitched) || s.Direct() {
		t.Fatalf("42501 of PostgreSQL's function: %v, direct %v; want switched back", err, s.Direct())
	}
	if err := s.Failed(undefined, false, true, "snapshot_lock"); !errors.Is(err, migrations.ErrNotMigrated) || errors.Is(err, ErrSwitched) {
		t.Fatalf("42883 of the attempt made again: %v; want ErrNotMigrated", err)
	}
}
