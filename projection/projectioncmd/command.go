package projectioncmd

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/internal/errmark"
	"github.com/annals-dev/annals/internal/leadership"
	"github.com/annals-dev/annals/internal/lockkey"
	"github.com/annals-dev/annals/internal/sqltmpl"
	"github.com/annals-dev/annals/projection"
)

//go:embed queries.sql
var queriesSQL string

// ErrUsage marks every error that is a mistake in the command line rather
// than a failure: a bad or unknown flag or flag value, a missing or extra
// argument, a mistyped subcommand, a NAME that is not registered (or, for
// rebuild, is an observer or cannot reset its read model), and rebuild
// without --yes when stdin is not a terminal. Nothing has changed when it is
// returned. Match it with errors.Is (the original error, such as
// projection.ErrUnknownProjection or ErrNotConfirmed, still matches too) to
// exit with a usage status, as the annals CLI does with 2:
//
//	if err := root.ExecuteContext(ctx); errors.Is(err, projectioncmd.ErrUsage) {
//		os.Exit(2)
//	} else if err != nil {
//		os.Exit(1)
//	}
var ErrUsage = errors.New("projectioncmd: usage error")

// usage marks err as a usage mistake (ErrUsage), keeping its message.
func usage(err error) error {
	if err == nil {
		return nil
	}
	return errmark.Mark(err, ErrUsage)
}

// markUsage makes cmd's and its subcommands' argument-count errors (and, via
// cmd's flag error function, their flag errors) usage errors.
func markUsage(cmd *cobra.Command) {
	if check := cmd.Args; check != nil {
		cmd.Args = func(cmd *cobra.Command, args []string) error { return usage(check(cmd, args)) }
	}
	for _, c := range cmd.Commands() {
		markUsage(c)
	}
}

// ran marks cmd as past its command line: an error from here on is a
// failure, not a mistake in the arguments, and cobra prints it without the
// usage text, which would bury it. (cobra looks only at the executed
// command and the root, which the service owns, so the tree cannot set it
// once for all.) Each RunE calls it once it has checked its flags and
// arguments.
func ran(cmd *cobra.Command) { cmd.SilenceUsage = true }

// Config configures the command tree. A nil *Config means defaults.
type Config struct {
	// Use is the name of the parent command. Defaults to "projections".
	Use string
	// ProgressInterval is how often a rebuild prints a progress line when
	// stderr is not a terminal. Defaults to 2s.
	ProgressInterval time.Duration
	// Open, when New was given a nil runner or pool, gives them to the
	// command that runs, once, before it runs (never for help or a mistake
	// in the command line). It lets a service mount the tree before it has
	// parsed its own flags and built its client from them:
	//
	//	projectioncmd.New(nil, nil, &projectioncmd.Config{
	//		Open: func(ctx context.Context) (*projection.Runner, *pgxpool.Pool, error) {
	//			svc, err := newService(ctx, flags) // registers the projections
	//			if err != nil {
	//				return nil, nil, err
	//			}
	//			return svc.client.Runner(), svc.pool, nil
	//		},
	//	})
	//
	// Defaults to none: a command of a tree without a runner or pool fails
	// with ErrNoRunner.
	Open func(ctx context.Context) (*projection.Runner, *pgxpool.Pool, error)
}

// ErrNoRunner is the error of a command of a tree that has no runner or no
// pool: New was given nil and Config.Open is not set (or returned nil).
var ErrNoRunner = errors.New("projectioncmd: no runner or pool to run the command on")

// commands is what the subcommands share.
type commands struct {
	runner *projection.Runner
	pool   *pgxpool.Pool
	cfg    Config
	// terminal reports whether a stream (the command's stdin or stderr) is
	// an interactive terminal; tests replace it.
	terminal func(stream any) bool
	// examples are the subcommands' examples, with examplePath for the
	// projections command's path.
	examples map[*cobra.Command]string
}

