package cli

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/annals-dev/annals/checkpoint"
)

func (e *env) checkpointCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "checkpoint",
		Short: "Show or move a subscriber's checkpoint",
		Long: `A checkpoint is the position of the last event a subscriber partition has processed.
'get' shows it; 'set' moves it, which makes the subscriber process events again (moving
back) or skip them (moving forward). See 'annals status' for every subscriber.`,
		Annotations: map[string]string{groupAnnotation: ""},
		RunE: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usagef("want a subcommand: get or set")
			}
			return usagef("unknown subcommand %q: want get or set", args[0])
		},
	}
	cmd.AddCommand(e.checkpointGetCommand(), e.checkpointSetCommand())
	return cmd
}

func (e *env) checkpointGetCommand() *cobra.Command {
	var partition int
	var format *string
	cmd := &cobra.Command{
		Use:   "get SUBSCRIBER",
		Short: "Print a subscriber's checkpoints (every partition's, or one's) with position and epoch",
		Long: `Print the checkpoints of SUBSCRIBER, one line per partition (a partitioned subscriber
has one per partition; an unpartitioned one only partition 0), or with --partition N
only that partition's: its position, fencing epoch, owner and when it last changed. An
unknown subscriber (or, with --partition, partition) exits 3 (not found).

--output json writes one object: {"subscriber", "partition", "position", "epoch",
"owner", "updated_at", "partitions"}: the first fields are the checkpoint of
--partition, or without it of the lowest partition (0); without --partition,
"partitions" lists every partition's checkpoint, ordered by partition, each an object
of the same first six fields (with --partition it is absent). owner is null when none.`,
		Example: `  annals checkpoint get ticks                 # every partition of ticks
  annals checkpoint get ticks --partition 3   # only ticks/3`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sub := args[0]
			if err := validSubscriber(sub, partition); err != nil {
				return err
			}
			store, err := checkpoint.New(e.schema)
			if err != nil {
				return err
			}
			pool, err := e.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			one := cmd.Flags().Changed("partition")
			var cps []checkpoint.Checkpoint
			if one {
				c, err := store.Load(cmd.Context(), pool, sub, partition)
				if errors.Is(err, checkpoint.ErrNotFound) {
					return unknownSubscriber(sub, partition)
				}
				if err != nil {
					return err
				}
				c.Subscriber, c.Partition = sub, partition
				cps = append(cps, c)
			} else {
				all, err := store.List(cmd.Context(), pool)
				if err != nil {
					return err
				}
				for _, c := range all {
					if c.Subscriber == sub {
						cps = append(cps, c)
					}
				}
				if len(cps) == 0 {
					return notFoundf("unknown subscriber %s: it has no checkpoint (see 'annals status')", sub)
				}
			}
			if *format == outputJSON {
				out := checkpointJSON(cps[0])
				if !one {
					out.Partitions = make([]CheckpointJSON, len(cps))
					for i, c := range cps {
						out.Partitions[i] = checkpointJSON(c)
					}
				}
				return writeJSON(e.stdout, out)
			}
			var b strings.Builder
			for _, c := range cps {
				owner := c.Owner
				if owner == "" {
					owner = "none"
				}
				fmt.Fprintf(&b, "%s/%d: position %d, epoch %d (owner %s, updated %s)\n",
					sub, c.Partition, c.Position, c.Epoch, owner, c.UpdatedAt.UTC().Format(timeLayout))
			}
			_, err = io.WriteString(e.stdout, b.String())
			return err
		},
	}
	cmd.Flags().IntVar(&partition, "partition", 0, "only this partition (default: every partition)")
	format = addOutputFlag(cmd, false, outputText, outputJSON)
	return cmd
}

