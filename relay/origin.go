package relay

import (
	"context"
	"fmt"
	"strings"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5/pgconn"
)

// Keys of the relay's entries in the Metadata of a stream EnsureStream
// creates: the relay's name and origin (see HeaderOrigin). An existing
// stream whose metadata names another relay or origin is refused.
const (
	MetadataRelay  = "annals-relay"
	MetadataOrigin = "annals-origin"
)

// originOf formats an origin (see HeaderOrigin).
func originOf(system, database, schema string) string {
	return fmt.Sprintf("%s/%s/%s", system, EscapeToken(database), EscapeToken(schema))
}

// sameOrigin reports whether origins a and b (see HeaderOrigin) are of one
// log: equal, or of one database and schema where one's cluster is "0"
// (read by a role that may not run pg_control_system): moving the relay to
// a less privileged role, or back, changes only that part.
func sameOrigin(a, b string) bool {
	if a == b {
		return true
	}
	sysA, restA, okA := strings.Cut(a, "/")
	sysB, restB, okB := strings.Cut(b, "/")
	return okA && okB && restA == restB && (sysA == "0" || sysB == "0")
}

// loadOrigin reads, once, where the relay's log is (see HeaderOrigin).
func (r *Relay) loadOrigin(ctx context.Context) (string, error) {
	r.originMu.Lock()
	defer r.originMu.Unlock()
	if r.origin != "" {
		return r.origin, nil
	}
	q, err := r.queries()
	if err != nil {
		return "", err
	}
	var system, database string
	err = r.pool.QueryRow(ctx, q["Origin"]).Scan(&system, &database)
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == "42501" { // insufficient_privilege
		// pg_control_system revoked (some managed services): the
		// database and schema still tell logs apart within one cluster.
		system = "0"
		err = r.pool.QueryRow(ctx, q["Database"]).Scan(&database)
	}
	if err != nil {
		return "", errors.Wrap(err, "relay: read the log's origin")
	}
	r.origin = originOf(system, database, r.cfg.Schema)
	return r.origin, nil
}