// examplePath stands, in an example, for the path of the projections
// command as the operator types it ("myservice projections"), known only
// once the service has mounted the tree.
const examplePath = "{{path}}"

// example sets cmd's example, text with examplePath, to be completed when
// help or usage shows it (see showExamples). Until then it reads as if the
// projections command were the root.
func (c *commands) example(cmd *cobra.Command, text string) {
	c.examples[cmd] = text
	cmd.Example = strings.ReplaceAll(text, examplePath, c.cfg.Use)
}

// showExamples makes the help and usage of tree's commands put the path of
// tree (under the service's root) into their examples before showing
// them, as the help and usage functions above tree (the service's, or
// cobra's) then do.
func (c *commands) showExamples(tree *cobra.Command) {
	fill := func(cmd *cobra.Command) {
		if text, ok := c.examples[cmd]; ok {
			cmd.Example = strings.ReplaceAll(text, examplePath, tree.CommandPath())
		}
	}
	above := func() *cobra.Command {
		if p := tree.Parent(); p != nil {
			return p
		}
		return &cobra.Command{} // cobra's own functions
	}
	tree.SetHelpFunc(func(cmd *cobra.Command, args []string) {
		fill(cmd)
		above().HelpFunc()(cmd, args)
	})
	tree.SetUsageFunc(func(cmd *cobra.Command) error {
		fill(cmd)
		return above().UsageFunc()(cmd)
	})
}

// New returns the command tree for runner: "projections" with the
// subcommands list, status and rebuild. pool must reach the runner's
// database (the runner's own pool is the natural choice); the schema is the
// runner's.
func New(runner *projection.Runner, pool *pgxpool.Pool, cfg *Config) *cobra.Command {
	return newCommands(runner, pool, cfg).root()
}

func newCommands(runner *projection.Runner, pool *pgxpool.Pool, cfg *Config) *commands {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.Use == "" {
		c.Use = "projections"
	}
	if c.ProgressInterval <= 0 {
		c.ProgressInterval = 2 * time.Second
	}
	return &commands{runner: runner, pool: pool, cfg: c, terminal: isTerminal, examples: map[*cobra.Command]string{}}
}

// open makes sure the commands have a runner and a pool: New's, or
// Config.Open's, called once.
func (c *commands) open(ctx context.Context) error {
	if c.runner != nil && c.pool != nil {
		return nil
	}
	if c.cfg.Open == nil {
		return errmark.Mark(errors.New("projectioncmd: no runner or pool to run the command on: mount the tree with "+
			"the service's (projectioncmd.New(client.Runner(), pool, nil)), or set Config.Open"), ErrNoRunner)
	}
	runner, pool, err := c.cfg.Open(ctx)
	if err != nil {
		return err
	}
	if runner == nil || pool == nil {
		return errors.Wrap(ErrNoRunner, "projectioncmd: Config.Open returned a nil runner or pool")
	}
	c.runner, c.pool = runner, pool
	return nil
}

// isTerminal reports whether stream is a file descriptor of a terminal.
func isTerminal(stream any) bool {
	f, ok := stream.(interface{ Fd() uintptr })
	return ok && term.IsTerminal(int(f.Fd()))
}

