package projection

import (
	"context"
	_ "embed"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/annals-dev/annals/advisorylock"
	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/checkpoint"
	"github.com/annals-dev/annals/internal/errmark"
	"github.com/annals-dev/annals/internal/pgtx"
	"github.com/annals-dev/annals/internal/poolconn"
	"github.com/annals-dev/annals/internal/schemaname"
	"github.com/annals-dev/annals/internal/sqltmpl"
	"github.com/annals-dev/annals/internal/telemetry"
)

//go:embed rebuild.sql
var rebuildSQL string

var (
	// ErrUnknownProjection is returned by Rebuild for a name that is not
	// registered with the runner; the message lists the registered names.
	ErrUnknownProjection = errors.New("projection: unknown projection")
	// ErrNotResetter is returned by Rebuild for a projection that cannot
	// clear its read model: it does not implement Resetter, or it is a typed
	// projection without OnReset. Replaying onto the old read model would
	// apply every event twice.
	ErrNotResetter = errors.New("projection: the projection cannot reset its read model")
	// ErrObserver is returned by Rebuild for an observer: its side effects
	// are outside the database and cannot be undone.
	ErrObserver = errors.New("projection: observers cannot be rebuilt")
	// ErrSaga is returned by Rebuild for a saga (package saga): its effects,
	// the commands it appended and the timers it set, are in the log
	// already, and a replay would issue them again.
	ErrSaga = errors.New("projection: sagas cannot be rebuilt")
	// ErrBlueGreenRebuild is returned by Rebuild for a projection with a
	// blue/green read model (Options.BlueGreen), which is not rebuilt in
	// place (readers would see a partial read model): Runner.RebuildBlueGreen
	// rebuilds it, and so does the projections rebuild command of package
	// projectioncmd, which picks blue/green for such a projection itself.
	ErrBlueGreenRebuild = errors.New("projection: a blue/green read model is not rebuilt in place")
	// ErrRebuildRunning is returned by Rebuild, at once, when another rebuild
	// of the same projection is running: it holds the projection's rebuild
	// lock (RebuildLockKey), or leads one of its partitions.
	ErrRebuildRunning = errors.New("projection: a rebuild of this projection is already running")
)

// RebuildOwnerPrefix starts the owner recorded in the checkpoints of a
// subscriber while a rebuild leads it ("rebuild:" and the instance ID).
const RebuildOwnerPrefix = "rebuild:"

// RebuildOptions configures Runner.Rebuild. A nil *RebuildOptions means
// defaults.
type RebuildOptions struct {
	// BatchSize is the number of events read and committed (with the
	// checkpoint) per transaction. Defaults to 5,000.
	BatchSize int
	// LockTimeout bounds the wait for the live leaders to stand aside (they
	// notice the rebuild at their next read or commit, within about a
	// PollInterval, or when the batch in hand ends). Defaults to 1 minute.
	LockTimeout time.Duration
	// OnProgress is called after each committed batch and once at the end
	// (with Done == Total). Defaults to nothing.
	OnProgress func(RebuildProgress)
	// NewLayout lets the rebuild change the subscriber's partition layout
	// (count and key) to the registered one (Options.Partitions,
	// PartitionBy), which the subscriber's recorded layout otherwise
	// refuses (catchup.ErrPartitionLayout). Before it takes the partitions
	// over, in one transaction, it empties the read model (Reset), sets
	// every checkpoint of the subscriber back to 0 with a new epoch (the
	// old layout's leaders are fenced, and cannot claim again: claims check
	// the layout) and records the new layout; then it rebuilds as usual.
	// Checkpoints of partitions the new count lacks stay, at 0. Instances
	// still running the old layout stand by, refused; deploy the new one.
	// Without a layout change it does nothing more than a rebuild.
	NewLayout bool
}