// CheckpointJSON is the output of `annals checkpoint get --output json`.
type CheckpointJSON struct {
	Subscriber string `json:"subscriber"`
	Partition  int    `json:"partition"`
	Position   int64  `json:"position"`
	Epoch      int64  `json:"epoch"`
	// Owner is the instance that claimed Epoch (null after an operator's set).
	Owner     *string   `json:"owner"`
	UpdatedAt time.Time `json:"updated_at"`
	// Partitions is every partition's checkpoint, ordered by partition,
	// when no --partition was given (absent otherwise, and in its elements).
	Partitions []CheckpointJSON `json:"partitions,omitempty"`
}

// checkpointJSON is c as CheckpointJSON (without Partitions).
func checkpointJSON(c checkpoint.Checkpoint) CheckpointJSON {
	out := CheckpointJSON{Subscriber: c.Subscriber, Partition: c.Partition, Position: c.Position,
		Epoch: c.Epoch, UpdatedAt: c.UpdatedAt.UTC()}
	if c.Owner != "" {
		owner := c.Owner
		out.Owner = &owner
	}
	return out
}

func (e *env) checkpointSetCommand() *cobra.Command {
	var partition int
	var yes, create bool
	var format *string
	cmd := &cobra.Command{
		Use:   "set SUBSCRIBER POSITION",
		Short: "Move a subscriber partition's checkpoint (re-deliver or skip events)",
		Long: `Move the checkpoint of SUBSCRIBER (partition --partition) to POSITION: the subscriber
then processes the events after POSITION, again if it had processed them (moving back),
and never those it skips (moving forward). POSITION is an integer from 0 (replay the
whole log) to the head of the log. The fencing epoch is bumped, so a running leader stops
and re-reads from POSITION instead of overwriting it. Moving back settles the partition's
dead letters after POSITION as resolved, since their events are delivered again (one that
fails again is open again).

set moves the checkpoint alone: it does not clear a projection's read model, so a
projection moved back applies the events again to its tables as they are (a sum counts
them twice) unless its handlers are idempotent. Empty its tables first (with its
runners stopped), or rebuild it instead: the service's own 'projections rebuild NAME'
(package projectioncmd; Runner.Rebuild in Go) resets the read model and moves the
checkpoint in one transaction. The annals command has no rebuild: it does not have the
projection's code.

This is deliberate: on a terminal, set asks for confirmation; otherwise pass --yes.
An unknown subscriber exits 3 (not found) unless --create makes its checkpoint (to
start a new subscriber somewhere other than the beginning).`,
		Example: `  annals checkpoint set orders-view 0 --yes        # process everything again; its read model is not
                                                   # cleared: empty its tables first, or instead run
                                                   # 'myservice projections rebuild orders-view'
  annals checkpoint set mailer 1234 --partition 3`,
		Args: cobra.ExactArgs(2),
		// "-1" reaches the flag parser first, as shorthand flags.
		Annotations: map[string]string{negativeArgAnnotation: negativePosition},
		RunE: func(cmd *cobra.Command, args []string) error {
			sub := args[0]
			if err := validSubscriber(sub, partition); err != nil {
				return err
			}
			position, err := strconv.ParseInt(args[1], 10, 64)
			if err == nil && position < 0 {
				return usagef(negativePositionGiven, args[1])
			}
			if err != nil {
				return usagef("POSITION %q: want a non-negative integer", args[1])
			}
			store, err := checkpoint.New(e.schema)
			if err != nil {
				return err
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

			// Check and ask without holding any lock: a human may take a while.
			old, err := store.Load(ctx, pool, sub, partition)
			exists := err == nil
			if errors.Is(err, checkpoint.ErrNotFound) {
				if !create {
					return notFoundf("unknown subscriber %s/%d: it has no checkpoint (see 'annals status', or pass --create to make one)", sub, partition)
				}
				// A partition its recorded layout does not have would never
				// be led, and would show as lagging for ever.
				var parts int
				err := pool.QueryRow(ctx, q["SubscriberLayout"], sub).Scan(&parts)
				if err != nil && !errors.Is(err, pgx.ErrNoRows) {
					return errors.Wrap(err, "read the subscriber's partition layout")
				}
				if err == nil && partition >= parts {
					return usagef("subscriber %s runs with %s (0-%d): no checkpoint for partition %d", sub, countNoun(parts, "partition"), parts-1, partition)
				}
			} else if err != nil {
				return err
			}
			if err := checkHead(ctx, pool, q, position); err != nil {
				return err
			}
			effect := moveEffect(sub, partition, old.Position, position, exists)
			if !yes {
				if err := e.confirmed(effect, "the checkpoint is unchanged"); err != nil {
					return err
				}
			}

			var before, after checkpoint.Checkpoint
			var settled int64
			target := fmt.Sprintf("%s/%d", sub, partition)
			err = e.audited(ctx, pool, "checkpoint.set", func(tx pgx.Tx) (string, any, error) {
				before, settled = checkpoint.Checkpoint{}, 0
				// Move locks the row, moves it and, moving back, settles the
				// partition's dead letters after the new position.
				m, err := store.Move(ctx, tx, sub, partition, position)
				switch {
				case errors.Is(err, checkpoint.ErrNotFound) && !create:
					return "", nil, unknownSubscriber(sub, partition) // deleted meanwhile
				case errors.Is(err, checkpoint.ErrNotFound):
					exists = false
					if after, err = store.Set(ctx, tx, sub, partition, position); err != nil {
						return "", nil, err
					}
				case err != nil:
					return "", nil, err
				default:
					exists, before, after, settled = true, m.Before, m.After, m.DeadLettersSettled
				}
				return target, map[string]any{"from": before.Position, "to": after.Position, "epoch_from": before.Epoch,
					"epoch_to": after.Epoch, "created": !exists, "dead_letters_settled": settled}, nil
			})
			if err != nil {
				return err
			}
			if *format == outputJSON {
				out := CheckpointSetJSON{Subscriber: sub, Partition: partition, Created: !exists, Position: after.Position, Epoch: after.Epoch,
					DeadLettersSettled: settled}
				if exists {
					out.PreviousPosition, out.PreviousEpoch = &before.Position, &before.Epoch
				}
				return writeJSON(e.stdout, out)
			}
			if !exists {
				_, err = fmt.Fprintf(e.stdout, "%s/%d: created at position %d, epoch %d\n", sub, partition, after.Position, after.Epoch)
				return err
			}
			_, err = fmt.Fprintf(e.stdout, "%s/%d: position %d → %d, epoch %d → %d\n",
				sub, partition, before.Position, after.Position, before.Epoch, after.Epoch)
			if err == nil && settled > 0 {
				_, err = fmt.Fprintf(e.stdout, "%s after position %d settled as resolved: their events are delivered again (one that fails again is open again)\n",
					countNoun(settled, "dead letter"), after.Position)
			}
			return err
		},
	}
	cmd.Flags().IntVar(&partition, "partition", 0, "partition number (0 for an unpartitioned subscriber)")
	cmd.Flags().BoolVar(&yes, "yes", false, "do not ask for confirmation")
	cmd.Flags().BoolVar(&create, "create", false, "create the checkpoint if the subscriber partition has none")
	format = addOutputFlag(cmd, false, outputText, outputJSON)
	return cmd
}

// CheckpointSetJSON is what `annals checkpoint set --output json` prints:
// the checkpoint after the move, and before it (absent when it was created).
type CheckpointSetJSON struct {
	Subscriber       string `json:"subscriber"`
	Partition        int    `json:"partition"`
	Created          bool   `json:"created"`
	Position         int64  `json:"position"`
	Epoch            int64  `json:"epoch"`
	PreviousPosition *int64 `json:"previous_position,omitempty"`
	PreviousEpoch    *int64 `json:"previous_epoch,omitempty"`
	// DeadLettersSettled counts the dead letters after the new position
	// settled as resolved by a checkpoint set back (their events are
	// delivered again).
	DeadLettersSettled int64 `json:"dead_letters_settled"`
}

// negativePosition is the message for a negative POSITION of checkpoint set
// that the flag parser caught (no '--' before it), negativePositionGiven for
// one that reached the command (after '--').
const (
	negativePosition      = "POSITION %s: a position must not be negative (0 is before the first event; no '--' is needed before a position)"
	negativePositionGiven = "POSITION %s: a position must not be negative (0 is before the first event)"
)

func validSubscriber(sub string, partition int) error {
	if sub == "" {
		return usagef("SUBSCRIBER must not be empty")
	}
	if partition < 0 {
		return usagef("--partition %d: want 0 or more", partition)
	}
	return nil
}

func unknownSubscriber(sub string, partition int) error {
	return notFoundf("unknown subscriber %s/%d: it has no checkpoint (see 'annals status')", sub, partition)
}

// checkHead refuses a position beyond the last event of the log.
func checkHead(ctx context.Context, pool *pgxpool.Pool, q map[string]string, position int64) error {
	var head int64
	var now any
	if err := pool.QueryRow(ctx, q["Head"]).Scan(&head, &now); err != nil {
		return errors.Wrap(err, "read the head of the log")
	}
	if position > head {
		return usagef("POSITION %d is beyond the head of the log (%d)", position, head)
	}
	return nil
}

// moveEffect says what moving the checkpoint from old to position does.
func moveEffect(sub string, partition int, old, position int64, exists bool) string {
	switch {
	case !exists:
		return fmt.Sprintf("create the checkpoint of %s/%d at position %d (it will start after it)", sub, partition, position)
	case position < old:
		return fmt.Sprintf("move %s/%d back from %d to %d (events at positions %d..%d will be processed again)",
			sub, partition, old, position, position+1, old)
	case position > old:
		return fmt.Sprintf("move %s/%d forward from %d to %d (events at positions %d..%d will be skipped)",
			sub, partition, old, position, old+1, position)
	}
	return fmt.Sprintf("set %s/%d to %d, where it is (its leader is fenced off and restarts from there)", sub, partition, position)
}

// isTerminal reports whether r is an interactive terminal: a character
// device other than the null device. (golang.org/x/term would ask the
// terminal driver; this avoids the dependency and errs on the safe side: a
// pipe, a file or /dev/null is never a terminal.) A reader with an
// IsTerminal method answers for itself, which lets tests stand in for one.
func isTerminal(r io.Reader) bool {
	if t, ok := r.(interface{ IsTerminal() bool }); ok {
		return t.IsTerminal()
	}
	f, ok := r.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	if err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		return false
	}
	if null, err := os.Stat(os.DevNull); err == nil && os.SameFile(fi, null) {
		return false
	}
	return true
}

// confirmed asks "About to <effect>. Continue?" on a terminal, and refuses
// with a usage error when stdin is not one (naming --yes, which skips the
// question): the irreversible commands' guard. It returns an error saying
// what was left unchanged (unchanged) when the answer is no.
func (e *env) confirmed(effect, unchanged string) error {
	if !isTerminal(e.stdin) {
		return usagef("stdin is not a terminal: pass --yes to %s", effect)
	}
	ok, err := confirm(e.stdin, e.stderr, "About to "+effect+". Continue?")
	if err != nil {
		return err
	}
	if !ok {
		return errors.New("not confirmed: " + unchanged)
	}
	return nil
}

// confirm asks question on w and reads a y/N answer from r; anything but
// y or yes (any case) is no.
func confirm(r io.Reader, w io.Writer, question string) (bool, error) {
	fmt.Fprintf(w, "%s [y/N] ", question)
	line, err := bufio.NewReader(r).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return false, errors.Wrap(err, "read the answer")
	}
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return true, nil
	}
	return false, nil
}
