package cli

import "github.com/spf13/cobra"

// projectionsHintCommand answers `annals projections …` (also `projection`
// and `rebuild`), where a user looks first for the projection commands. The
// generic CLI cannot have them: listing a service's projections and
// rebuilding one run the service's own code. It is hidden, takes any
// arguments and flags, and fails as a usage error saying where they are.
func (e *env) projectionsHintCommand() *cobra.Command {
	return &cobra.Command{
		Use:                "projections",
		Aliases:            []string{"projection", "rebuild"},
		Short:              "Where the projection commands are (not in this CLI)",
		Hidden:             true,
		DisableFlagParsing: true,
		Args:               cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return usagef("annals has no projection commands: listing and rebuilding projections run your projection code, " +
				"so your service's binary mounts them (projectioncmd.New(client.Runner(), pool, nil): " +
				"myservice projections list | status | rebuild NAME), or call client.Rebuild(ctx, NAME, nil) in Go; " +
				"'annals status' shows every subscriber's checkpoint, lag and leader")
		},
	}
}
