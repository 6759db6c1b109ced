package cli

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/projection"
)

// tailWaitNote is how long a tail --subscriber without --follow works
// before it says what it may be waiting for.
const tailWaitNote = 2 * time.Second

// ownedSubscriberChecks are the traces a projection, a saga or a relay leaves
// under its subscriber name, each with what it shows the name to be. The
// runner records each subscriber's kind (migration 0044) and refuses a tail
// under a handler's name itself (projection.ErrSubscriberKind, which
// tailKindRefused reports); these traces guard the names it has no kind
// for: those only runners older than 0044 ran. A subscriber of no such kind
// (an observer, a projection without a setup, a saga that has seen no event
// yet) leaves none there.
var ownedSubscriberChecks = []struct{ table, where, kind string }{
	{"read_model_setups", "projection = $1", "projection (its read model was set up under this name)"},
	{"read_model_generations", "projection = $1 OR subscriber = $1", "blue/green projection"},
	{"saga_states", "saga = $1", "saga (it has instances under this name)"},
	{"relay_acks", "subscriber_id = $1", "relay (it has published under this name)"},
}

// subscriberOwner says what kind of handler the database shows subscriber
// name to belong to, or "" for none. A table the role may not read (a
// reader role sees read_model_generations only) is passed over.
func subscriberOwner(ctx context.Context, pool *pgxpool.Pool, schema, name string) (string, error) {
	for _, c := range ownedSubscriberChecks {
		q := fmt.Sprintf(`SELECT EXISTS (SELECT 1 FROM %s WHERE %s)`, pgx.Identifier{schema, c.table}.Sanitize(), c.where)
		var found bool
		if err := pool.QueryRow(ctx, q, name).Scan(&found); err != nil {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == "42501" { // insufficient_privilege
				continue
			}
			return "", errors.Wrapf(err, "tail: checking whether subscriber %q belongs to a handler", name)
		}
		if found {
			return c.kind, nil
		}
	}
	return "", nil
}

// refuseOwnedSubscriber fails with a usage error when name belongs to a
// projection, saga or relay: a tail of that name would take its checkpoint
// over whenever it leads, and the handler would skip every event the tail
// printed.
func refuseOwnedSubscriber(ctx context.Context, pool *pgxpool.Pool, schema, name string) error {
	kind, err := subscriberOwner(ctx, pool, schema, name)
	if err != nil || kind == "" {
		return err
	}
	return usagef("--subscriber %q is the subscriber of a %s: a tail of that name would share its checkpoint, "+
		"and every event the tail printed while leading it would be skipped by the %s for good; "+
		"choose a name of the tail's own (--subscriber tail-%s)", name, kind, firstWord(kind), name)
}

// firstWord is s up to its first space.
func firstWord(s string) string {
	for i, r := range s {
		if r == ' ' {
			return s[:i]
		}
	}
	return s
}

// tailKindRefused is the usage error of a tail the runner refused because
// the database records its subscriber name as another kind's (a
// *projection.SubscriberKindError): it names the kind and says why.
func tailKindRefused(name string, err error) error {
	var ke *projection.SubscriberKindError
	if !errors.As(err, &ke) {
		return usageError{err}
	}
	kind := ke.Recorded
	article := "a"
	if strings.ContainsAny(kind[:1], "aeiou") {
		article = "an"
	}
	return usagef("--subscriber %q is recorded as %s %s's subscriber name: a tail of that name would share its checkpoint, "+
		"and every event the tail printed while leading it would be skipped by the %s for good; "+
		"choose a name of the tail's own (--subscriber tail-%s)", name, article, kind, kind, name)
}
