package walsource

import (
	"context"
	"fmt"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// PermanentError is the error Run returns when PostgreSQL refuses the
// stream for a reason that retrying cannot mend: the role, the server's
// settings or the connection string must change first. Run logs it once,
// at ERROR, with Problem and Fix, and does not retry.
type PermanentError struct {
	// Code is PostgreSQL's SQLSTATE: 42501 (a role without the REPLICATION
	// attribute, or one that may not create the publication), 55000 or
	// 53300 (wal_level below logical, max_replication_slots or
	// max_wal_senders 0), 28000 or 28P01 (the login refused), 3D000 (no
	// such database), 58P01 (the output plugin missing).
	Code string
	// Problem says what is wrong, Fix how to mend it.
	Problem, Fix string
	// Err is the failure as the Source met it.
	Err error
}

// Error returns the problem, the fix and PostgreSQL's error.
func (e *PermanentError) Error() string {
	return fmt.Sprintf("walsource: %s; %s: %v", e.Problem, e.Fix, e.Err)
}

// Unwrap returns Err.
func (e *PermanentError) Unwrap() error { return e.Err }

// step is where in starting a stream a failure happened.
type step int

const (
	stepPublication step = iota // EnsurePublication, on the pool
	stepSlot                    // EnsureSlot and the like, on the pool
	stepStream                  // the replication connection and START_REPLICATION
)

// noReplicationFix is what to do about a role refused replication.
const noReplicationFix = "give it the attribute (ALTER ROLE %s REPLICATION; on a managed service, grant it the service's replication role, such as rds_replication), " +
	"or wake subscribers by NOTIFY rather than the WAL"

// permanent returns err as a *PermanentError when retrying cannot mend it,
// and err itself otherwise (a refused or lost connection, a server shutting
// down or in recovery, a slot in use, ...). user is the role of the
// replication connection at stepStream ("" elsewhere: the pool's session
// user is looked up). Codes that may mean either (55000, 53300) are
// settled by reading the server's settings; when that fails, err counts as
// transient.
func (s *Source) permanent(ctx context.Context, at step, user string, err error) error {
	var pgErr *pgconn.PgError
	if err == nil || ctx.Err() != nil || !errors.As(err, &pgErr) {
		return err
	}
	role := func() string {
		if user == "" {
			if qerr := s.pool.QueryRow(ctx, `SELECT session_user`).Scan(&user); qerr != nil {
				return "the role"
			}
		}
		return fmt.Sprintf("role %q", user)
	}
	ident := func() string {
		if user == "" {
			return "<role>"
		}
		return pgx.Identifier{user}.Sanitize()
	}
	pe := &PermanentError{Code: pgErr.Code, Err: err}
	switch pgErr.Code {
	case "42501": // insufficient_privilege
		if at == stepPublication {
			pe.Problem = fmt.Sprintf("%s may not create the publication %s on the events table", role(), s.publication)
			pe.Fix = fmt.Sprintf("create it once as the owner of %s.events (the role that ran the migrations): "+
				"CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert')",
				s.schema, pgx.Identifier{s.publication}.Sanitize(), pgx.Identifier{s.schema, "events"}.Sanitize())
			break
		}
		pe.Problem = role() + " lacks the REPLICATION attribute, which replication slots and connections need"
		pe.Fix = fmt.Sprintf(noReplicationFix, ident())
	case "28000": // invalid_authorization_specification
		pe.Problem = "PostgreSQL refuses " + role() + " the connection"
		pe.Fix = "make sure the role exists and may log in, and that pg_hba.conf lets it connect " +
			"(a logical replication connection matches the lines of its database, not those of the replication keyword)"
	case "28P01": // invalid_password
		pe.Problem = "PostgreSQL rejects the password of " + role()
		pe.Fix = "check the credentials of the pool's connection string or BeforeConnect"
	case "3D000": // invalid_catalog_name
		pe.Problem = "the database does not exist"
		pe.Fix = "check the pool's connection string"
	case "58P01": // undefined_file
		if at == stepPublication {
			return err
		}
		pe.Problem = "PostgreSQL cannot load the pgoutput output plugin"
		pe.Fix = "check the server's installation (pgoutput ships with PostgreSQL 10 and later)"
	case "55000", "53300": // object_not_in_prerequisite_state, too_many_connections
		if !s.misconfigured(ctx, pe) {
			return err
		}
	default:
		return err
	}
	return pe
}

// misconfigured fills pe and reports true when the server's settings rule
// logical replication out: wal_level below logical, max_replication_slots
// or max_wal_senders 0. Other causes of 55000 (a server in recovery) and
// 53300 (max_connections or max_wal_senders all taken) pass.
func (s *Source) misconfigured(ctx context.Context, pe *PermanentError) bool {
	var walLevel string
	var slots, senders int
	err := s.pool.QueryRow(ctx, `SELECT pg_catalog.current_setting('wal_level'),
		pg_catalog.current_setting('max_replication_slots')::int, pg_catalog.current_setting('max_wal_senders')::int`).Scan(&walLevel, &slots, &senders)
	switch {
	case err != nil:
		return false
	case walLevel != "logical":
		pe.Problem = fmt.Sprintf("the server's wal_level is %s, and logical decoding needs logical", walLevel)
		pe.Fix = "set wal_level = logical (ALTER SYSTEM SET wal_level = logical; on a managed service, its logical replication parameter, " +
			"such as rds.logical_replication = 1) and restart PostgreSQL"
	case slots == 0:
		pe.Problem = "the server's max_replication_slots is 0"
		pe.Fix = "set it to at least the number of subscriber partitions that follow the WAL, plus other replication's, and restart PostgreSQL"
	case senders == 0:
		pe.Problem = "the server's max_wal_senders is 0"
		pe.Fix = "set it to at least the number of subscriber partitions that follow the WAL, plus other replication's, and restart PostgreSQL"
	default:
		return false
	}
	return true
}