func (c *commands) root() *cobra.Command {
	cmd := &cobra.Command{
		Use:   c.cfg.Use,
		Short: "List, inspect and rebuild this service's projections",
		Long: `List, inspect and rebuild the projections and observers this service registers.

A partition's leader is decided as 'annals status' decides it: its advisory lock has the
last word ("none" while it is free, even while the heartbeat of an instance killed a
moment ago still lists the partition); while a session holds it, the live instance whose
heartbeat lists the partition leads, unless another has claimed the checkpoint since,
else the checkpoint's owner ("rebuild:…" while a rebuild leads it; "unknown (pid N)" for
a session nothing names). Lag is the head of the log
minus the checkpoint, in positions: an upper bound on the events still to process.`,
		// An unknown subcommand is an error, not help; like every other
		// mistake in the command line it is followed by the usage. Errors
		// while a command runs are not (see ran).
		Args:          cobra.NoArgs,
		SilenceErrors: false,
		// Without a run function cobra would print help for any arguments
		// and exit 0, also for a mistyped subcommand.
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(c.listCommand(), c.statusCommand(), c.rebuildCommand())
	cmd.AddCommand(c.rollbackCommand(), c.generationsCommand())
	// Every subcommand needs the runner and the pool: get them (Open)
	// before it runs, or fail with ErrNoRunner rather than dereference nil.
	for _, sub := range cmd.Commands() {
		if run := sub.RunE; run != nil {
			sub.RunE = func(cmd *cobra.Command, args []string) error {
				if err := c.open(cmd.Context()); err != nil {
					ran(cmd)
					return err
				}
				return run(cmd, args)
			}
		}
	}
	// Flag errors of the subcommands too: cobra asks the nearest ancestor
	// with a flag error function.
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usage(err) })
	markUsage(cmd)
	c.showExamples(cmd)
	return cmd
}

// partitionState is one subscriber partition as list and status show it.
type partitionState struct {
	partition    int
	exists       bool // a checkpoint row exists
	position     int64
	epoch        int64
	owner        string
	stopped      string
	updated      time.Time
	deadLetters  int64
	lockHeld     bool
	lockPID      int32
	hbLeader     string // the live instance whose heartbeat lists it ("": none)
	hbEpoch      *int64 // the epoch it lists (nil: unknown)
	head         int64
	subscriberOf projection.SubscriberInfo
}

func (p partitionState) lag() int64 { return max(p.head-p.position, 0) }

// leader is who leads the partition, by the rule `annals status` and the
// console apply (package internal/leadership): "none" while its lock is
// free, whatever a heartbeat still lists; while it is held, the live
// instance whose heartbeat lists it, unless another has claimed the
// checkpoint since, else the checkpoint's owner; "unknown (pid N)" for a
// session nothing names.
func (p partitionState) leader() string {
	if !p.lockHeld {
		return "none"
	}
	l, _ := leadership.Leader(leadership.Facts{Epoch: p.epoch, Owner: p.owner, LockHeld: true,
		HeartbeatLeader: p.hbLeader, HeartbeatEpoch: p.hbEpoch})
	if l == "" {
		return fmt.Sprintf("unknown (pid %d)", p.lockPID)
	}
	return l
}

// staleAfterFlag adds --stale-after to cmd, into d: the heartbeat age past
// which an instance is no live heartbeat leader. Zero (the default) means
// three heartbeats of the runner (projection.Config.HeartbeatInterval),
// which at its default of 10 s is annals status's default --stale-after.
func staleAfterFlag(cmd *cobra.Command, d *time.Duration) {
	cmd.Flags().DurationVar(d, "stale-after", 0,
		"an instance whose last heartbeat is older than this leads nothing by its heartbeat (default 3 heartbeats of this runner)")
}

// staleAfter returns the heartbeat age past which an instance is stale:
// flag, or three heartbeats of the runner when flag is zero. A negative
// flag is a usage error.
func (c *commands) staleAfter(flag time.Duration) (time.Duration, error) {
	switch {
	case flag < 0:
		return 0, usage(errors.Newf("--stale-after %s: want a positive duration", flag))
	case flag == 0:
		return 3 * c.runner.HeartbeatInterval(), nil
	}
	return flag, nil
}

