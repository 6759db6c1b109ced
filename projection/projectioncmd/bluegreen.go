package projectioncmd

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/spf13/cobra"

	"github.com/annals-dev/annals/projection"
)

// rebuildBlueGreen is rebuild for a projection with a blue/green read model:
// a new generation is replayed beside the live one and cut over.
func (c *commands) rebuildBlueGreen(cmd *cobra.Command, name string, batch int, lockTimeout time.Duration) error {
	p := c.newProgress(cmd.ErrOrStderr())
	cut, err := c.runner.RebuildBlueGreen(cmd.Context(), name, &projection.RebuildOptions{
		BatchSize: batch, LockTimeout: lockTimeout, OnProgress: p.update,
	})
	p.end()
	if err != nil {
		return interrupted(cmd.Context(), name, "the new generation keeps what it committed: rebuild again to continue", err)
	}
	last := p.last
	fmt.Fprintf(cmd.OutOrStdout(), "rebuilt %q blue/green: %d events in %s (%.0f events/s); cut over from generation %d to %d "+
		"at position %d in %s (%d views, %d attempts)\n", name, last.Done, last.Elapsed.Round(time.Millisecond), last.Rate,
		cut.From, cut.To, cut.ToPosition, cut.Duration.Round(10*time.Microsecond), cut.Views, cut.Attempts)
	return nil
}

