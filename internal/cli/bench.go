package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/spf13/cobra"

	"github.com/annals-dev/annals/internal/benchmark"
)

func (e *env) benchCommand() *cobra.Command {
	var quick bool
	var duration time.Duration
	var jsonPath string
	var writers, batches []int
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure annals against raw PostgreSQL doing the same work",
		Long: `Measure append throughput (1, 4 and 16 writers; 1 and 100 events per append) beside a
plain INSERT numbered by a sequence and the same INSERT under an advisory lock, in the same
run, and print events/s and ratios. It creates and migrates the schema annals_bench in the
target database. Run it against a database with fsync on: fsync-off clusters hide the cost
of ordered commits. --quick runs tiny measurements (a smoke test).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if duration < 0 {
				return usagef("--duration must be positive")
			}
			cfg := &benchmark.AppendConfig{Writers: writers, Batches: batches, Duration: duration, Progress: e.stderr}
			if quick {
				cfg.Duration = 200 * time.Millisecond
				if len(writers) == 0 {
					cfg.Writers = []int{1, 4}
				}
			}
			for _, w := range cfg.Writers {
				if w < 1 || w > 64 {
					return usagef("--writers %d: want 1..64", w)
				}
			}
			for _, b := range cfg.Batches {
				if b < 1 || b > 10000 {
					return usagef("--batch %d: want 1..10000", b)
				}
			}
			pool, err := e.connect(cmd.Context(), 64)
			if err != nil {
				return err
			}
			defer pool.Close()
			rep, err := benchmark.RunAppend(cmd.Context(), pool, cfg)
			if err != nil {
				return err
			}
			if err := benchmark.WriteAppendTable(e.stdout, rep); err != nil {
				return err
			}
			if jsonPath != "" {
				b, err := json.MarshalIndent(rep, "", "  ")
				if err != nil {
					return err
				}
				if err := os.MkdirAll(filepath.Dir(jsonPath), 0o755); err != nil {
					return errors.Wrap(err, "write --json")
				}
				return errors.Wrap(os.WriteFile(jsonPath, append(b, '\n'), 0o644), "write --json")
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&quick, "quick", false, "tiny measurements, for a smoke test")
	cmd.Flags().DurationVar(&duration, "duration", 3*time.Second, "length of each measurement")
	cmd.Flags().StringVar(&jsonPath, "json", "", "also write the results as JSON to this file")
	cmd.Flags().IntSliceVar(&writers, "writers", nil, "writer counts (default 1,4,16)")
	cmd.Flags().IntSliceVar(&batches, "batch", nil, "events per append (default 1,100)")
	return cmd
}