// load reads the state of every partition of the subscribers; an instance
// whose heartbeat is older than staleAfter leads nothing by it.
func (c *commands) load(ctx context.Context, subs []projection.SubscriberInfo, staleAfter time.Duration) ([][]partitionState, int64, error) {
	schema := c.runner.Schema()
	q, err := sqltmpl.Named("queries.sql", queriesSQL, sqltmpl.NewData(schema))
	if err != nil {
		return nil, 0, err
	}
	var head int64
	if err := c.pool.QueryRow(ctx, q["Head"]).Scan(&head); err != nil {
		return nil, 0, errors.Wrapf(err, "read the head of the log (is schema %q migrated?)", schema)
	}
	out := make([][]partitionState, len(subs))
	for i, s := range subs {
		parts := make([]partitionState, s.Partitions)
		for p := range parts {
			parts[p] = partitionState{partition: p, head: head, subscriberOf: s}
		}
		rows, err := c.pool.Query(ctx, q["Checkpoints"], s.Name, staleAfter.Microseconds())
		if err != nil {
			return nil, 0, errors.Wrapf(err, "read the checkpoints of %q", s.Name)
		}
		var st partitionState
		_, err = pgx.ForEachRow(rows, []any{&st.partition, &st.position, &st.epoch, &st.owner, &st.stopped, &st.updated,
			&st.deadLetters, &st.hbLeader, &st.hbEpoch}, func() error {
			if st.partition >= 0 && st.partition < len(parts) {
				st.exists, st.head, st.subscriberOf = true, head, s
				parts[st.partition] = st
			}
			st.hbEpoch = nil // the pointer must not be shared
			return nil
		})
		if err != nil {
			return nil, 0, errors.Wrapf(err, "read the checkpoints of %q", s.Name)
		}
		k1, k2 := make([]int32, len(parts)), make([]int32, len(parts))
		for p := range parts {
			k1[p], k2[p] = lockkey.Pair(catchup.LockKey(schema, s.Name, p))
		}
		locks, err := leadership.LockStates(ctx, c.pool, k1, k2)
		if err != nil {
			return nil, 0, errors.Wrapf(err, "read the partition locks of %q", s.Name)
		}
		for p, l := range locks {
			parts[p].lockPID, parts[p].lockHeld = l.PID, l.Held
		}
		out[i] = parts
	}
	return out, head, nil
}

// selected returns the registered subscribers, or only name.
func (c *commands) selected(name string) ([]projection.SubscriberInfo, error) {
	all := c.runner.Registered()
	if name == "" {
		return all, nil
	}
	names := make([]string, 0, len(all))
	for _, s := range all {
		if s.Name == name {
			return []projection.SubscriberInfo{s}, nil
		}
		names = append(names, s.Name)
	}
	known := strings.Join(names, ", ")
	if known == "" {
		known = "none"
	}
	return nil, usage(errors.Wrapf(projection.ErrUnknownProjection, "%q is not registered (registered: %s)", name, known))
}

func kind(s projection.SubscriberInfo) string {
	switch {
	case s.Saga:
		return "saga"
	case s.Observer:
		return "observer"
	case s.BlueGreen:
		// Rebuilt blue/green, whether it can reset or not.
		return "projection (blue/green)"
	case s.Rebuildable:
		return "projection"
	default:
		return "projection (no reset)"
	}
}

// shown is one subscriber of list and status: a registered projection or
// observer, or a generation (building or live) of a blue/green one.
type shown struct {
	// SubscriberInfo's Name is the subscriber's: the checkpoints' and the
	// dead letters' (<name>#g<N> for a generation).
	projection.SubscriberInfo
	// registered is the name it is registered under, which status and
	// rebuild take.
	registered string
	// gen is the generation; nil unless blue/green.
	gen *projection.Generation
}

// ident is what list and status say of a subscriber, before its state.
type ident struct {
	// Name is the registered name (what status and rebuild take).
	Name string `json:"name"`
	Kind string `json:"kind"`
	// Subscriber is the name of its checkpoints and dead letters (annals
	// dlq list --subscriber): Name, or <name>#g<N> for generation N of a
	// blue/green projection.
	Subscriber string `json:"subscriber"`
	// Generation and GenerationState are the generation (building or
	// live) of a blue/green projection, which has an entry for each; null
	// otherwise.
	Generation      *int    `json:"generation"`
	GenerationState *string `json:"generation_state"`
}

