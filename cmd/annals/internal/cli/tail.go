package cli

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

func (e *env) tailCommand() *cobra.Command {
	var fromFlag *positionFlag
	var follow bool
	var subscriber, partitionBy, readURL string
	var partitions int
	var format *string
	var types []string
	cmd := &cobra.Command{
		Use:   "tail",
		Short: "Follow the log through the subscription engine",
		Long: `Print events from position --from (default: the beginning) through the head, and with
--follow keep printing new events as they are committed, until interrupted.

With --subscriber NAME, tail is a real observer: it resumes from NAME's checkpoint, stores
its position, and is leader-elected, so two tails with the same name share one position
(the second stands by). Give it a name of its own: the name is recorded as a tail's, and
a name recorded as a projection's, an observer's, a saga's, a processor's or a relay's
(each runner records the kind of its subscribers), or that the database shows to be a
handler's (a read-model setup, saga instances, relay acknowledgements), is refused
(exit 2), since the tail would move that subscriber's checkpoint and the handler would
skip what the tail printed. A projection later started under a tail's name is refused
in turn once the tail moved its checkpoint ('annals checkpoint set NAME 0' for each
partition first lets it start from the beginning). Without --follow,
a tail that stands by says so on stderr when it is not done within 2 s. With --partitions N as well, the subscriber is split into N
partitions (by stream ID, or by --partition-by category or metadata:FIELD) that every tail
running it shares fairly: two tails lead N/2 each, and when one stops or dies the other
takes its partitions over within tens of milliseconds; each key's events are printed in
order. A subscriber keeps its partition count and key once it has processed events
(another would skip or repeat events): tail refuses another with exit code 2. --read-url reads the
events from a streaming replica (a hot standby) while locks and checkpoints stay on the
primary; a lagging replica delays what is printed, it
never skips. --types filters by event-type globs (order.*, *.shipped; '*' is
one or more whole segments). --output jsonl prints one JSON object per event, flushed at
once, with the keys of 'annals read'; --output json prints them as one JSON array, and
only without --follow (a followed tail has no end at which to close the array). With
--follow the text table prints each row as it comes, in columns of fixed widths (a
column widens, for the rows after it, when a value does not fit). As in 'annals read',
the personal fields of forgotten subjects read as [forgotten].`,
		Example: `  annals tail --follow --output jsonl | jq .
  annals tail --follow --subscriber audit-log --types 'order.*,payment.*'
  annals tail --follow --subscriber audit-log --partitions 8 --output jsonl`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			from := fromFlag.v
			if from < 0 {
				return usagef("--from must not be negative")
			}
			if follow && *format == outputJSON {
				return usagef("--output json needs an end to close its array, which a followed tail has not: use --output jsonl with --follow")
			}
			if subscriber != "" && cmd.Flags().Changed("from") {
				return usagef("--from cannot be combined with --subscriber: the checkpoint decides where a subscriber starts (see 'annals checkpoint set')")
			}
			if cmd.Flags().Changed("subscriber") && strings.TrimSpace(subscriber) == "" {
				return usagef("--subscriber must not be empty")
			}
			if (cmd.Flags().Changed("partitions") || cmd.Flags().Changed("partition-by")) && subscriber == "" {
				return usagef("--partitions and --partition-by need --subscriber")
			}
			if partitions < 1 || partitions > 1024 {
				return usagef("--partitions must be between 1 and 1024")
			}
			if err := catchup.ParsePartitionBy(partitionBy); err != nil {
				return usageError{err}
			}
			filter, err := catchup.ParseFilter(types)
			if err != nil {
				return usageError{err}
			}
			pool, err := e.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			var readPool *pgxpool.Pool
			if readURL != "" {
				if readPool, err = e.openURL(cmd.Context(), readURL, true); err != nil {
					return errors.Wrap(err, "--read-url")
				}
				defer readPool.Close()
			}
			// The store's registry reads events as 'annals read' does:
			// the personal fields of forgotten subjects as [forgotten].
			store, err := eventstore.New(pool, &eventstore.Config{Schema: e.schema})
			if err != nil {
				return err
			}
			reg := store.Registry()
			w := newEventWriter(e.stdout, *format, follow)
			ctx, cancel := context.WithCancel(cmd.Context())
			defer cancel()
			// A failed write (a closed pipe), or an event that cannot be
			// read (as it would end 'annals read'), ends the tail instead
			// of being retried.
			var mu sync.Mutex
			var writeErr error
			print := func(ev eventstore.Event) error {
				mu.Lock()
				defer mu.Unlock()
				ev, err := reg.Upcast(ev)
				if err == nil {
					if err = w.write(ev); err == nil && follow {
						err = w.flush()
					}
					err = errors.Wrap(err, "tail: write")
				}
				if err != nil && writeErr == nil {
					writeErr = err
					cancel()
				}
				return err
			}
			finish := func(err error) error {
				mu.Lock()
				defer mu.Unlock()
				if writeErr == nil {
					writeErr = err
				}
				if writeErr != nil {
					// The events read before it are printed (the table
					// and the JSON array are written at the end); after
					// a failed write this fails too, and is ignored.
					_ = w.finish()
					return writeErr
				}
				return w.finish()
			}
			if subscriber != "" {
				if err := refuseOwnedSubscriber(ctx, pool, e.schema, subscriber); err != nil {
					return err
				}
				r, err := projection.NewRunner(pool, &projection.Config{Schema: e.schema, ReadPool: readPool})
				if err != nil {
					return err
				}
				opts := &projection.Options{Types: types, Partitions: partitions, PartitionBy: partitionBy}
				if err := r.Register(&tailObserver{name: subscriber, print: print}, opts); err != nil {
					return usageError{err}
				}
				if follow {
					err = r.Run(ctx)
				} else {
					// RunUntilCaughtUp stands by without a word while
					// another process leads the subscriber: say so when it
					// takes a while, as relay --once does.
					caught, noted := make(chan struct{}), make(chan struct{})
					go func() {
						defer close(noted)
						select {
						case <-caught:
						case <-time.After(tailWaitNote):
							fmt.Fprintf(e.stderr, "annals: tail --subscriber %q: not done yet: printing a backlog, or waiting for the subscriber's lock, "+
								"which another process leading this subscriber holds while it runs (annals status shows its leader)\n", subscriber)
						}
					}()
					err = r.RunUntilCaughtUp(ctx)
					close(caught)
					<-noted
				}
				if errors.Is(err, projection.ErrSubscriberKind) {
					// The name is recorded as a handler's: refused before
					// anything was claimed or printed.
					return tailKindRefused(subscriber, err)
				}
				if errors.Is(err, catchup.ErrPartitionLayout) {
					// Another partition count or key than the subscriber's
					// checkpoints were written under: refused before
					// anything was claimed or printed.
					return usageError{err}
				}
				return finish(err)
			}
			listener, err := catchup.NewPoolListener(pool, e.schema, nil)
			if err != nil {
				return err
			}
			engine, err := catchup.NewEngine(pool, listener, &catchup.Config{Schema: e.schema, ReadPool: readPool})
			if err != nil {
				return err
			}
			sub := &catchup.Subscription{
				Name: "annals-tail", Filter: filter, Ephemeral: true,
				StartAfter: max(from-1, 0), Processor: &tailProcessor{print: print},
			}
			if !follow {
				head, err := engine.Head(ctx)
				if err != nil {
					return err
				}
				return finish(engine.CatchUp(ctx, sub, head))
			}
			go func() { _ = listener.Run(ctx) }()
			return finish(engine.Run(ctx, sub))
		},
	}
	fromFlag = addPositionFlag(cmd, "from", "first position to print (without --subscriber)")
	cmd.Flags().BoolVar(&follow, "follow", false, "keep following new events until interrupted")
	cmd.Flags().StringVar(&subscriber, "subscriber", "", "run as a checkpointed, leader-elected observer with this name")
	cmd.Flags().StringSliceVar(&types, "types", nil, "event-type globs, comma-separated (default: all)")
	cmd.Flags().IntVar(&partitions, "partitions", 1, "with --subscriber: split it into this many partitions, shared by every tail running it")
	cmd.Flags().StringVar(&partitionBy, "partition-by", "", "with --partitions: stream (default), category, or metadata:FIELD")
	cmd.Flags().StringVar(&readURL, "read-url", "", "read the events from this streaming replica (locks and checkpoints stay on the primary)")
	format = addOutputFlag(cmd, true, outputText, outputJSON, outputJSONL)
	return cmd
}

