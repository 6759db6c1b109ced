package cli

import (
	"context"
	"encoding/json"
	"os"
	"os/user"
	"reflect"
	"strings"
	"unicode/utf8"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/internal/errmark"
	"github.com/annals-dev/annals/internal/pgtx"
	"github.com/annals-dev/annals/internal/plaintext"
	"github.com/annals-dev/annals/migrations"
)

// The CLI's operator actions (dlq retry, skip and purge, checkpoint set,
// schedule pause, resume, delete and cancel) are recorded in audit_log as
// the console's are: who (auditActor; the trigger stamps the database role),
// what (the action, its target and a JSON detail of what changed) and when
// (the server's clock). Where the action is a transaction of the CLI's own
// (dead letters, checkpoints) the entry commits with it, so an entry exists
// exactly when its change does, and a role that may not write the audit log
// changes nothing; the scheduler's actions commit on their own, and their
// entry follows.

// auditActor is who the audit log names for this command: $ANNALS_ACTOR
// when set (a CI job, a ticket), else "cli:" and the operating-system user
// and host.
func (e *env) auditActor() string {
	if a := e.getenv("ANNALS_ACTOR"); a != "" {
		return truncate(plainText(a), 200)
	}
	name := e.getenv("USER")
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	if name == "" {
		name = "unknown"
	}
	if host, err := os.Hostname(); err == nil && host != "" {
		name += "@" + host
	}
	return truncate(plainText("cli:"+name), 200)
}

// plainText is s with what would forge lines or disguise text in an export
// of the audit log (control and bidirectional formatting characters, bytes
// that are not UTF-8) replaced by "?".
func plainText(s string) string {
	return strings.Map(func(r rune) rune {
		if r == utf8.RuneError || plaintext.Disguising(r) {
			return '?'
		}
		return r
	}, strings.ToValidUTF8(s, "?"))
}

// truncate cuts s to at most n bytes, at a character boundary (a cut in
// the middle of one would be refused by PostgreSQL as invalid UTF-8).
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// mayAudit fails unless the role may write the audit log: checked before an
// action that commits on its own (the scheduler's), so that a role that
// could make the change but not record it changes nothing.
func (e *env) mayAudit(ctx context.Context, pool *pgxpool.Pool) error {
	q, err := e.queries()
	if err != nil {
		return err
	}
	var can *bool
	if err := pool.QueryRow(ctx, q["CanAudit"], e.schema).Scan(&can); err != nil {
		return errors.Wrap(err, "audit: may the role write the audit log")
	}
	if can == nil {
		// No audit log: the schema is not migrated (or only before 0011).
		// Refused before anything changes, with PostgreSQL's own error,
		// which run reports as "not migrated".
		if _, err := pool.Exec(ctx, q["AuditProbe"]); err != nil {
			return err
		}
		return errmark.Mark(errors.Newf("schema %q has no audit_log table", e.schema), migrations.ErrNotMigrated)
	}
	if !*can {
		return errors.New("the role may not record the action in the audit log ('annals grant operator' gives it that right): nothing was changed")
	}
	return nil
}

// audit records one entry on db (the action's transaction, or the pool).
func (e *env) audit(ctx context.Context, db interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, action, target string, detail any) error {
	q, err := e.queries()
	if err != nil {
		return err
	}
	b, err := json.Marshal(auditDetail(detail))
	if err != nil {
		return errors.Wrap(err, "audit: encode the detail")
	}
	_, err = db.Exec(ctx, q["Audit"], e.auditActor(), action, truncate(target, 1000), string(b))
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" { // insufficient_privilege
		return errors.Wrap(err, "the role may not record the action in the audit log ('annals grant operator' gives it that right)")
	}
	return errors.Wrap(err, "audit: record the action")
}

// auditDetail is detail as recorded: a list it leaves nil is recorded as []
// and not null (a Change lists nothing skipped as a nil slice: "skipped"
// read null in one entry and [] in the next), and no detail as {}.
func auditDetail(detail any) any {
	m, ok := detail.(map[string]any)
	if detail == nil || (ok && m == nil) {
		return map[string]any{}
	}
	if !ok {
		return detail
	}
	out := make(map[string]any, len(m))
	for k, v := range m {
		if rv := reflect.ValueOf(v); rv.Kind() == reflect.Slice && rv.IsNil() {
			v = reflect.MakeSlice(rv.Type(), 0, 0).Interface()
		}
		out[k] = v
	}
	return out
}

// audited runs fn and its audit entry in one transaction on pool: fn
// returns the entry's target and detail. A deadlock or serialization
// failure runs it again, up to three times in all (as package deadletter
// does).
func (e *env) audited(ctx context.Context, pool *pgxpool.Pool, action string, fn func(tx pgx.Tx) (target string, detail any, err error)) error {
	return pgtx.Retrying(ctx, pool, func(tx pgx.Tx) error {
		target, detail, err := fn(tx)
		if err != nil {
			return err
		}
		return e.audit(ctx, tx, action, target, detail)
	})
}
