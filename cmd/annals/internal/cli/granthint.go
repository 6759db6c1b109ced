package cli

import (
	"strings"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/spf13/cobra"

	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/errmark"
)

// grantNeeded is the least `annals grant` kind each operator command needs,
// by command path without the root ("status", "archive status"; a command
// not listed, or listed under a parent, takes its nearest listed parent's),
// as docs/operations.md's role table says. The commands of the log
// (append, delete, forget) say it through eventstore.ErrNotGranted.
var grantNeeded = map[string]string{
	"status":         "'annals grant reader ROLE' (or runner, operator)",
	"scavenge":       "'annals grant operator ROLE'",
	"archive":        "'annals grant operator ROLE'",
	"checkpoint":     "'annals grant reader ROLE' (or runner, operator)",
	"checkpoint set": "'annals grant operator ROLE'",
	"dlq":            "'annals grant operator ROLE'",
	"dlq list":       "'annals grant reader ROLE' (or runner, operator)",
	"dlq show":       "'annals grant reader ROLE' (or runner, operator)",
	"schedule":       "'annals grant operator ROLE'",
	"schedule list":  "'annals grant reader ROLE' (or runner, operator)",
	"tail":           "'annals grant reader ROLE' (with --subscriber: runner, or operator)",
}

// withGrantHint returns err with a hint naming the grant cmd needs when
// PostgreSQL refused one of its statements for want of a privilege
// (SQLSTATE 42501, insufficient_privilege), and err itself otherwise (also
// when it is eventstore.ErrNotGranted already, which says so). The
// PostgreSQL error stays in the message: it names what was refused.
func withGrantHint(cmd *cobra.Command, err error) error {
	var pgErr *pgconn.PgError
	if cmd == nil || !errors.As(err, &pgErr) || pgErr.Code != "42501" || errors.Is(err, eventstore.ErrNotGranted) {
		return err
	}
	name := strings.TrimPrefix(cmd.CommandPath(), cmd.Root().Name()+" ")
	for path := name; path != ""; {
		if grant, ok := grantNeeded[path]; ok {
			return errmark.Mark(errors.Wrapf(err, "the session's role lacks the grants 'annals %s' needs: run %s as the schema's owner",
				name, grant), eventstore.ErrNotGranted)
		}
		i := strings.LastIndexByte(path, ' ')
		if i < 0 {
			break
		}
		path = path[:i]
	}
	return err
}