// generationColumn is the GENERATION column of list and status: the
// generation's number and state, "-" for a subscriber without generations.
func (id ident) generationColumn() string {
	if id.Generation == nil {
		return "-"
	}
	return fmt.Sprintf("%d (%s)", *id.Generation, *id.GenerationState)
}

func (s shown) ident() ident {
	id := ident{Name: s.registered, Kind: kind(s.SubscriberInfo), Subscriber: s.Name}
	if s.gen != nil {
		n, st := s.gen.Generation, string(s.gen.State)
		id.Generation, id.GenerationState = &n, &st
	}
	return id
}

// subscriberInfos returns the subscribers of ss, for load.
func subscriberInfos(ss []shown) []projection.SubscriberInfo {
	out := make([]projection.SubscriberInfo, len(ss))
	for i, s := range ss {
		out[i] = s.SubscriberInfo
	}
	return out
}

// listEntry is one line of list, as --output json gives it.
type listEntry struct {
	ident
	Partitions int `json:"partitions"`
	// Checkpoint is the lowest checkpoint of the partitions and Lag the
	// head minus it; null before every partition's first run.
	Checkpoint *int64   `json:"checkpoint"`
	Head       int64    `json:"head"`
	Lag        *int64   `json:"lag"`
	Leaders    []string `json:"leaders"`
}

// statusEntry is one partition of status, as --output json gives it.
type statusEntry struct {
	ident
	Partition int `json:"partition"`
	// Checkpoint, Lag and Epoch are null for a partition without a
	// checkpoint (before its first run).
	Checkpoint *int64 `json:"checkpoint"`
	Lag        *int64 `json:"lag"`
	Epoch      *int64 `json:"epoch"`
	// Leader is who leads the partition (see partitionState.leader):
	// "none" while its lock is free; LockPID the backend holding it (null:
	// none).
	Leader      string `json:"leader"`
	LockPID     *int32 `json:"lock_pid"`
	DeadLetters int64  `json:"dead_letters"`
	Stopped     string `json:"stopped"`
}

// statusOutput is status as --output json gives it.
type statusOutput struct {
	Head       int64         `json:"head"`
	Partitions []statusEntry `json:"partitions"`
}