// RebuildProgress is how far a rebuild has come.
type RebuildProgress struct {
	// Projection is the projection being rebuilt.
	Projection string
	// Done is the number of events replayed so far (every partition),
	// counting, for a blue/green rebuild that continues a generation, what
	// was replayed into it before (through its checkpoints).
	Done int64
	// Total is the number of events to replay: those the projection reads,
	// up to the head of the log when the rebuild began. A blue/green
	// rebuild that catches up past it (events appended meanwhile) ends with
	// Total raised to Done.
	Total int64
	// Head is the position the rebuild replays through.
	Head int64
	// Elapsed is the time since the replay began (after the reset).
	Elapsed time.Duration
	// Rate is the events replayed by this run (Done, less what a resumed
	// blue/green rebuild had replayed before) per second of Elapsed.
	Rate float64
	// ETA estimates the time left at Rate (0 when unknown or done).
	ETA time.Duration
	// Finished is set on the last call, when the replay reached Head.
	Finished bool
	// Waiting, when set, says why a blue/green rebuild does not cut over
	// although its replay is done: the new generation's unresolved dead
	// letters, which an operator resolves with annals dlq retry or skip
	// (see ErrCutoverDeadLetters). Empty otherwise.
	Waiting string
}

// SubscriberInfo describes a registered projection or observer.
type SubscriberInfo struct {
	// Name is the subscriber's name.
	Name string
	// Observer is true for an observer, false for a projection.
	Observer bool
	// Rebuildable is true for a projection that can reset its read model
	// (a Resetter; a typed projection with OnReset).
	Rebuildable bool
	// Partitions is the number of partitions (1: unpartitioned).
	Partitions int
	// Types are the event-type patterns it reads (empty: all).
	Types []string
	// BlueGreen is true for a projection with a blue/green read model
	// (Options.BlueGreen): RebuildBlueGreen rebuilds it, not Rebuild.
	BlueGreen bool
	// Saga is true for a saga (package saga), which is never rebuilt.
	Saga bool
}