// tailObserver prints events as a named observer.
type tailObserver struct {
	name  string
	print func(eventstore.Event) error
}

func (o *tailObserver) Name() string { return o.name }

// SubscriberKind makes the runner record the subscriber as a tail's, and
// refuse it under a name recorded as a handler's (projection.KindTail).
func (o *tailObserver) SubscriberKind() string { return projection.KindTail }

func (o *tailObserver) Handle(_ context.Context, ev eventstore.Event) error { return o.print(ev) }

// tailProcessor prints the batches of an ephemeral subscription.
type tailProcessor struct {
	print func(eventstore.Event) error
}

func (p *tailProcessor) Start(context.Context, *catchup.Lease) error { return nil }
func (p *tailProcessor) Idle(context.Context, *catchup.Lease) error  { return nil }
func (p *tailProcessor) End(context.Context, *catchup.Lease) error   { return nil }

// Redeliver is never called: an ephemeral subscription has no dead letters.
func (p *tailProcessor) Redeliver(context.Context, *catchup.Lease) error { return nil }

func (p *tailProcessor) Process(_ context.Context, _ *catchup.Lease, b catchup.Batch) (int64, error) {
	done := b.After
	for _, ev := range b.Events {
		if err := p.print(ev); err != nil {
			return done, err
		}
		done = ev.GlobalSequence
	}
	return b.Through, nil
}