func (c *commands) rollbackCommand() *cobra.Command {
	var (
		yes  bool
		from int
	)
	cmd := &cobra.Command{
		Use:   "rollback NAME",
		Short: "Point a blue/green read model's views back at its previous generation",
		Long: `Make the generation that the live one of the blue/green projection NAME replaced at its
cut-over live again, in one transaction: the reader views point back at it and it resumes
from where it stopped at the cut-over (the runners of its version catch it up); the
generation that was live is retired, stopped where it is. Needs that generation still kept
(retired, not dropped: see BlueGreen.Retention). Asks for confirmation unless --yes; without
a terminal, --yes is required.

A rollback run again goes one step further back. A script that retries a rollback whose
answer it did not get passes --from with the generation it rolls back from: when that one
is no longer live (the first attempt landed), the retry changes nothing and exits 2.

After g1 -> g2, a rollback to g1 and g3 rebuilt and cut over from g1, it goes back to g1 (what
g3 replaced), never to g2, which was rolled back from. A generation made live again by a
rollback keeps what it replaced, so rolling back again goes further back. 'generations NAME
--output json' shows what each generation replaced ("replaced").

A live generation cut over before the schema recorded what it replaced (migration 0030) has
no "replaced": for it, rollback picks the retired (not dropped) generation with the highest
number below the live one's, whatever retired it, which after the sequence above is g2.
Check 'generations NAME' first, and if it would pick the wrong one, deploy the version you
want and rebuild instead.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ran(cmd)
			name := args[0]
			if !yes {
				in := cmd.InOrStdin()
				if !c.terminal(in) {
					return usage(errors.Wrap(ErrNotConfirmed, "stdin is not a terminal: pass --yes to roll back without confirmation"))
				}
				if err := c.ask(cmd, fmt.Sprintf("Roll %q back to its previous generation? [y/N] ", name)); err != nil {
					return err
				}
			}
			if from < 0 {
				return usage(errors.Newf("--from %d: want a generation number (0: the live one)", from))
			}
			cut, err := projection.RollbackFrom(cmd.Context(), c.pool, c.runner.Schema(), name, from)
			if errors.Is(err, projection.ErrNoGenerations) || errors.Is(err, projection.ErrNoRollback) || errors.Is(err, projection.ErrNotLive) {
				return usage(err)
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "rolled %q back from generation %d (at %d) to generation %d (at %d) in %s\n",
				name, cut.From, cut.FromPosition, cut.To, cut.ToPosition, cut.Duration.Round(10*time.Microsecond))
			return nil
		},
	}
	c.example(cmd, `  {{path}} rollback balances --yes
  {{path}} rollback balances --from 3 --yes   # only if generation 3 is live: safe to retry`)
	cmd.Flags().BoolVarP(&yes, "yes", "y", false, "do not ask for confirmation (required without a terminal)")
	cmd.Flags().IntVar(&from, "from", 0, "roll back only if this generation is live (a retry of a rollback that landed then changes nothing and exits 2); 0: whichever is live")
	return cmd
}

func (c *commands) generationsCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "generations NAME",
		Short: "List the generations of a blue/green read model: version, schema, state, cut-over",
		Long: `List the generations of a blue/green read model: version, state, schema and
subscriber; LIVE SINCE, when it first went live, and LIVE AGAIN, when a rollback last
made it live again; RETIRED AT; the cut-over that made it live (its duration and
position); the generation it replaced; its unresolved dead letters. --output json or
jsonl gives the same fields (live_since, live_again, ...).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if output != "text" && output != "json" && output != "jsonl" {
				return usage(errors.Newf("--output %q: want text, json or jsonl", output))
			}
			ran(cmd)
			gens, err := projection.ListGenerations(cmd.Context(), c.pool, c.runner.Schema(), args[0])
			if err != nil {
				return err
			}
			if len(gens) == 0 {
				// A name that has none: not registered (a mistyped name), or
				// not blue/green, is a usage error like status's and
				// rebuild's; a registered blue/green projection not yet run
				// has an empty list.
				subs, err := c.selected(args[0])
				if err != nil {
					return err
				}
				if !subs[0].BlueGreen {
					return usage(errors.Wrapf(projection.ErrNotBlueGreen, "%q", args[0]))
				}
			}
			out := cmd.OutOrStdout()
			switch output {
			case "json":
				if gens == nil {
					gens = []projection.Generation{}
				}
				return writeJSON(out, gens)
			case "jsonl":
				enc := json.NewEncoder(out)
				for _, g := range gens {
					if err := enc.Encode(g); err != nil {
						return err
					}
				}
				return nil
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "GENERATION\tVERSION\tSTATE\tSCHEMA\tSUBSCRIBER\tLIVE SINCE\tLIVE AGAIN\tRETIRED AT\tCUT-OVER\tREPLACED\tDEAD LETTERS")
			var waits []string
			for _, g := range gens {
				cut := "-"
				if g.CutoverMS != nil {
					cut = fmt.Sprintf("%.1f ms at %d", *g.CutoverMS, *g.CutoverPosition)
				}
				replaced := "-"
				if g.Replaced != nil {
					replaced = strconv.Itoa(*g.Replaced)
				}
				fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\n", g.Generation, g.Version, g.State, g.Schema, g.Subscriber,
					stamp(g.LiveSince), stamp(g.LiveAgain), stamp(g.RetiredAt), cut, replaced, g.Unresolved)
				if g.State == projection.GenerationBuilding && g.Unresolved > 0 {
					waits = append(waits, fmt.Sprintf("generation %d: the cut-over waits for its unresolved dead letters (%d; "+
						"its read model lacks their events): annals dlq list --subscriber '%s', then annals dlq retry "+
						"(re-deliver) or annals dlq skip (do without them)", g.Generation, g.Unresolved, g.Subscriber))
				}
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			for _, w := range waits {
				fmt.Fprintln(out, w)
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "text", "text, json or jsonl")
	return cmd
}

func stamp(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

// generations replaces each blue/green projection by its generations that
// are building or live (their subscribers are <name>#g<N>), so that list and
// status show their checkpoints and leaders.
func (c *commands) generations(ctx context.Context, subs []projection.SubscriberInfo) ([]shown, error) {
	var out []shown
	for _, s := range subs {
		if !s.BlueGreen {
			out = append(out, shown{SubscriberInfo: s, registered: s.Name})
			continue
		}
		gens, err := projection.ListGenerations(ctx, c.pool, c.runner.Schema(), s.Name)
		if err != nil {
			return nil, err
		}
		for _, g := range gens {
			if g.State == projection.GenerationBuilding || g.State == projection.GenerationLive {
				x := shown{SubscriberInfo: s, registered: s.Name, gen: &g}
				x.Name = g.Subscriber
				out = append(out, x)
			}
		}
	}
	return out, nil
}