// checkOutput refuses an --output other than text or json.
func checkOutput(output string) error {
	if output != "text" && output != "json" {
		return usage(errors.Newf("--output %q: want text or json", output))
	}
	return nil
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func (c *commands) listCommand() *cobra.Command {
	var output string
	var stale time.Duration
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the registered projections and observers with checkpoint, head, lag and leader",
		Long: `List the registered projections and observers, one line each: kind, partitions, the
lowest checkpoint of its partitions ("-" before its first run), the head of the log, the
lag (head minus the lowest checkpoint) and the leaders of its partitions. A blue/green
projection has a line for each generation being built or live, under its registered name
(what rebuild takes), with the generation's number and state in GENERATION; its subscriber
(for 'annals dlq --subscriber') is NAME#g<generation>. With --output json: an array of
objects (checkpoint and lag null before the first run; subscriber the checkpoints' name;
generation and generation_state null unless blue/green).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			staleAfter, err := c.staleAfter(stale)
			if err != nil {
				return err
			}
			ran(cmd)
			subs, err := c.generations(cmd.Context(), c.runner.Registered())
			if err != nil {
				return err
			}
			states, head, err := c.load(cmd.Context(), subscriberInfos(subs), staleAfter)
			if err != nil {
				return err
			}
			entries := make([]listEntry, 0, len(subs))
			for i, s := range subs {
				parts := states[i]
				low, started := int64(0), true
				leaders := []string{}
				seen := map[string]bool{}
				for j, p := range parts {
					if !p.exists {
						started = false
					}
					if j == 0 || p.position < low {
						low = p.position
					}
					if l := p.leader(); !seen[l] && l != "none" {
						seen[l] = true
						leaders = append(leaders, l)
					}
				}
				e := listEntry{ident: s.ident(), Partitions: s.Partitions, Head: head, Leaders: leaders}
				if started {
					lag := max(head-low, 0)
					e.Checkpoint, e.Lag = &low, &lag
				}
				entries = append(entries, e)
			}
			if output == "json" {
				return writeJSON(cmd.OutOrStdout(), entries)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tKIND\tGENERATION\tPARTITIONS\tCHECKPOINT\tHEAD\tLAG\tLEADER")
			for _, e := range entries {
				cp, lag := "-", "-"
				if e.Checkpoint != nil {
					cp, lag = fmt.Sprint(*e.Checkpoint), fmt.Sprint(*e.Lag)
				}
				leader := strings.Join(e.Leaders, ",")
				if leader == "" {
					leader = "none"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%d\t%s\t%s\n", e.Name, e.Kind, e.generationColumn(), e.Partitions,
					cp, e.Head, lag, leader)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "text", "text or json")
	staleAfterFlag(cmd, &stale)
	return cmd
}

func (c *commands) statusCommand() *cobra.Command {
	var output string
	var stale time.Duration
	cmd := &cobra.Command{
		Use:   "status [NAME]",
		Short: "Show every partition of the projections (or of NAME): checkpoint, lag, epoch, leader, stops, dead letters",
		Long: `Show every partition of the registered projections and observers (or of NAME): checkpoint,
lag, epoch, leader, the backend holding its lock, dead letters and why it is stopped. A
blue/green projection shows the partitions of each generation being built or live, as list
does. With --output json: an object with the head of the log and an array of partitions
(checkpoint, lag and epoch null before the first run, lock_pid null without a leader;
subscriber, generation and generation_state as in list).`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			staleAfter, err := c.staleAfter(stale)
			if err != nil {
				return err
			}
			ran(cmd)
			name := ""
			if len(args) == 1 {
				name = args[0]
			}
			subs, err := c.selected(name)
			if err != nil {
				return err
			}
			rows, err := c.generations(cmd.Context(), subs)
			if err != nil {
				return err
			}
			states, head, err := c.load(cmd.Context(), subscriberInfos(rows), staleAfter)
			if err != nil {
				return err
			}
			res := statusOutput{Head: head, Partitions: []statusEntry{}}
			for i, s := range rows {
				for _, p := range states[i] {
					e := statusEntry{ident: s.ident(), Partition: p.partition, Leader: p.leader(),
						DeadLetters: p.deadLetters, Stopped: p.stopped}
					if p.exists {
						pos, lag, epoch := p.position, p.lag(), p.epoch
						e.Checkpoint, e.Lag, e.Epoch = &pos, &lag, &epoch
					}
					if p.lockHeld {
						pid := p.lockPID
						e.LockPID = &pid
					}
					res.Partitions = append(res.Partitions, e)
				}
			}
			out := cmd.OutOrStdout()
			if output == "json" {
				return writeJSON(out, res)
			}
			fmt.Fprintf(out, "head of the log: %d\n", head)
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tKIND\tGENERATION\tPARTITION\tCHECKPOINT\tLAG\tEPOCH\tLEADER\tLOCK PID\tDEAD LETTERS\tSTOPPED")
			for _, e := range res.Partitions {
				cp, lag, epoch := "-", "-", "-"
				if e.Checkpoint != nil {
					cp, lag, epoch = fmt.Sprint(*e.Checkpoint), fmt.Sprint(*e.Lag), fmt.Sprint(*e.Epoch)
				}
				pid, stopped := "-", "-"
				if e.LockPID != nil {
					pid = fmt.Sprint(*e.LockPID)
				}
				if e.Stopped != "" {
					stopped = oneLine(e.Stopped, 60)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", e.Name, e.Kind, e.generationColumn(), e.Partition, cp, lag, epoch,
					e.Leader, pid, e.DeadLetters, stopped)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "text", "text or json")
	staleAfterFlag(cmd, &stale)
	return cmd
}

// oneLine shortens s to one line of at most n runes.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		s = string(r[:n-1]) + "…"
	}
	return s
}
