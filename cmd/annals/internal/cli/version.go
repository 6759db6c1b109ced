package cli

import (
	"fmt"
	"runtime/debug"

	"github.com/spf13/cobra"

	"github.com/annals-dev/annals/migrations"
)

// VersionJSON is the output of `annals version --output json`.
type VersionJSON struct {
	// Version is the annals module version the binary was built from,
	// "(devel)" when built from a checkout.
	Version string `json:"version"`
	// SchemaVersion is the version of the last migration this binary
	// applies: 'annals migrate' brings a schema to it.
	SchemaVersion int `json:"schema_version"`
	// GoVersion is the Go release that built the binary.
	GoVersion string `json:"go_version"`
}

// buildVersion reads the module and schema versions of this binary.
func buildVersion() (VersionJSON, error) {
	v := VersionJSON{Version: "(devel)"}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Version != "" {
			v.Version = bi.Main.Version
		}
		v.GoVersion = bi.GoVersion
	}
	all, err := migrations.All(nil)
	if err != nil {
		return v, err
	}
	v.SchemaVersion = all[len(all)-1].Version
	return v, nil
}

func (v VersionJSON) String() string {
	return fmt.Sprintf("annals %s (schema version %d, %s)", v.Version, v.SchemaVersion, v.GoVersion)
}

func (e *env) versionCommand() *cobra.Command {
	var format *string
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the annals version and the schema version it migrates to",
		Long: `Print the module version this binary was built from ("(devel)" when built from a
checkout) and the schema version 'annals migrate' brings a schema to (the number of its
last migration; 'annals migrate --status' shows a database's). Same as 'annals --version'.
--output json writes {"version", "schema_version", "go_version"}.`,
		Args: cobra.NoArgs,
		RunE: func(_ *cobra.Command, _ []string) error {
			v, err := buildVersion()
			if err != nil {
				return err
			}
			if *format == outputJSON {
				return writeJSON(e.stdout, v)
			}
			_, err = fmt.Fprintln(e.stdout, v)
			return err
		},
	}
	format = addOutputFlag(cmd, false, outputText, outputJSON)
	return cmd
}
