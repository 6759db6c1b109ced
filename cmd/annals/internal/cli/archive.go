package cli

import (
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/spf13/cobra"

	"github.com/annals-dev/annals/archive"
)

func (e *env) archiveCommand() *cobra.Command {
	var batch int
	var before *positionFlag
	var pause time.Duration
	var format *string
	cmd := &cobra.Command{
		Use:   "archive --before POSITION",
		Short: "Move old events out of the hot events table into events_archive",
		Long: `Make one archive run: move the events with positions below --before from the events
table to events_archive, so that the table every append and live subscriber touches,
and its indexes, stay small. Archived events stay readable by everything: 'annals read',
subscriptions and rebuilds from position 0, stream reads, aggregate loads; re-appending
an archived event is still idempotent. The newest event always stays in events.

The run moves --batch positions per step, one transaction each, pausing --pause between
them, and reports its progress after each. Appends wait while a step moves events (a
step of 2000 positions takes milliseconds): keep --batch small on a busy log. The run is
resumable: one that is interrupted (Ctrl-C, a crash) is continued, with its own target,
by the next 'annals archive'. Only one archiver runs at a time (exit 1 if another is
running). Every run is recorded in archive_runs: see 'annals archive status'.

After a large run, VACUUM the events table (autovacuum does it in time) so that its
freed space is reused by new appends; see docs/operations.md.

When there is nothing to move (every position below --before is archived already, or
only the newest event is left), it says so; the run is recorded all the same, with 0 moved.
--before is at most the head of the log + 1, which archives every event but the newest;
a larger one is refused as a typo (exit 2), as checkpoint set refuses a position past
the head.

The role needs 'annals grant operator'. --output text prints a line per step; jsonl an
object per step; json the final state: {"run_id", "started_by", "started_at", "before",
"from_position", "target_position", "archived_to", "moved", "steps", "done"}, with the
lines per step on stderr. "from_position" is exclusive: the run covers the positions
above it up to "target_position" (text shows them as "positions FROM+1..TARGET"), and
none when the two are equal. An interrupted run (Ctrl-C, SIGTERM) exits 1 and says how far
it got (json: its state, "done": false); the next 'annals archive' continues it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if before.v < 1 {
				return usagef("--before must be a position of at least 1")
			}
			if batch < 1 {
				return usagef("--batch must be at least 1")
			}
			if pause < 0 {
				return usagef("--pause must not be negative")
			}
			q, err := e.queries()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			pool, err := e.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			var head int64
			var now any
			if err := pool.QueryRow(ctx, q["Head"]).Scan(&head, &now); err != nil {
				return errors.Wrap(err, "read the head of the log")
			}
			if before.v > head+1 {
				return usagef("--before %d is beyond the head of the log (%d): at most %d, which archives every event but the newest",
					before.v, head, head+1)
			}
			// Progress goes to stdout; the service's log line would repeat it.
			cfg := &archive.Config{Schema: e.schema, BatchSize: batch, Pause: pause,
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
			if pause == 0 {
				cfg.Pause = -1
			}
			var werr error
			cfg.OnProgress = func(p archive.Progress) {
				if werr != nil {
					return
				}
				switch *format {
				case outputJSONL:
					werr = writeJSONList(e.stdout, outputJSONL, []archive.Progress{p})
				case outputText, outputJSON:
					// json's stdout is the final state alone: its
					// progress goes to stderr, as verify's does.
					out := e.stdout
					if *format == outputJSON {
						out = e.stderr
					}
					if p.Target <= p.From { // every position below the target is archived already
						_, werr = fmt.Fprintf(out, "run %d: nothing to archive below %d: positions below %d are archived already, and the newest event always stays in events\n",
							p.RunID, p.Before, p.From+1)
						return
					}
					_, werr = fmt.Fprintf(out, "run %d: positions %d..%d of %d archived (%.0f%%), %s moved\n",
						p.RunID, p.From+1, p.ArchivedTo, p.Target, 100*p.Fraction(), countNoun(p.Moved, "event"))
				}
			}
			a, err := archive.New(pool, cfg)
			if err != nil {
				return err
			}
			p, err := a.RunOnce(ctx, before.v)
			if errors.Is(err, archive.ErrBusy) {
				return errors.Wrap(err, "another archiver is running; try again later")
			}
			if err != nil && p.RunID != 0 && ctx.Err() != nil {
				// Interrupted: what the run did stays done, and the next
				// run continues it; json still gets its state (done false).
				if *format == outputJSON {
					if werr := writeJSON(e.stdout, p); werr != nil {
						return werr
					}
				}
				return errors.Newf("interrupted: run %d stopped with positions up to %d of %d archived (%s moved); the next 'annals archive' continues it",
					p.RunID, p.ArchivedTo, p.Target, countNoun(p.Moved, "event"))
			}
			if err != nil {
				return err
			}
			if werr != nil {
				return werr
			}
			switch *format {
			case outputJSON:
				return writeJSON(e.stdout, p)
			case outputText:
				if p.Before != before.v {
					_, err = fmt.Fprintf(e.stdout, "run %d was an interrupted run (archiving below %d), now done; run again to archive below %d\n",
						p.RunID, p.Before, before.v)
					if err != nil {
						return err
					}
				}
				_, err = fmt.Fprintf(e.stdout, "run %d done: %s moved; positions below %d are archived\n", p.RunID, countNoun(p.Moved, "event"), p.Target+1)
			}
			return err
		},
	}
	before = addPositionFlag(cmd, "before", "archive the events with positions below this one")
	cmd.Flags().IntVar(&batch, "batch", 2000, "positions per step (one transaction each; appends wait for it)")
	cmd.Flags().DurationVar(&pause, "pause", 0, "wait between steps (throttle), e.g. 50ms")
	format = addOutputFlag(cmd, false, outputText, outputJSON, outputJSONL)
	cmd.AddCommand(e.archiveStatusCommand())
	return cmd
}

func (e *env) archiveStatusCommand() *cobra.Command {
	var runs int
	var format *string
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the archive horizon, the tables' sizes and the last archive runs",
		Long: `Show the archive: its horizon (every position below it is archived, every one at or
above it is in the hot events table), how many events the runs moved, the sizes of
events and events_archive with their indexes and their row estimates, and the last
--runs runs (who, when, range, rows). --output json prints {"horizon", "moved",
"newest_archived", "head", "hot_bytes", "archive_bytes", "hot_rows_estimate",
"archive_rows_estimate", "runs": [...]}. A row estimate of -1 means the table has not been
analyzed yet (text: "not analyzed"; ANALYZE or autovacuum sets it). Each run's
"from_position" is exclusive, as in 'annals archive': it covers the positions above it
up to "target_position" (text: "positions FROM+1..TARGET", or "nothing to move").`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if runs < 0 {
				return usagef("--runs must not be negative")
			}
			ctx := cmd.Context()
			pool, err := e.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			a, err := archive.New(pool, &archive.Config{Schema: e.schema})
			if err != nil {
				return err
			}
			st, err := a.Status(ctx, runs)
			if err != nil {
				return err
			}
			if *format == outputJSON {
				return writeJSON(e.stdout, st)
			}
			rows := func(n int64) string {
				if n < 0 {
					return "not analyzed"
				}
				return "~" + countNoun(n, "row")
			}
			if _, err := fmt.Fprintf(e.stdout, "horizon %d (head %d): %s moved by archive runs\nhot events:     %s, %s\nevents_archive: %s, %s\n",
				st.Horizon, st.Head, countNoun(st.Moved, "event"), bytesText(st.HotBytes), rows(st.HotRows), bytesText(st.ArchiveBytes), rows(st.ArchiveRows)); err != nil {
				return err
			}
			for _, r := range st.Runs {
				state := "open"
				if r.FinishedAt != nil {
					state = "finished " + r.FinishedAt.UTC().Format(timeLayout)
				}
				if _, err := fmt.Fprintf(e.stdout, "run %d by %s (%s), started %s, %s: below %d, %s, archived to %d, %d moved in %s\n",
					r.RunID, r.StartedBy, r.Instance, r.StartedAt.UTC().Format(timeLayout), state, r.Before, positionsText(r.From, r.Target, "nothing to move"),
					r.ArchivedTo, r.Moved, countNoun(r.Steps, "step")); err != nil {
					return err
				}
			}
			return nil
		},
	}
	cmd.Flags().IntVar(&runs, "runs", 5, "how many of the last runs to show")
	format = addOutputFlag(cmd, false, outputText, outputJSON)
	return cmd
}

// bytesText renders a size in bytes for people: 1.5 GiB.
func bytesText(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
