package cli

import (
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/spf13/cobra"

	"github.com/annals-dev/annals/scavenge"
)

func (e *env) scavengeCommand() *cobra.Command {
	var batch, list int
	var pause time.Duration
	var format *string
	cmd := &cobra.Command{
		Use:   "scavenge",
		Short: "Remove the rows of expired, truncated and deleted streams' events",
		Long: `Make one scavenge run: remove from the log the events of hard-deleted streams and
every event below its stream's truncate-before, beyond its maximum count or older than
its maximum age (see 'annals stream set' and 'annals stream delete'). Stream reads hide
those events already; ReadAll, subscriptions and rebuilds stop seeing them now. The
aggregate snapshots of those streams at or below a removed version, and every snapshot
of a hard-deleted stream, are deleted with them. A run's clock (for maximum ages) is the
database server's when it starts.

The run goes through the log in batches of --batch positions, one transaction each,
pausing --pause between them, and reports its progress after each. It is resumable: a
run that is interrupted (Ctrl-C, a crash) is continued by the next 'annals scavenge' or
scavenger service. Only one scavenger runs at a time (exit 1 if another is running).
Every run is recorded in scavenge_runs (who, when, clock, range, rows): --list N shows
the last N.

The role needs 'annals grant operator'. --output text prints a line per batch; jsonl an
object per batch; json the final state: {"run_id", "started_by", "started_at", "now",
"from_position", "target_position", "scanned_to", "removed", "steps", "done"}, with the
lines per batch on stderr. "from_position" is exclusive: the run covers the positions
above it up to "target_position" (text shows them as "positions FROM+1..TARGET"), and
none when the two are equal. An interrupted run (Ctrl-C, SIGTERM) exits 1 and says how far
it got (json: its state, "done": false); the next 'annals scavenge' continues it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if batch < 1 {
				return usagef("--batch must be at least 1")
			}
			if pause < 0 {
				return usagef("--pause must not be negative")
			}
			// --list 0 would list nothing: refused, not taken for no
			// --list (which starts a run).
			if cmd.Flags().Changed("list") && list < 1 {
				return usagef("--list %d: want how many of the last runs to show, 1 or more", list)
			}
			ctx := cmd.Context()
			pool, err := e.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			// Progress goes to stdout; the service's log line would repeat it.
			cfg := &scavenge.Config{Schema: e.schema, BatchSize: batch, Pause: pause,
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
			if pause == 0 {
				cfg.Pause = -1
			}
			var werr error
			cfg.OnProgress = func(p scavenge.Progress) {
				if werr != nil {
					return
				}
				switch *format {
				case outputJSONL:
					werr = writeJSONList(e.stdout, outputJSONL, []scavenge.Progress{p})
				case outputText, outputJSON:
					// json's stdout is the final state alone: its
					// progress goes to stderr, as verify's does.
					out := e.stdout
					if *format == outputJSON {
						out = e.stderr
					}
					_, werr = fmt.Fprintf(out, "run %d: positions %d..%d of %d (%.0f%%), %d removed\n",
						p.RunID, p.From+1, p.ScannedTo, p.Target, 100*p.Fraction(), p.Removed)
				}
			}
			s, err := scavenge.New(pool, cfg)
			if err != nil {
				return err
			}
			if list > 0 {
				runs, err := s.Runs(ctx, list)
				if err != nil {
					return err
				}
				if *format != outputText {
					return writeJSONList(e.stdout, *format, runs)
				}
				if len(runs) == 0 {
					_, err := fmt.Fprintln(e.stdout, "No scavenge runs.")
					return err
				}
				for _, r := range runs {
					state := "open"
					if r.FinishedAt != nil {
						state = "finished " + r.FinishedAt.UTC().Format(timeLayout)
					}
					if _, err := fmt.Fprintf(e.stdout, "run %d by %s (%s), started %s, clock %s, %s: %s, scanned to %d, %d removed in %s\n",
						r.RunID, r.StartedBy, r.Instance, r.StartedAt.UTC().Format(timeLayout), r.Now.UTC().Format(timeLayout), state,
						positionsText(r.From, r.Target, "nothing to scan"), r.ScannedTo, r.Removed, countNoun(r.Steps, "step")); err != nil {
						return err
					}
				}
				return nil
			}
			p, err := s.RunOnce(ctx)
			if errors.Is(err, scavenge.ErrBusy) {
				return errors.Wrap(err, "another scavenger is running; try again later")
			}
			if err != nil && p.RunID != 0 && ctx.Err() != nil {
				// Interrupted: what the run removed stays removed, and the
				// next run continues it; json still gets its state (done
				// false).
				if *format == outputJSON {
					if werr := writeJSON(e.stdout, p); werr != nil {
						return werr
					}
				}
				return errors.Newf("interrupted: run %d stopped with positions up to %d of %d scanned (%s removed); the next 'annals scavenge' continues it",
					p.RunID, p.ScannedTo, p.Target, countNoun(p.Removed, "event"))
			}
			if err != nil {
				return err
			}
			if werr != nil {
				return werr
			}
			if *format == outputJSON {
				return writeJSON(e.stdout, p)
			}
			if *format == outputText {
				if p.Target <= p.From {
					_, err = fmt.Fprintf(e.stdout, "run %d done: nothing to scan (no positions above %d)\n", p.RunID, p.From)
				} else {
					_, err = fmt.Fprintf(e.stdout, "run %d done: %s removed from positions %d..%d\n", p.RunID, countNoun(p.Removed, "event"), p.From+1, p.Target)
				}
			}
			return err
		},
	}
	cmd.Flags().IntVar(&batch, "batch", 10000, "positions per step (one transaction each)")
	cmd.Flags().DurationVar(&pause, "pause", 0, "wait between steps (throttle), e.g. 50ms")
	cmd.Flags().IntVar(&list, "list", 0, "show the last N recorded runs instead of running")
	format = addOutputFlag(cmd, false, outputText, outputJSON, outputJSONL)
	return cmd
}

// positionsText names the positions of a run whose from position is
// exclusive (scavenge_runs, archive_runs): "positions FROM+1..TARGET", or
// none when there are none (they were printed as "positions 15..14").
func positionsText(from, target int64, none string) string {
	if target <= from {
		return none
	}
	return fmt.Sprintf("positions %d..%d", from+1, target)
}
