package projectioncmd

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/spf13/cobra"

	"github.com/annals-dev/annals/projection"
)

// ErrNotConfirmed is returned by rebuild when the operator does not confirm,
// or cannot be asked (stdin is not a terminal and --yes is missing; that
// error also matches ErrUsage).
var ErrNotConfirmed = errors.New("projectioncmd: rebuild not confirmed")

func (c *commands) rebuildCommand() *cobra.Command {
	var yes bool
	var batch int
	var lockTimeout time.Duration
	var newLayout bool
	cmd := &cobra.Command{
		Use:   "rebuild NAME",
		Short: "Clear a projection's read model and replay the log into it, while the service runs",
		Long: `Clear the read model of the projection NAME and replay every event it reads into it,
from the start of the log to its head, in transactions of --batch-size events, each
committed with the checkpoint. The service's running instances stand by meanwhile and
take over afterwards, processing what was appended during the rebuild.

The projection's checkpoints are set to 0 and its read model reset in one transaction; if
the rebuild is interrupted, a running instance continues the replay from the last
committed batch. Asks for confirmation unless --yes; without a terminal, --yes is required.

A projection whose partition count or key changed (Options.Partitions, PartitionBy) is
refused with its recorded layout, unless --new-layout: the rebuild then records the
registered layout, fencing every instance of the old one (they are refused from then on:
deploy the new one). A blue/green read model takes a new layout with a new
BlueGreen.Version instead.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if batch < 1 || batch > 1_000_000 {
				return usage(errors.Newf("--batch-size %d: want 1..1000000", batch))
			}
			if lockTimeout <= 0 {
				return usage(errors.Newf("--lock-timeout %s: must be positive", lockTimeout))
			}
			ran(cmd)
			subs, err := c.selected(name)
			if err != nil {
				return err
			}
			s := subs[0]
			switch {
			case s.Saga:
				return usage(errors.Wrapf(projection.ErrSaga, "%q is a saga (the commands it appended and the timers it set are in the log): it is never rebuilt", name))
			case s.Observer:
				return usage(errors.Wrapf(projection.ErrObserver, "%q is an observer (its side effects cannot be undone)", name))
			case !s.Rebuildable && !s.BlueGreen:
				return usage(errors.Wrapf(projection.ErrNotResetter, "%q cannot reset its read model (implement projection.Resetter, or call OnReset)", name))
			case s.BlueGreen && newLayout:
				return usage(errors.Newf("%q has a blue/green read model: --new-layout does not apply; blue/green projections change "+
					"layout by raising BlueGreen.Version (a new generation is built with the new layout beside the live one and cut over)", name))
			}
			if !yes && s.BlueGreen {
				if !c.terminal(cmd.InOrStdin()) {
					return usage(errors.Wrap(ErrNotConfirmed, "stdin is not a terminal: pass --yes to rebuild without confirmation"))
				}
				if err := c.ask(cmd, fmt.Sprintf("Rebuild %q blue/green? A new generation is replayed beside the live one, "+
					"then readers are switched to it. [y/N] ", name)); err != nil {
					return err
				}
			} else if !yes {
				if err := c.confirm(cmd, name); err != nil {
					return err
				}
			}
			if s.BlueGreen {
				return c.rebuildBlueGreen(cmd, name, batch, lockTimeout)
			}
			p := c.newProgress(cmd.ErrOrStderr())
			err = c.runner.Rebuild(cmd.Context(), name, &projection.RebuildOptions{
				BatchSize: batch, LockTimeout: lockTimeout, OnProgress: p.update, NewLayout: newLayout,
			})
			p.end()
			if err != nil {
				return interrupted(cmd.Context(), name, "a live instance continues the replay from the last committed batch", err)
			}
			last := p.last
			fmt.Fprintf(cmd.OutOrStdout(), "rebuilt %q: %d events through position %d in %s (%.0f events/s)\n",
				name, last.Done, last.Head, last.Elapsed.Round(time.Millisecond), last.Rate)
			// The replay's failures went to the dead-letter table: a read
			// model rebuilt without them lacks their events, so say so.
			if parts, _, err := c.load(cmd.Context(), []projection.SubscriberInfo{s}, 3*c.runner.HeartbeatInterval()); err == nil && len(parts) == 1 {
				var dl int64
				for _, ps := range parts[0] {
					dl += ps.deadLetters
				}
				if dl > 0 {
					fmt.Fprintf(cmd.OutOrStdout(), "%q has %d unresolved dead letter(s): its read model lacks their events until "+
						"'annals dlq retry' (or 'annals dlq skip'); see 'annals dlq list --subscriber %s'\n", name, dl, name)
				}
			}
			return nil
		},
	}
	c.example(cmd, `  {{path}} rebuild balances
  {{path}} rebuild balances --yes --batch-size 10000
  {{path}} rebuild balances --yes --new-layout   # after changing Partitions`)
	cmd.Flags().BoolVarP(&yes, "yes", "y", false, "do not ask for confirmation (required without a terminal)")
	cmd.Flags().IntVar(&batch, "batch-size", 5000, "events replayed and committed per transaction")
	cmd.Flags().DurationVar(&lockTimeout, "lock-timeout", time.Minute, "how long to wait for the live instances to stand aside")
	cmd.Flags().BoolVar(&newLayout, "new-layout", false, "adopt the registered partition count and key (the old layout's instances are fenced and refused); not for blue/green read models, which raise BlueGreen.Version")
	return cmd
}

// confirm asks on the terminal; without one it refuses.
func (c *commands) confirm(cmd *cobra.Command, name string) error {
	in := cmd.InOrStdin()
	if !c.terminal(in) {
		return usage(errors.Wrap(ErrNotConfirmed, "stdin is not a terminal: pass --yes to rebuild without confirmation"))
	}
	return c.ask(cmd, fmt.Sprintf("Rebuild %q? Its read model is cleared and every event replayed; "+
		"the running instances stand by meanwhile. [y/N] ", name))
}

// ask asks question on stderr and reads the answer from stdin.
func (c *commands) ask(cmd *cobra.Command, question string) error {
	in := cmd.InOrStdin()
	fmt.Fprint(cmd.ErrOrStderr(), question)
	line, err := bufio.NewReader(in).ReadString('\n')
	if err != nil && line == "" {
		return errors.Wrap(ErrNotConfirmed, "no answer")
	}
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return nil
	default:
		return errors.Wrap(ErrNotConfirmed, "not confirmed; nothing changed")
	}
}

