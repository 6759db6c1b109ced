package cli

import (
	"fmt"
	"io"
	"strings"

	"github.com/cockroachdb/errors"
	"github.com/spf13/cobra"

	"github.com/annals-dev/annals/migrations"
)

func (e *env) advisoryLocksCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "advisory-locks",
		Short: "Show or restrict who may take advisory locks in the database",
		Long: `annals elects leaders and orders the log with advisory locks, and PostgreSQL lets
every role that can connect take any advisory lock: one could hold the log's ordering
lock and stall every append. 'restrict' (a superuser) takes PostgreSQL's functions that
take advisory locks from PUBLIC in this database, and grants them to the owners of its
annals schemas and of their functions, to the roles named with --owner (owners of
schemas not migrated yet: a first 'annals migrate' takes a lock), and to the roles that
run subscribers (runners and operators). Writers and readers need none. From then on a
runner's or operator's first 'annals grant' needs a superuser. It changes the whole
database, not one schema: another program that takes advisory locks in it needs them
granted too. 'allow' gives them back to PUBLIC (PostgreSQL's default). 'status' shows
who may take them. --output json writes {"restricted", "roles", "owners", "runners"}.`,
		Example: `  annals advisory-locks status
  annals advisory-locks restrict --owner annals_owner
  annals advisory-locks allow --output json`,
		Annotations: map[string]string{groupAnnotation: ""},
		RunE: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usagef("want a subcommand: status, restrict or allow")
			}
			return usagef("unknown subcommand %q: want status, restrict or allow", args[0])
		},
	}
	cmd.AddCommand(
		e.advisoryLocksSubcommand("status", "Show who may take advisory locks in the database"),
		e.advisoryLocksSubcommand("restrict", "Take the advisory-lock functions from PUBLIC; grant them to annals' roles"),
		e.advisoryLocksSubcommand("allow", "Give the advisory-lock functions back to PUBLIC"),
	)
	return cmd
}

func (e *env) advisoryLocksSubcommand(name, short string) *cobra.Command {
	var format *string
	var owners []string
	cmd := &cobra.Command{
		Use:   name,
		Short: short,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			pool, err := e.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			var a *migrations.AdvisoryLockAccess
			switch name {
			case "restrict":
				a, err = migrations.RestrictAdvisoryLocks(cmd.Context(), pool, owners...)
			case "allow":
				a, err = migrations.AllowAdvisoryLocks(cmd.Context(), pool)
			default:
				a, err = migrations.AdvisoryLocks(cmd.Context(), pool)
			}
			if errors.Is(err, migrations.ErrRoleNotFound) {
				return notFoundError{err}
			}
			if err != nil {
				return err
			}
			if *format == outputJSON {
				return writeJSON(e.stdout, a)
			}
			return writeAdvisoryLocks(e.stdout, a)
		},
	}
	format = addOutputFlag(cmd, false, outputText, outputJSON)
	if name == "restrict" {
		cmd.Flags().StringArrayVar(&owners, "owner", nil,
			"a role that will own an annals schema not migrated yet: grant it every lock function too (repeatable)")
	}
	return cmd
}

func writeAdvisoryLocks(w io.Writer, a *migrations.AdvisoryLockAccess) error {
	names := func(s []string) string {
		if len(s) == 0 {
			return "(none)"
		}
		q := make([]string, len(s))
		for i, n := range s {
			q[i] = textCell(n)
		}
		return strings.Join(q, ", ")
	}
	who := "every role that can connect (PostgreSQL's default; 'annals advisory-locks restrict' changes it)"
	if a.Restricted {
		who = "superusers and the roles granted them: " + names(a.Roles)
	}
	_, err := fmt.Fprintf(w, "advisory locks may be taken by %s\nowners of annals schemas and their functions: %s\nrunners and operators: %s\n",
		who, names(a.Owners), names(a.Runners))
	return err
}
