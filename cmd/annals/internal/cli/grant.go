package cli

import (
	"fmt"
	"strings"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/annals-dev/annals/migrations"
)

func (e *env) grantCommand() *cobra.Command {
	var print bool
	var format *string
	cmd := &cobra.Command{
		Use:   "grant writer|reader|runner|operator ROLE",
		Short: "Give an existing role what one job needs in the annals schema",
		Long: `Grant an existing PostgreSQL role exactly the privileges of one job:
  reader    reads the log (events, streams; checkpoints and dead letters for 'annals tail')
            and what 'annals status' and the console show (instances, failures, timers,
            cron tasks, the audit log); writes nothing
  writer    reads the log and appends (through the append functions only), saves
            aggregate snapshots; not what status and the console show
  runner    a reader that also runs projections, sagas and the scheduler: checkpoints,
            instances, failures, dead letters, timers, cron tasks, saga states; appends
            through the functions
  operator  a runner that also purges dead letters and deletes cron tasks, records its
            actions in the audit log, scavenges and archives: dlq, checkpoint set,
            schedule, status, verify, scavenge, archive, rebuilds; not snapshots (they
            hold aggregates' state decrypted)
No role gets INSERT, UPDATE, DELETE or TRUNCATE on events or streams. Run it as the
schema's owner (the role that ran 'annals migrate'); the role must exist (CREATE ROLE).
Runners and operators also get EXECUTE on PostgreSQL's advisory-lock functions their
statements call (the last lines of --print), granted only when run as a superuser:
they matter once 'annals advisory-locks restrict' took them from PUBLIC, and from then
on a runner's or operator's first grant needs a superuser.
--print writes the SQL instead of running it. --output json writes what was granted as
{"role", "kind", "schema", "statements"} (statements: how many ran).`,
		Example: `  annals grant writer orders_app
  annals grant runner orders_worker --schema orders
  annals grant operator oncall --print`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			kind, err := migrations.ParseRoleKind(args[0])
			if err != nil {
				// In the CLI's words: the error's own ends with the
				// package's sentinel ("...: migrations: invalid role kind").
				return usagef("%q: want reader, writer, runner or operator", args[0])
			}
			if print && *format != outputText {
				return usagef("--output %s cannot be combined with --print, which writes SQL", *format)
			}
			role := args[1]
			// Checked here: migrations reports it as an invalid role kind.
			if role == "" {
				return usagef("ROLE must not be empty: name an existing PostgreSQL role")
			}
			if strings.ContainsRune(role, 0) {
				return usagef("ROLE %q must not contain a NUL byte", role)
			}
			cfg := &migrations.Config{Schema: e.schema}
			if err := e.validSchema(); err != nil {
				return err
			}
			stmts, err := migrations.GrantSQL(role, kind, cfg)
			if errors.Is(err, migrations.ErrInvalidRoleKind) {
				return usageError{err}
			} else if err != nil {
				return err
			}
			if print {
				for _, s := range stmts {
					if _, err := fmt.Fprintln(e.stdout, s); err != nil {
						return err
					}
				}
				return nil
			}
			pool, err := e.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			ran, err := migrations.GrantCounted(cmd.Context(), pool, role, kind, cfg)
			if errors.Is(err, migrations.ErrRoleNotFound) {
				// The cause first, then what to do, in the command's
				// words (migrations' message does not say to grant again).
				id := pgx.Identifier{role}.Sanitize()
				return notFoundError{errors.Mark(errors.Newf("role %s does not exist: create it first (CREATE ROLE %s LOGIN ...), then grant again", id, id),
					migrations.ErrRoleNotFound)}
			}
			if err != nil {
				return err
			}
			if *format == outputJSON {
				return writeJSON(e.stdout, GrantJSON{Role: role, Kind: kind.String(), Schema: e.schema, Statements: ran})
			}
			_, err = fmt.Fprintf(e.stdout, "granted %s to %s (%s)\n", kind, role, countNoun(ran, "statement"))
			return err
		},
	}
	cmd.Flags().BoolVar(&print, "print", false, "print the SQL instead of running it")
	format = addOutputFlag(cmd, false, outputText, outputJSON)
	return cmd
}

// GrantJSON is what `annals grant --output json` prints: the role, the
// kind of job it was granted, the schema and how many statements ran.
type GrantJSON struct {
	Role       string `json:"role"`
	Kind       string `json:"kind"`
	Schema     string `json:"schema"`
	Statements int    `json:"statements"`
}
