package cli

import (
	"context"
	"io"

	"github.com/spf13/cobra"

	"github.com/annals-dev/annals/cmd/annals/internal/benchmark"
)

// benchChildCommand is `annals bench runner-child`, hidden: one process of
// the takeover benchmark, started by `annals bench` with the flags of
// benchmark.ChildConfig.Args and DATABASE_URL in its environment.
func (e *env) benchChildCommand() *cobra.Command {
	var c benchmark.ChildConfig
	cmd := &cobra.Command{
		Use:    "runner-child",
		Short:  "One runner process of the takeover benchmark (started by annals bench)",
		Hidden: true,
		Long: `Run a Runner with a no-op projection (with --raw: hold a session advisory lock) and
print "ready" on stdout, until stdin closes or the process is signalled. annals bench
starts these to measure leader takeover; they are not meant to be run by hand.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if c.InstanceID == "" || c.Subscriber == "" {
				return usagef("--instance-id and --subscriber are required")
			}
			if c.LockRetry < 0 {
				return usagef("--lock-retry must not be negative")
			}
			pool, err := e.connectUnpinned(cmd.Context(), 4)
			if err != nil {
				return err
			}
			defer pool.Close()
			c.Schema = e.schema
			// The parent holds our stdin open: when it closes (or the parent
			// dies), stop gracefully.
			ctx, cancel := context.WithCancel(cmd.Context())
			defer cancel()
			go func() {
				_, _ = io.Copy(io.Discard, e.stdin)
				cancel()
			}()
			return benchmark.RunChild(ctx, pool, c, e.stdout, e.stderr)
		},
	}
	cmd.Flags().StringVar(&c.InstanceID, "instance-id", "", "the runner's instance ID")
	cmd.Flags().StringVar(&c.Subscriber, "subscriber", "", "the no-op projection's name")
	cmd.Flags().DurationVar(&c.LockRetry, "lock-retry", 0, "the runner's LockRetryInterval (0: its default)")
	cmd.Flags().BoolVar(&c.Raw, "raw", false, "hold the baseline's advisory lock instead of running a runner")
	cmd.Flags().IntVar(&c.Partitions, "partitions", 1, "the projection's partitions (scale-out benchmark)")
	cmd.Flags().BoolVar(&c.Upsert, "upsert", false, "upsert a read-model row per event instead of doing nothing (scale-out benchmark)")
	return cmd
}
