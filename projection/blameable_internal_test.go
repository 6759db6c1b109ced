package projection

import (
	"context"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/annals-dev/annals/checkpoint"
)

// Only what one event's transaction can cause after its handler returned
// nil is blamed on an event; every other error, PostgreSQL's or not, is
// retried as a batch.
func TestBlameableIsAnAllowList(t *testing.T) {
	pg := func(code string) error {
		return errors.Wrap(&pgconn.PgError{Code: code, Message: "m"}, "commit")
	}
	for _, c := range []struct {
		err  error
		want bool
	}{
		{pg("23505"), true},  // unique_violation (a deferred constraint)
		{pg("23503"), true},  // foreign_key_violation
		{pg("23P01"), true},  // exclusion_violation
		{pg("25P02"), true},  // in_failed_sql_transaction
		{pg("22012"), true},  // division_by_zero (a deferred trigger)
		{pg("P0001"), true},  // raise_exception (a deferred trigger)
		{pg("42501"), false}, // insufficient_privilege (the checkpoint UPDATE)
		{pg("25P03"), false}, // idle_in_transaction_session_timeout
		{pg("25006"), false}, // read_only_sql_transaction
		{pg("40001"), false}, // serialization_failure
		{pg("40P01"), false}, // deadlock_detected
		{pg("08006"), false}, // connection_failure
		{pg("57P01"), false}, // admin_shutdown
		{pg("53200"), false}, // out_of_memory
		{pg("55P03"), false}, // lock_not_available
		{pg("42P01"), false}, // undefined_table
		{pg("XX000"), false}, // internal_error
		{pg("2350"), false},  // not a SQLSTATE
		{errors.Wrap(checkpoint.ErrFenced, "commit"), false},
		{errors.New("conn closed"), false},
	} {
		if got := blameable(context.Background(), c.err); got != c.want {
			t.Errorf("blameable(%v) = %v, want %v", c.err, got, c.want)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if blameable(ctx, pg("23505")) {
		t.Errorf("blameable is true after the context ended")
	}
}