// progress renders a rebuild's progress: a bar redrawn in place on a
// terminal, plain lines every interval otherwise.
type progress struct {
	w        io.Writer
	bar      bool
	interval time.Duration
	now      func() time.Time
	lastOut  time.Time
	last     projection.RebuildProgress
	drawn    bool
}

func (c *commands) newProgress(w io.Writer) *progress {
	p := &progress{w: w, bar: c.terminal(w), interval: c.cfg.ProgressInterval, now: time.Now}
	if p.bar {
		p.interval = 100 * time.Millisecond // the bar is drawn at once, then at most this often
	} else {
		p.lastOut = p.now() // the first plain line comes after an interval
	}
	return p
}

func (p *progress) update(r projection.RebuildProgress) {
	waits := r.Waiting != "" && r.Waiting != p.last.Waiting
	p.last = r
	now := p.now()
	if waits {
		// Why a blue/green rebuild does not cut over: at once, on a line of
		// its own.
		if p.bar && p.drawn {
			fmt.Fprintln(p.w)
		}
		p.lastOut, p.drawn = now, false
		fmt.Fprintf(p.w, "rebuild %s: waiting: %s\n", r.Projection, r.Waiting)
		return
	}
	if !r.Finished && now.Sub(p.lastOut) < p.interval {
		return
	}
	p.lastOut, p.drawn = now, true
	if p.bar {
		fmt.Fprintf(p.w, "\r%s", barLine(r, 30))
		if r.Finished {
			fmt.Fprintln(p.w)
		}
		return
	}
	fmt.Fprintln(p.w, plainLine(r))
}

// end finishes a bar left mid-line (the rebuild failed).
func (p *progress) end() {
	if p.bar && p.drawn && !p.last.Finished {
		fmt.Fprintln(p.w)
	}
}

func percent(r projection.RebuildProgress) float64 {
	if r.Total == 0 {
		return 100
	}
	return 100 * float64(r.Done) / float64(r.Total)
}

// plainLine is one progress line for logs.
func plainLine(r projection.RebuildProgress) string {
	s := fmt.Sprintf("rebuild %s: %d/%d events (%.1f%%), %.0f events/s, elapsed %s", r.Projection, r.Done, r.Total,
		percent(r), r.Rate, r.Elapsed.Round(time.Second))
	if r.Finished {
		return s + ", done"
	}
	return s + ", ETA " + r.ETA.Round(time.Second).String()
}

// barLine is the terminal's progress bar, width characters wide.
func barLine(r projection.RebuildProgress, width int) string {
	filled := int(percent(r) / 100 * float64(width))
	filled = min(max(filled, 0), width)
	eta := "ETA " + r.ETA.Round(time.Second).String()
	if r.Finished {
		eta = "done in " + r.Elapsed.Round(100*time.Millisecond).String()
	}
	return fmt.Sprintf("rebuild %s [%s%s] %5.1f%% %d/%d %.0f ev/s %s   ", r.Projection,
		strings.Repeat("#", filled), strings.Repeat(".", width-filled), percent(r), r.Done, r.Total, r.Rate, eta)
}

// interrupted returns err, or, when the command's context has ended (an
// operator's Ctrl-C), an error that says the rebuild of name was
// interrupted and what follows (then), matching the context's error, with
// err kept as its secondary error: the cancelled statement and the lost
// lock it reports are consequences of the interruption, not news.
func interrupted(ctx context.Context, name, then string, err error) error {
	if err == nil || ctx.Err() == nil {
		return err
	}
	return errors.WithSecondaryError(errors.Mark(errors.Newf("rebuild of %q interrupted; %s", name, then), ctx.Err()), err)
}
