package cli

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/annals-dev/annals/migrations"
)

func (e *env) migrateCommand() *cobra.Command {
	var print, status bool
	var format *string
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Create or upgrade the annals schema",
		Long: `Apply pending migrations (safe to run from several processes at once).
--print writes the whole schema as SQL instead, for goose, golang-migrate or atlas.
--status lists the migrations and whether each is applied; with --output json as one
array, with --output jsonl one object a line: {"version", "name", "applied",
"applied_at"} (applied_at null when pending). Applying, --output json writes one object
when it is done: {"schema", "applied": [{"version", "name"}]} (applied empty when the
schema was up to date). The schema version this binary migrates to is in 'annals
version'.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg := &migrations.Config{Schema: e.schema}
			if print && status {
				return usagef("--print and --status cannot be combined")
			}
			if print && *format != outputText {
				return usagef("--output %s cannot be combined with --print, which writes SQL", *format)
			}
			if *format == outputJSONL && !status {
				return usagef("--output jsonl needs --status (applying writes one object: use --output json)")
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
				if *format != outputText {
					out := make([]MigrationJSON, len(states))
					for i, s := range states {
						out[i] = MigrationJSON{Version: s.Version, Name: s.Name, Applied: s.Applied}
						if s.Applied {
							at := s.AppliedAt.UTC()
							out[i].AppliedAt = &at
						}
					}
					return writeJSONList(e.stdout, *format, out)
				}
				// The name column is as wide as the longest name.
				var tbl textTable
				for _, s := range states {
					when := "pending"
					if s.Applied {
						when = "applied " + s.AppliedAt.UTC().Format("2006-01-02 15:04:05Z")
					}
					tbl.add(fmt.Sprintf("%04d", s.Version), s.Name, when)
				}
				return tbl.write(e.stdout)
			}
			done, err := migrations.Up(cmd.Context(), pool, cfg)
			if *format == outputJSON {
				if err != nil {
					return err // what was applied before is in 'migrate --status'
				}
				out := MigrateJSON{Schema: e.schema, Applied: make([]AppliedMigrationJSON, len(done))}
				for i, m := range done {
					out.Applied[i] = AppliedMigrationJSON{Version: m.Version, Name: m.Name}
				}
				return writeJSON(e.stdout, out)
			}
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
	format = addOutputFlag(cmd, false, outputText, outputJSON, outputJSONL)
	return cmd
}

// MigrateJSON is what `annals migrate --output json` prints once the
// schema is up to date: the migrations this run applied, in order.
type MigrateJSON struct {
	Schema  string                 `json:"schema"`
	Applied []AppliedMigrationJSON `json:"applied"`
}

// AppliedMigrationJSON is one migration a `annals migrate` run applied.
type AppliedMigrationJSON struct {
	Version int    `json:"version"`
	Name    string `json:"name"`
}

// MigrationJSON is one migration in `annals migrate --status --output json`.
type MigrationJSON struct {
	Version   int        `json:"version"`
	Name      string     `json:"name"`
	Applied   bool       `json:"applied"`
	AppliedAt *time.Time `json:"applied_at"`
}
