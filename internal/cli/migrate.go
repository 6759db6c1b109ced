package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/annals-dev/annals/migrations"
)

func (e *env) migrateCommand() *cobra.Command {
	var print, status bool
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Create or upgrade the annals schema",
		Long: `Apply pending migrations (safe to run from several processes at once).
--print writes the whole schema as SQL instead, for goose, golang-migrate or atlas.
--status lists the migrations and whether each is applied.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg := &migrations.Config{Schema: e.schema}
			if print && status {
				return usagef("--print and --status cannot be combined")
			}
			if print {
				if err := e.validSchema(); err != nil {
					return err
				}
				sql, err := migrations.Script(cfg)
				if err != nil {
					return err
				}
				_, err = fmt.Fprint(e.stdout, sql)
				return err
			}
			pool, err := e.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			if status {
				states, err := migrations.Status(cmd.Context(), pool, cfg)
				if err != nil {
					return err
				}
				for _, s := range states {
					when := "pending"
					if s.Applied {
						when = "applied " + s.AppliedAt.UTC().Format("2006-01-02 15:04:05Z")
					}
					fmt.Fprintf(e.stdout, "%04d  %-20s %s\n", s.Version, s.Name, when)
				}
				return nil
			}
			done, err := migrations.Up(cmd.Context(), pool, cfg)
			for _, m := range done {
				fmt.Fprintf(e.stdout, "applied %04d_%s\n", m.Version, m.Name)
			}
			if err != nil {
				return err
			}
			if len(done) == 0 {
				fmt.Fprintf(e.stdout, "schema %q is up to date\n", e.schema)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&print, "print", false, "print the schema SQL instead of applying it")
	cmd.Flags().BoolVar(&status, "status", false, "list migrations and whether each is applied")
	return cmd
}