// Registered returns the registered projections and observers, by name.
func (r *Runner) Registered() []SubscriberInfo {
	r.mu.Lock()
	regs := slices.Clone(r.regs)
	r.mu.Unlock()
	out := make([]SubscriberInfo, 0, len(regs))
	for _, reg := range regs {
		_, obs, why := rebuildable(reg)
		out = append(out, SubscriberInfo{
			Name: reg.name, Observer: obs, Rebuildable: why == nil, Partitions: reg.opts.Partitions,
			Types: slices.Clone(reg.filter.Patterns()), BlueGreen: reg.bg != nil, Saga: reg.kind == "saga",
		})
	}
	slices.SortFunc(out, func(a, b SubscriberInfo) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Schema returns the annals schema the runner works in.
func (r *Runner) Schema() string { return r.cfg.Schema }

// HeartbeatInterval returns how often the runner updates its row of the
// instance registry (Config.HeartbeatInterval, defaulted).
func (r *Runner) HeartbeatInterval() time.Duration { return r.cfg.HeartbeatInterval }

// rebuildable returns the projection's Resetter, whether it is an observer,
// and why it cannot be rebuilt (nil if it can).
func rebuildable(reg *registration) (Resetter, bool, error) {
	if reg.bg != nil {
		return nil, false, errors.Wrapf(ErrBlueGreenRebuild, "%q has a blue/green read model: rebuild it with "+
			"Runner.RebuildBlueGreen (from a Client: Client.Runner().RebuildBlueGreen), or with 'projections rebuild %s' "+
			"(package projectioncmd), which rebuilds it blue/green", reg.name, reg.name)
	}
	if reg.kind == "saga" {
		return nil, false, errors.Wrapf(ErrSaga, "%q is a saga (the commands it appended and the timers it set are in the log; "+
			"a replay would issue them again): it is never rebuilt or set back (docs/sagas.md)", reg.name)
	}
	switch p := reg.newProc().(type) {
	case *observerProcessor:
		return nil, true, errors.Wrapf(ErrObserver, "%q is an observer (its side effects cannot be undone); "+
			"to deliver events again, set its checkpoint (annals checkpoint set)", reg.name)
	case *txProcessor:
		if t, ok := p.p.(*Typed); ok && t.reset == nil {
			return nil, false, errors.Wrapf(ErrNotResetter, "typed projection %q has no OnReset", reg.name)
		}
		res, ok := p.p.(Resetter)
		if !ok {
			return nil, false, errors.Wrapf(ErrNotResetter, "%q (%T) does not implement projection.Resetter", reg.name, p.p)
		}
		return res, false, nil
	default:
		return nil, false, errors.Newf("projection: %q: unexpected processor %T", reg.name, p)
	}
}

// Rebuild replays the registered projection name from the start of the log
// into a cleared read model, while the service keeps running:
//
//  0. It takes the projection's rebuild lock (RebuildLockKey) for the whole
//     run, or fails at once with ErrRebuildRunning.
//  1. It takes every partition's lock cluster-wide: it fences the live
//     leader (bumps the checkpoint's epoch; the leader releases its lock at
//     its next read or commit, or within about a second while it waits to
//     retry a failing event, and stands by) and takes the lock as soon as
//     it is free. Live instances stand by for the rest of the rebuild.
//  2. In one transaction, fenced by the rebuild's epochs, it calls the
//     projection's Reset, sets every partition's checkpoint to 0 (clearing a
//     Stop), settles the subscriber's dead letters (status resolved, also
//     the skipped ones: the replay delivers those events again, and one that
//     fails again is open again) and deletes its
//     recorded failed attempts (the replay retries each event by the policy
//     afresh).
//  3. It replays each partition through the head as it was at the reset,
//     BatchSize events per transaction, each committed with its checkpoint,
//     under the projection's usual retry and dead-letter policies, and calls
//     OnProgress after each batch.
//  4. It releases each partition's lock when it is done: a live instance
//     takes over from the rebuilt checkpoint and processes what was
//     appended meanwhile.
//
// If the rebuild stops midway (ctx ends, the process dies, its lock
// connection is lost), nothing is lost or applied twice: the reset and the
// checkpoint 0 committed together, and each batch committed with its
// checkpoint, so a live instance takes the freed lock and simply continues
// the replay from the last committed batch. A reset whose COMMIT got no
// answer (its connection lost once it was sent) may still commit on the
// server after Rebuild returned: the error says it may have committed, not
// that nothing changed, and the live instances' claims wait for it on the
// checkpoints' rows.
//
// A partition halted by a dead letter under the Stop policy ends the
// rebuild with catchup.ErrStopped: nobody continues that partition's
// replay until an operator retries or skips the dead letter (annals dlq
// retry or skip); then its live instance does, from the last committed
// batch.
//
// It fails with ErrUnknownProjection, ErrObserver, ErrNotResetter or
// ErrBlueGreenRebuild (and changes nothing) for a name it cannot rebuild, ErrRebuildRunning while
// another rebuild of it runs, and catchup.ErrTakeOverTimeout when a lock is
// not free within LockTimeout. Events are counted for progress with one
// scan of the log up to the head.
func (r *Runner) Rebuild(ctx context.Context, name string, opts *RebuildOptions) error {
	var o RebuildOptions
	if opts != nil {
		o = *opts
	}
	if err := nonNegative(fmt.Sprintf("projection: rebuild %q", name), opt("RebuildOptions.BatchSize", o.BatchSize),
		opt("RebuildOptions.LockTimeout", o.LockTimeout)); err != nil {
		return err
	}
	if o.BatchSize == 0 {
		o.BatchSize = 5000
	}
	if o.LockTimeout == 0 {
		o.LockTimeout = time.Minute
	}
	reg, err := r.lookup(name)
	if err != nil {
		return err
	}
	res, _, err := rebuildable(reg)
	if err != nil {
		return err
	}
	rb, err := r.newRebuild(reg, res, o)
	if err != nil {
		return err
	}
	return rb.run(ctx)
}

// lookup returns the registration of name.
func (r *Runner) lookup(name string) (*registration, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	names := make([]string, 0, len(r.regs))
	for _, reg := range r.regs {
		if reg.name == name {
			return reg, nil
		}
		names = append(names, reg.name)
	}
	slices.Sort(names)
	known := strings.Join(names, ", ")
	if known == "" {
		known = "none"
	}
	return nil, errors.Wrapf(ErrUnknownProjection, "%q is not registered (registered: %s)", name, known)
}

// rebuild is one run of Runner.Rebuild.
type rebuild struct {
	r      *Runner
	reg    *registration
	res    Resetter
	opts   RebuildOptions
	engine *catchup.Engine
	cps    *checkpoint.Store
	q      map[string]string
	subs   []*catchup.Subscription
	log    *slog.Logger

	// bulk, in a blue/green rebuild by a Runner with a ReadPool, is engine's
	// twin that reads the events from the replica (catchup.Config.ReadPool);
	// nil otherwise. Only the replay outside the cut-over uses it (see
	// drive).
	bulk *catchup.Engine

	mu       sync.Mutex // progress: partitions replay concurrently
	progress RebuildProgress
	base     int64 // progress.Done replayed before this run (a resumed blue/green rebuild)
	started  time.Time
}

func (r *Runner) newRebuild(reg *registration, res Resetter, o RebuildOptions) (*rebuild, error) {
	engine, err := catchup.NewEngine(r.pool, nil, &catchup.Config{
		Schema:          r.cfg.Schema,
		Owner:           RebuildOwnerPrefix + r.cfg.InstanceID,
		RetryBackoff:    r.cfg.RetryBackoff,
		ShutdownTimeout: r.cfg.ShutdownTimeout,
		Lock:            r.cfg.Lock,
		ReadPool:        r.cfg.ReadPool,
		Logger:          r.cfg.Logger,
	})
	if err != nil {
		return nil, err
	}
	cps, err := checkpoint.New(r.cfg.Schema)
	if err != nil {
		return nil, err
	}
	q, err := sqltmpl.Named("rebuild.sql", rebuildSQL, sqltmpl.NewData(r.cfg.Schema))
	if err != nil {
		return nil, err
	}
	rb := &rebuild{r: r, reg: reg, res: res, opts: o, engine: engine, cps: cps, q: q,
		log:      r.cfg.Logger.With(slog.String("projection", reg.name)),
		progress: RebuildProgress{Projection: reg.name}}
	for part := range reg.opts.Partitions {
		rb.subs = append(rb.subs, &catchup.Subscription{
			Name: reg.name, Partition: part, Partitions: reg.opts.Partitions, PartitionBy: reg.opts.PartitionBy, Filter: reg.filter,
			BatchSize: o.BatchSize, Processor: &countingProcessor{Processor: reg.newProc(), done: rb.advance},
			SyncCommits: reg.opts.SyncCommits,
		})
	}
	return rb, nil
}

// RebuildLockKey returns the key of the session advisory lock a rebuild of
// the projection name holds for its whole run (advisorylock.Key gives the
// pair of int4 keys): "rebuild:schema:name".
func RebuildLockKey(schema, name string) string {
	return "rebuild:" + schemaname.Or(schema) + ":" + name
}

func (rb *rebuild) run(ctx context.Context) (err error) {
	name := rb.reg.name
	ctx, stop, err := rb.lock(ctx)
	if err != nil {
		return err
	}
	defer stop()
	defer func() { err = lockLost(ctx, err) }()
	if err := rb.refuseConcurrent(ctx); err != nil {
		return err
	}
	if rb.opts.NewLayout {
		if err := rb.relayout(ctx); err != nil {
			return err
		}
	}
	leases, err := rb.takeOver(ctx)
	defer func() {
		for _, l := range leases {
			rb.engine.Release(ctx, l) // a no-op for those already released
		}
	}()
	if err != nil {
		return err
	}
	rb.log.InfoContext(ctx, "annals: rebuild: leading every partition; resetting")

	head, err := rb.engine.Head(ctx)
	if err != nil {
		return err
	}
	totals, _, err := rb.count(ctx, head, nil)
	if err != nil {
		return err
	}
	if err := rb.reset(ctx, leases); err != nil {
		return err
	}
	rb.progress.Head = head
	for _, n := range totals {
		rb.progress.Total += n
	}
	rb.started = time.Now()
	rb.log.InfoContext(ctx, "annals: rebuild: replaying", slog.Int64("head", head), slog.Int64("events", rb.progress.Total))

	for part, sub := range rb.subs {
		if err := rb.replay(ctx, ctx, rb.engine, sub, leases[part], head); err != nil {
			if errors.Is(err, catchup.ErrStopped) {
				return errors.Wrapf(err, "projection: rebuild %q: partition %d is stopped by a dead letter (the Stop policy): "+
					"its replay stays at the last committed batch until an operator retries or skips the dead letter "+
					"(annals dlq list --subscriber '%s', then annals dlq retry or annals dlq skip); then a live instance "+
					"continues it", name, part, name)
			}
			return errors.Wrapf(err, "projection: rebuild %q: partition %d (a live instance continues the replay "+
				"from the last committed batch)", name, part)
		}
		rb.engine.Release(ctx, leases[part]) // hand back to a live instance
	}
	rb.report(true)
	rb.log.InfoContext(ctx, "annals: rebuild: done", slog.Int64("events", rb.progress.Done),
		slog.Duration("elapsed", rb.progress.Elapsed))
	return nil
}

// lock takes the rebuild's own advisory lock (RebuildLockKey) on a dedicated
// connection, or fails at once with ErrRebuildRunning: two rebuilds started
// together cannot both pass, and the second would fence the first halfway.
// The returned context ends when the lock is lost (the rebuild stops like an
// interrupted one; a live instance continues the replay); stop releases it.
func (rb *rebuild) lock(ctx context.Context) (context.Context, func(), error) {
	key := RebuildLockKey(rb.r.cfg.Schema, rb.reg.name)
	lock, err := advisorylock.TryAcquire(ctx, rb.r.pool.Config().ConnConfig, key, poolconn.LockConfig(rb.r.pool, rb.r.cfg.Lock))
	if errors.Is(err, advisorylock.ErrNotAcquired) {
		return nil, nil, errors.Wrapf(ErrRebuildRunning, "%q: another session holds the rebuild lock %q", rb.reg.name, key)
	}
	if err != nil {
		return nil, nil, errors.Wrapf(err, "projection: rebuild %q: take the rebuild lock", rb.reg.name)
	}
	lctx, cancel := context.WithCancelCause(ctx)
	go func() {
		select {
		case <-lock.Lost():
			cancel(errors.Wrapf(lock.Err(), "projection: rebuild %q: the rebuild lock was lost", rb.reg.name))
		case <-lctx.Done():
		}
	}()
	stop := func() {
		cancel(nil)
		rctx, done := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer done()
		_ = lock.Release(rctx)
	}
	return lctx, stop, nil
}

// lockLost returns err, or, when the rebuild lock was lost (which ended
// ctx, the context lock returned), an error that says so first, followed
// by where the rebuild stopped (err, which mostly reports the cancellation
// that the lost lock caused): "context canceled" alone does not say why.
// It matches (errors.Is, errors.As) both the lost lock's cause and err.
func lockLost(ctx context.Context, err error) error {
	cause := context.Cause(ctx)
	if err == nil || cause == nil || cause == ctx.Err() {
		return err
	}
	if !errors.Is(err, ctx.Err()) {
		// The replay ended through a statement the server cancelled
		// (57014, when its cancel request wins the race with ctx in pgx)
		// rather than through ctx's end: it still matches it.
		return fmt.Errorf("%w; the rebuild stopped: %w", cause, errmark.Mark(err, ctx.Err()))
	}
	return fmt.Errorf("%w; the rebuild stopped: %w", cause, err)
}

// refuseConcurrent fails with ErrRebuildRunning while another rebuild leads
// a partition (its owner is a rebuild and the lock is held): fencing it would
// stop it halfway. The rebuild lock already keeps rebuilds apart; this also
// covers a rebuild that leads partitions after losing its rebuild lock's
// connection, until it notices.
func (rb *rebuild) refuseConcurrent(ctx context.Context) error {
	for _, sub := range rb.subs {
		cp, err := rb.cps.Load(ctx, rb.r.pool, sub.Name, sub.Partition)
		if errors.Is(err, checkpoint.ErrNotFound) {
			continue
		}
		if err != nil {
			return err
		}
		if !strings.HasPrefix(cp.Owner, RebuildOwnerPrefix) {
			continue
		}
		pid, held, err := rb.engine.LockHolder(ctx, sub.Name, sub.Partition)
		if err != nil {
			return err
		}
		if held {
			return errors.Wrapf(ErrRebuildRunning, "%q partition %d is led by %s (backend pid %d)", sub.Name, sub.Partition, cp.Owner, pid)
		}
	}
	return nil
}

// takeOver takes every partition's lock, concurrently, within LockTimeout.
// It returns the leases it got, also on error (the caller releases them).
func (rb *rebuild) takeOver(ctx context.Context) ([]*catchup.Lease, error) {
	return rb.takeOverSubs(ctx, rb.subs)
}

// takeOverSubs is takeOver for subs.
func (rb *rebuild) takeOverSubs(ctx context.Context, subs []*catchup.Subscription) ([]*catchup.Lease, error) {
	leases := make([]*catchup.Lease, len(subs))
	errs := make([]error, len(subs))
	var wg sync.WaitGroup
	for i, sub := range subs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			leases[i], errs[i] = rb.engine.TakeOver(ctx, sub, rb.opts.LockTimeout)
		}()
	}
	wg.Wait()
	got := leases[:0:0]
	for _, l := range leases {
		if l != nil {
			got = append(got, l)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return got, errors.Wrapf(err, "projection: rebuild %q: take the subscriber's locks", rb.reg.name)
	}
	return leases, nil
}

// relayout records the registered layout when the subscriber's recorded
// one differs (see RebuildOptions.NewLayout). It takes every partition of
// the old layout over first, as a rebuild takes its own (their leaders
// stand aside; a batch of theirs in flight cannot commit), then in one
// transaction fences every checkpoint of the subscriber back to 0, empties
// the read model and replaces the layout; checkpoints of partitions the new
// count lacks are deleted when the role may (else they stay, at 0, and the
// log says so). Nothing changes when the layouts agree.
func (rb *rebuild) relayout(ctx context.Context) error {
	err := rb.engine.CheckLayout(ctx, rb.subs[0])
	var refused *catchup.PartitionLayoutError
	if err == nil || !errors.As(err, &refused) {
		return err
	}
	name := rb.reg.name
	oldN, oldBy := refused.RecordedPartitions, refused.RecordedPartitionBy
	if oldN == 0 { // from before layouts were recorded: as its checkpoints show
		oldN, oldBy = refused.HighestPartition+1, ""
	}
	rb.log.InfoContext(ctx, "annals: rebuild: changing the partition layout",
		slog.Int("from_partitions", oldN), slog.String("from_key", oldBy),
		slog.Int("to_partitions", refused.Partitions), slog.String("to_key", refused.PartitionBy))
	old := make([]*catchup.Subscription, oldN)
	for p := range oldN {
		sub := *rb.subs[0]
		sub.Partition, sub.Partitions, sub.PartitionBy = p, oldN, oldBy
		old[p] = &sub
	}
	leases, err := rb.takeOverSubs(ctx, old)
	defer func() {
		for _, l := range leases {
			rb.engine.Release(ctx, l)
		}
	}()
	if err != nil {
		return errors.Wrapf(err, "projection: rebuild %q: take the old layout's partitions over (nothing changed)", name)
	}
	var surplus bool
	if err := rb.r.pool.QueryRow(ctx, rb.q["CanDeleteCheckpoints"], schemaname.Or(rb.r.cfg.Schema)).Scan(&surplus); err != nil {
		return errors.Wrapf(err, "projection: rebuild %q: may the role delete checkpoints", name)
	}
	committing := false // the body is done: what fails now is the COMMIT
	err = leases[0].Do(ctx, func(conn *pgx.Conn) error {
		// READ COMMITTED, as setupBeforeReset (EnsureSetup) needs it.
		return pgx.BeginTxFunc(ctx, conn, pgtx.ReadCommitted, func(tx pgx.Tx) (err error) {
			defer func() { committing = err == nil }()
			// The fence first: from here on no leader's batch commits.
			if _, err := tx.Exec(ctx, rb.q["FenceAllCheckpoints"], name, RebuildOwnerPrefix+rb.r.cfg.InstanceID); err != nil {
				return errors.Wrap(err, "set every checkpoint to 0")
			}
			if err := rb.setupBeforeReset(ctx, tx); err != nil {
				return err
			}
			if err := safely(func() error { return rb.res.Reset(ctx, tx) }); err != nil {
				return errors.Wrap(err, "Reset")
			}
			if _, err := tx.Exec(ctx, rb.q["SupersedeDeadLetters"], name); err != nil {
				return errors.Wrap(err, "settle the dead letters")
			}
			if _, err := tx.Exec(ctx, rb.q["ForgetFailures"], name); err != nil {
				return errors.Wrap(err, "forget the failed attempts")
			}
			if surplus {
				if _, err := tx.Exec(ctx, rb.q["DeleteSurplusCheckpoints"], name, refused.Partitions); err != nil {
					return errors.Wrap(err, "delete the checkpoints of the partitions the new layout lacks")
				}
			}
			_, err = tx.Exec(ctx, rb.q["ReplaceLayout"], name, refused.Partitions, refused.PartitionBy)
			return errors.Wrap(err, "record the new layout")
		})
	})
	if err != nil && committing && !refusedByServer(err) {
		// As in reset: the COMMIT may land still, and the next claims wait
		// for it on the checkpoints' rows.
		return errors.Wrapf(err, "projection: rebuild %q: change the partition layout: its COMMIT got no answer, and it may have committed "+
			"(the read model emptied, every checkpoint at 0, the new layout recorded) or rolled back; run the rebuild again", name)
	}
	if err != nil {
		return errors.Wrapf(err, "projection: rebuild %q: change the partition layout (nothing changed)", name)
	}
	if !surplus && oldN > refused.Partitions {
		rb.log.WarnContext(ctx, "annals: rebuild: the checkpoints of the partitions the new layout lacks stay, at 0 (the role may not delete them): "+
			"delete them as the schema's owner, or annals status shows them lagging and an Await that counts checkpoints may wait for them",
			slog.Int("from_partition", refused.Partitions), slog.Int("to_partition", oldN-1))
	}
	return nil
}

// count returns the number of events to replay per partition through
// head, and of those the number at or before starts[partition] (replayed
// already; starts nil: none).
func (rb *rebuild) count(ctx context.Context, head int64, starts []int64) (total, done map[int]int64, err error) {
	var regex *string
	if re := rb.reg.filter.Regex(); re != "" {
		regex = &re
	}
	kind, field := partitionKeyArgs(rb.reg.opts.PartitionBy)
	rows, err := rb.r.pool.Query(ctx, rb.q["CountEvents"], head, regex, rb.reg.opts.Partitions, kind, field, starts)
	if err != nil {
		return nil, nil, errors.Wrap(err, "projection: rebuild: count the events")
	}
	total, done = map[int]int64{}, map[int]int64{}
	var part int
	var n, d int64
	_, err = pgx.ForEachRow(rows, []any{&part, &n, &d}, func() error { total[part], done[part] = n, d; return nil })
	return total, done, errors.Wrap(err, "projection: rebuild: count the events")
}

// reset clears the read model, sets every partition's checkpoint to 0,
// settles the dead letters and forgets the failed attempts, in one transaction on the first partition's lock
// connection, each checkpoint fenced by its partition's epoch.
func (rb *rebuild) reset(ctx context.Context, leases []*catchup.Lease) error {
	committing := false // the body is done: what fails now is the COMMIT
	err := leases[0].Do(ctx, func(conn *pgx.Conn) error {
		// READ COMMITTED, as setupBeforeReset (EnsureSetup) needs it.
		return pgx.BeginTxFunc(ctx, conn, pgtx.ReadCommitted, func(tx pgx.Tx) (err error) {
			defer func() { committing = err == nil }()
			if err := rb.setupBeforeReset(ctx, tx); err != nil {
				return err
			}
			if err := safely(func() error { return rb.res.Reset(ctx, tx) }); err != nil {
				return errors.Wrap(err, "Reset")
			}
			if _, err := tx.Exec(ctx, rb.q["SupersedeDeadLetters"], rb.reg.name); err != nil {
				return errors.Wrap(err, "settle the dead letters")
			}
			if _, err := tx.Exec(ctx, rb.q["ForgetFailures"], rb.reg.name); err != nil {
				return errors.Wrap(err, "forget the failed attempts")
			}
			for _, l := range leases {
				tag, err := tx.Exec(ctx, rb.q["ResetCheckpoint"], l.Subscriber, l.Partition, l.Epoch)
				if err != nil {
					return errors.Wrap(err, "set the checkpoint to 0")
				}
				if tag.RowsAffected() != 1 {
					return errors.Wrapf(checkpoint.ErrFenced, "partition %d at epoch %d", l.Partition, l.Epoch)
				}
			}
			return nil
		})
	})
	if err != nil && committing && !refusedByServer(err) {
		// The COMMIT was sent and got no answer (the connection lost): the
		// server may run it still, after this returns (its backend
		// descheduled, the bytes in its socket). The checkpoints' row
		// locks, which the reset holds until it ends, make the next claim
		// wait for it, so the live instances replay from where it left
		// the checkpoints, either way.
		return errors.Wrapf(err, "projection: rebuild %q: reset: its COMMIT got no answer, and it may have committed (the read model emptied, "+
			"every checkpoint at 0: a live instance then replays it from the start) or rolled back; run the rebuild again", rb.reg.name)
	}
	if err != nil {
		return errors.Wrapf(err, "projection: rebuild %q: reset (nothing changed)", rb.reg.name)
	}
	for _, l := range leases {
		l.Start = 0
	}
	return nil
}

// refusedByServer reports whether err holds the server's answer that a
// statement failed (an ERROR, not a FATAL that ends the session): then a
// COMMIT that failed so rolled its transaction back.
func refusedByServer(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	sev := pgErr.SeverityUnlocalized
	if sev == "" {
		sev = pgErr.Severity
	}
	return sev != "FATAL" && sev != "PANIC"
}

// replay drives one partition through head with engine e (rb.engine, or
// rb.bulk to read from the replica). A read error is retried after
// RetryBackoff from the committed checkpoint; fencing, a lost lock, a
// stopped partition and the end of ctx end it. With rb.bulk, a read error
// is not retried: it ends the replica's half of the round, marked
// errReplicaRead, and the primary's half carries on from the committed
// checkpoint (driveReplica). Its statements on the lease's session (the
// processor's, the checkpoint's reload) run under procCtx, which may
// outlive ctx (catchup.Engine.DriveWithin).
func (rb *rebuild) replay(ctx, procCtx context.Context, e *catchup.Engine, sub *catchup.Subscription, lease *catchup.Lease, head int64) error {
	for {
		err := e.DriveWithin(ctx, procCtx, sub, lease, head)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil || errors.Is(err, checkpoint.ErrFenced) || errors.Is(err, catchup.ErrStopped) ||
			lease.Err() != nil {
			return err
		}
		if e == rb.bulk {
			return errors.Mark(err, errReplicaRead)
		}
		rb.log.WarnContext(ctx, "annals: rebuild: replay failed; retrying", slog.Int("partition", sub.Partition), telemetry.Err(err))
		if err := sleepCtx(ctx, max(rb.r.cfg.RetryBackoff, 10*time.Millisecond)); err != nil {
			return err
		}
		// Continue from what is committed, not from where the read failed:
		// on the session holding the partition's lock, under procCtx.
		if err := ctx.Err(); err != nil {
			return err
		}
		var cp checkpoint.Checkpoint
		err = lease.Do(procCtx, func(conn *pgx.Conn) error {
			var err error
			cp, err = rb.cps.Load(procCtx, conn, sub.Name, sub.Partition)
			return err
		})
		if err != nil {
			return err
		}
		lease.Start = cp.Position
	}
}

// advance counts events replayed and reports progress.
func (rb *rebuild) advance(n int) {
	if n == 0 {
		return
	}
	rb.mu.Lock()
	defer rb.mu.Unlock()
	rb.progress.Done += int64(n)
	rb.reportLocked(false)
}

// report reports progress to OnProgress.
func (rb *rebuild) report(finished bool) {
	rb.mu.Lock()
	defer rb.mu.Unlock()
	rb.reportLocked(finished)
}

// wait sets (or, with "", clears) RebuildProgress.Waiting and reports
// whether it changed.
func (rb *rebuild) wait(why string) bool {
	rb.mu.Lock()
	defer rb.mu.Unlock()
	changed := rb.progress.Waiting != why
	rb.progress.Waiting = why
	return changed
}

func (rb *rebuild) reportLocked(finished bool) {
	p := &rb.progress
	if finished && p.Done > p.Total {
		p.Total = p.Done // a blue/green rebuild caught up past the head it counted to
	}
	p.Elapsed = time.Since(rb.started)
	p.Rate, p.ETA = 0, 0
	if s := p.Elapsed.Seconds(); s > 0 {
		p.Rate = float64(p.Done-rb.base) / s
	}
	if p.Rate > 0 && p.Done < p.Total && !finished {
		p.ETA = time.Duration(float64(p.Total-p.Done) / p.Rate * float64(time.Second))
	}
	p.Finished = finished
	if rb.opts.OnProgress != nil {
		rb.opts.OnProgress(*p)
	}
}

// countingProcessor reports how many events each batch got through.
type countingProcessor struct {
	catchup.Processor
	done func(n int)
}

func (c *countingProcessor) Process(ctx context.Context, lease *catchup.Lease, b catchup.Batch) (int64, error) {
	pos, err := c.Processor.Process(ctx, lease, b)
	n := 0
	for _, e := range b.Events {
		if e.GlobalSequence <= pos {
			n++
		}
	}
	c.done(n)
	return pos, err
}

// NextIdle forwards the wrapped processor's (catchup.IdleDeadliner).
func (c *countingProcessor) NextIdle() time.Time { return nextIdle(c.Processor) }

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// partitionKeyArgs returns the partition key's kind and metadata field as
// the SQL of CountEvents takes them (catchup's ReadBatch does the same).
func partitionKeyArgs(by string) (kind, field string) {
	switch {
	case by == catchup.PartitionByCategory:
		return "category", ""
	case strings.HasPrefix(by, catchup.PartitionByMetadataPrefix):
		return "metadata", strings.TrimPrefix(by, catchup.PartitionByMetadataPrefix)
	}
	return "stream", ""
}
