package projection

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/internal/schemaname"
	"github.com/annals-dev/annals/internal/sqltmpl"
)

//go:embed await.sql
var awaitSQL string

// AwaitOptions configures an Awaiter. A nil *AwaitOptions means defaults.
type AwaitOptions struct {
	// Schema is the annals schema. Defaults to "annals".
	Schema string
	// PollInterval is how often a waiter reads the checkpoints itself, in
	// case a notification was lost (a reconnect, say). Defaults to 1s.
	PollInterval time.Duration
}

// BehindError is returned by Await when its context ends before the
// projection's checkpoint reached the position. It matches the context's
// error (errors.Is(err, context.DeadlineExceeded)).
type BehindError struct {
	// Projection is the subscriber waited for (for a blue/green
	// projection, its live generation's: <name>#g<N>).
	Projection string
	// Target is the position waited for.
	Target int64
	// Partition is the partition that was behind, and Checkpoint its
	// checkpoint (0 when the projection has never run).
	Partition  int
	Checkpoint int64
	// Lag is how many events lie after Checkpoint, up to Target.
	Lag int64
	// Stopped is the partition's stop reason when the Stop dead-letter
	// policy halted it (it stays at Checkpoint until an operator retries or
	// skips the dead letter: annals dlq), else "".
	Stopped string
	// Err is the context's error.
	Err error
}

func (e *BehindError) Error() string {
	stopped := ""
	if e.Stopped != "" {
		stopped = fmt.Sprintf("; the partition is stopped until an operator retries or skips its dead letter (annals dlq): %s", e.Stopped)
	}
	return fmt.Sprintf("projection %q is behind position %d: partition %d at checkpoint %d, %d events behind%s: %v",
		e.Projection, e.Target, e.Partition, e.Checkpoint, e.Lag, stopped, e.Err)
}

// Unwrap returns the context's error.
func (e *BehindError) Unwrap() error { return e.Err }

// ErrDeadLettered is matched (errors.Is) by the error of an Await whose
// event the subscriber passed without applying it: a *DeadLetteredError.
var ErrDeadLettered = errors.New("projection: the awaited event was dead-lettered")

// DeadLetteredError is returned by Await when the subscriber's checkpoint
// has passed the position but the event at it is one of the subscriber's
// dead letters: it failed (its retry policy spent, or a permanent error),
// or it was parked behind an earlier failure of its stream (ParkStream),
// and it is still open, or an operator skipped it. The read model lacks
// that event. Await waits on (and returns nil once it is applied) while an
// operator's retry re-delivers it.
type DeadLetteredError struct {
	// Projection is the subscriber waited for (for a blue/green
	// projection, its live generation's: <name>#g<N>).
	Projection string
	// Position is the position waited for, and Stream its event's stream.
	Position int64
	Stream   string
	// DeadLetter is the dead letter's ID (annals dlq show, retry, skip).
	DeadLetter int64
	// Reason is "failed" (the event failed) or "parked" (held back behind
	// an earlier failure of its stream).
	Reason string
	// Status is "open" (waiting for an operator) or "skipped" (an operator
	// chose to do without it).
	Status string
}

func (e *DeadLetteredError) Error() string {
	what := "failed"
	if e.Reason == "parked" {
		what = "was parked behind an earlier failure of its stream"
	}
	then := "it stays unapplied until an operator retries it (annals dlq retry " + strconv.FormatInt(e.DeadLetter, 10) + ")"
	if e.Status == "skipped" {
		then = "an operator skipped it: it will not be applied"
	}
	return fmt.Sprintf("projection %q passed position %d without applying it: the event (stream %q) %s and is dead letter %d (%s); %s",
		e.Projection, e.Position, e.Stream, what, e.DeadLetter, e.Status, then)
}

// Is reports whether target is ErrDeadLettered.
func (e *DeadLetteredError) Is(target error) bool { return target == ErrDeadLettered }

// Await returns when the projection name has processed every event through
// position (the GlobalSequence of an append's last event): its checkpoint
// has reached position in the partition that position's event belongs to
// (by the subscriber's recorded partition count and key; every partition
// if that event is not found, or the role may not read the recorded
// layout). It opens an Awaiter for the one call; a service that waits often
// keeps one Awaiter instead. On timeout or cancellation it returns a
// *BehindError, which names the partition's stop reason when the Stop
// dead-letter policy halted it. When the checkpoint has passed position
// but the event at position is a dead letter of the subscriber (failed,
// or parked behind a failure of its stream), open or skipped, it returns a
// *DeadLetteredError (errors.Is(err, ErrDeadLettered)) instead of nil: the
// read model lacks the event. Only the event at position is looked up: an
// earlier event of the same append that the SkipEvent policy passed is not
// (under ParkStream its failure parks the later ones, under Stop it halts
// the partition).
func Await(ctx context.Context, pool *pgxpool.Pool, name string, position int64, opts *AwaitOptions) error {
	a, err := NewAwaiter(pool, opts)
	if err != nil {
		return err
	}
	defer a.Close()
	return a.Await(ctx, name, position)
}

// Awaiter waits for projections' checkpoints (read-your-writes for
// asynchronous projections). It listens on the schema's checkpoint channel
// on one connection of its own for all its waiters, and wakes them when a
// checkpoint they wait for moves: the runner NOTIFYs that channel right
// after each batch it commits (in the same round trip, as a transaction of
// its own; see catchup's NotifyCheckpoint). Each waiter also reads the
// checkpoints every PollInterval, so a lost notification, or a move that
// sends none (a dead letter's, an observer's batched checkpoint, a
// rebuild's, annals checkpoint set), costs at most that long. Safe for
// concurrent use.
type Awaiter struct {
	pool    *pgxpool.Pool
	schema  string
	channel string
	poll    time.Duration
	q       map[string]string

	mu      sync.Mutex
	seen    map[awaitKey]int64 // positions notified, per subscriber partition
	gen     uint64             // notifications received
	wake    chan struct{}      // closed and replaced at each notification
	waiters int
	cancel  context.CancelFunc // of the listening goroutine; nil when none
	done    chan struct{}
	ready   chan struct{} // closed once the listener's first LISTEN is in place
	closed  bool
	// privileges is what the role may read, once checked (nil until then).
	privileges atomic.Pointer[awaitPrivileges]
}

// awaitPrivileges says which tables beyond checkpoints and dead letters
// (which every role of annals grant may read) an Awaiter's role may read.
type awaitPrivileges struct {
	// generations: read_model_generations (every role of annals grant
	// may; roles granted before Await read it may not).
	generations bool
	// layouts: subscriber_layouts, the recorded partition layouts (as
	// generations).
	layouts bool
}

type awaitKey struct {
	sub  string
	part int
}

// NewAwaiter returns an Awaiter on pool. It connects when its first waiter
// comes and lets the connection go when the last one leaves.
func NewAwaiter(pool *pgxpool.Pool, opts *AwaitOptions) (*Awaiter, error) {
	var o AwaitOptions
	if opts != nil {
		o = *opts
	}
	if pool == nil {
		return nil, errors.New("projection: Awaiter: pool is nil")
	}
	schema, err := schemaname.Resolve(o.Schema)
	if err != nil {
		return nil, err
	}
	if o.PollInterval < 0 {
		return nil, errors.New("projection: AwaitOptions.PollInterval is negative")
	}
	if o.PollInterval == 0 {
		o.PollInterval = time.Second
	}
	q, err := sqltmpl.Named("await.sql", awaitSQL, sqltmpl.NewData(schema))
	if err != nil {
		return nil, err
	}
	return &Awaiter{pool: pool, schema: schema, channel: schemaname.CheckpointChannel(schema), poll: o.PollInterval, q: q,
		seen: map[awaitKey]int64{}, wake: make(chan struct{})}, nil
}

// Close stops listening; waiters still in Await then fall back to reading
// the checkpoints every PollInterval until they return. Safe to call twice.
func (a *Awaiter) Close() {
	a.mu.Lock()
	a.closed = true
	cancel, done := a.cancel, a.done
	a.cancel = nil
	a.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

// Await returns nil once the projection name's checkpoint has reached
// position (see the package function Await), a *DeadLetteredError when it
// passed position without applying its event, or a *BehindError when ctx
// ends first. For a partitioned projection it reads the partition count
// and key the subscriber's checkpoints were written under
// (subscriber_layouts, recorded at its first run). A role that may not
// read them (a role granted by an older annals: grant it again) waits for
// every partition, whose count it takes to be the number of checkpoint
// rows the projection has (while its partitions are first started that
// may be too few); AwaitPartitions (or Runner.Await) is told the count.
func (a *Awaiter) Await(ctx context.Context, name string, position int64) error {
	return a.AwaitPartitions(ctx, name, 0, position)
}

// AwaitPartitions is Await for a projection run with Options.Partitions =
// partitions (0: unknown, as Await): it waits for the checkpoint of the
// partition that position's event belongs to, by the subscriber's recorded
// partition key (every partition when the role may not read it; the
// recorded count wins over partitions too).
//
// For a blue/green projection (Options.BlueGreen) it waits for the live
// generation (its subscriber <name>#g<N>), the one readers see. Each read
// of that generation's checkpoints reads the live generation in the same
// statement (one snapshot): it answers only for a generation that was live
// when its checkpoints were read, so that a rollback or cut-over in between
// cannot make it answer for one readers no longer see. A cut-over or
// rollback during the wait is followed at the next read (at least every
// poll): from then on it waits for the generation that became live. An
// Awaiter whose role may not read read_model_generations (a role granted
// by an older annals) waits for name's own checkpoints.
func (a *Awaiter) AwaitPartitions(ctx context.Context, name string, partitions int, position int64) error {
	if partitions < 0 {
		return errors.Newf("projection: Await: %d partitions", partitions)
	}
	return a.await(ctx, name, true, func(int) (int, string) { return partitions, "" }, position)
}

// await is AwaitPartitions with the partition count and key of each
// generation version (0: not blue/green) given by layout (0 and "" where
// unknown; the key canonical, as recorded: catchup.PartitionByStream for
// the default); blueGreen says whether name may be a blue/green projection
// (false: it is known not to be, and no generation is looked up).
func (a *Awaiter) await(ctx context.Context, name string, blueGreen bool, layout func(version int) (int, string), position int64) error {
	if name == "" {
		return errors.New("projection: Await: empty projection name")
	}
	if position <= 0 {
		return nil
	}
	wake, ready := a.join()
	defer a.leave()
	// sub is the subscriber waited for: name, or its live generation's.
	sub, version, err := a.live(ctx, name, blueGreen)
	if err != nil {
		return a.failed(ctx, name, position, -1, err)
	}
	part, err := a.partition(ctx, sub, version, layout, position)
	if err != nil {
		return a.failed(ctx, sub, position, -1, err)
	}
	ticker := time.NewTicker(a.poll)
	defer ticker.Stop()
	// The first read after LISTEN is in place, so that no move falls between
	// them (or after a poll interval, if the listener cannot connect).
	select {
	case <-ready:
	case <-ticker.C:
	case <-ctx.Done():
		return a.behind(ctx, sub, position, part, ctx.Err())
	}
	read := true    // from the database: at the start, at each poll, and to confirm a notification
	follow := false // look for the live generation first: at each poll
	held := false   // the checkpoint passed, but a released dead letter of the event awaits re-delivery
	// moveTo waits for the subscriber s (of generation version v) from
	// now on when it is another than sub (moved); a failure is Await's
	// error (never nil).
	moveTo := func(s string, v int) (moved bool, err error) {
		if s == sub {
			return false, nil
		}
		if part, err = a.partition(ctx, s, v, layout, position); err != nil {
			return false, a.failed(ctx, s, position, -1, err)
		}
		sub = s
		return true, nil
	}
	for {
		if follow {
			// A cut-over (or rollback) moves readers to another
			// generation: wait for that one from now on.
			s, v, err := a.live(ctx, name, blueGreen)
			if err != nil {
				return a.failed(ctx, sub, position, part, err)
			}
			if _, err := moveTo(s, v); err != nil {
				return err
			}
			follow = false
		}
		if read {
			// sub != name: sub is a generation's; its checkpoints are read
			// with the live generation, in one snapshot.
			of := ""
			if sub != name {
				of = name
			}
			var r reach
			if r, err = a.reached(ctx, sub, of, part, position); err != nil {
				return a.failed(ctx, sub, position, part, err)
			}
			if r.live != "" {
				// Another generation was live when sub's checkpoints were
				// read (a cut-over or rollback since sub was looked up):
				// readers see that one, which may lack the event (the one
				// a rollback went back to stopped at its cut-over) or
				// apply it (sub's dead letter is not theirs). Wait for it.
				if _, err := moveTo(r.live, r.liveVersion); err != nil {
					return err
				}
				continue
			}
			if r.dead != nil {
				return errors.WithStack(r.dead)
			}
			if r.done {
				return nil
			}
			if r.again {
				continue
			}
			held = r.held
		} else if !held && a.notified(sub, part, position) {
			// The checkpoint passed position: read it back, with the dead
			// letter of the event if there is one, before saying so.
			read = true
			continue
		}
		select {
		case <-ctx.Done():
			return a.behind(ctx, sub, position, part, ctx.Err())
		case <-wake:
			// The new channel before the check: a notification records its
			// position before it replaces the channel, so none is missed.
			a.mu.Lock()
			wake = a.wake
			a.mu.Unlock()
			read = false
		case <-ticker.C:
			read, follow = true, true
		}
	}
}

// privileged returns what the role may read, checking once per Awaiter: a
// role that may not read a table would have every Await that reads it
// fail. Every role of annals grant may read the generations and the
// recorded layouts; a role granted by an older annals may not, and still
// awaits (ordinary projections, by the caller's layout or every
// partition).
func (a *Awaiter) privileged(ctx context.Context) (awaitPrivileges, error) {
	if p := a.privileges.Load(); p != nil {
		return *p, nil
	}
	var p awaitPrivileges
	if err := a.pool.QueryRow(ctx, a.q["AwaitPrivileges"], a.schema).Scan(&p.generations, &p.layouts); err != nil {
		return p, errors.Wrap(err, "projection: Await: what may the role read")
	}
	a.privileges.Store(&p)
	return p, nil
}

// live returns the subscriber of the live generation of name and its
// version, or name and 0 when name has no generations (not blue/green).
func (a *Awaiter) live(ctx context.Context, name string, blueGreen bool) (string, int, error) {
	if !blueGreen {
		return name, 0, nil
	}
	p, err := a.privileged(ctx)
	if err != nil {
		return "", 0, err
	}
	if !p.generations {
		return name, 0, nil
	}
	var sub string
	var version int
	err = a.pool.QueryRow(ctx, a.q["AwaitLive"], name).Scan(&sub, &version)
	if errors.Is(err, pgx.ErrNoRows) {
		return name, 0, nil
	}
	if err != nil {
		return "", 0, errors.Wrap(err, "projection: Await: find the live generation")
	}
	return sub, version, nil
}

// partition returns the partition the event at position belongs to in the
// subscriber name (of generation version, 0 if none), or -1 for every
// partition (the event is not found, or the partition key is unknown): by
// the subscriber's recorded layout when the role may read it, else by
// layout's.
func (a *Awaiter) partition(ctx context.Context, name string, version int, layout func(version int) (int, string), position int64) (int, error) {
	p, err := a.privileged(ctx)
	if err != nil {
		return 0, err
	}
	q := a.q["AwaitPartition"]
	if !p.layouts {
		q = a.q["AwaitPartitionUnrecorded"]
	}
	partitions, by := layout(version)
	var part int
	err = a.pool.QueryRow(ctx, q, name, position, partitions, by).Scan(&part)
	return part, errors.Wrap(err, "projection: Await: find the partition")
}

// reach is what a read of the checkpoints found: the ones waited for have
// reached the position (done), or passed it without applying its event,
// which is an open or skipped dead letter (dead) or a released one waiting
// for re-delivery (held).
type reach struct {
	done, held bool
	dead       *DeadLetteredError
	// again: a notification said the checkpoint passed, but the rows read
	// (from a snapshot taken before it) did not: read again, as the dead
	// letter of the event was not looked up.
	again bool
	// live and liveVersion: another subscriber than the one read was the
	// projection's live generation in the snapshot the checkpoints were
	// read from (the projection's name and 0 when none was live); "" when
	// it was the one read, or was not looked up. The rest is then unset.
	live        string
	liveVersion int
}

// reached reads the checkpoints of the subscriber name and reports whether
// the one(s) waited for are at position, and, when they are, whether its
// event was dead-lettered; it also records them for notified. With
// projection (the blue/green projection whose generation name is; "": not
// looked up) it reads the live generation in the same statement, and
// reports it instead when it is not name.
func (a *Awaiter) reached(ctx context.Context, name, projection string, part int, position int64) (reach, error) {
	a.mu.Lock()
	gen := a.gen
	a.mu.Unlock()
	q, args := a.q["AwaitCheckpoints"], []any{name, position, part}
	if projection != "" {
		q, args = a.q["AwaitCheckpointsLive"], append(args, projection)
	}
	rows, err := a.pool.Query(ctx, q, args...)
	if err != nil {
		return reach{}, errors.Wrap(err, "projection: Await: read checkpoints")
	}
	var (
		p                              int
		pos                            int64
		dlID                           *int64
		dlStatus, dlReason, dlStream   *string
		liveSub                        *string
		liveVer                        *int
		found                          = map[int]int64{}
		deadID                         int64
		deadStatus, deadReason, stream string
		live                           string
		liveVersion                    int
	)
	scan := []any{&p, &pos, &dlID, &dlStatus, &dlReason, &dlStream}
	if projection != "" {
		scan = append(scan, &liveSub, &liveVer)
	}
	_, err = pgx.ForEachRow(rows, scan, func() error {
		found[p] = pos
		if dlID != nil {
			deadID, deadStatus, deadReason, stream = *dlID, *dlStatus, *dlReason, *dlStream
		}
		if projection != "" {
			live, liveVersion = projection, 0
			if liveSub != nil {
				live, liveVersion = *liveSub, *liveVer
			}
		}
		return nil
	})
	if err != nil {
		return reach{}, errors.Wrap(err, "projection: Await: read checkpoints")
	}
	if live != "" && live != name {
		// Not the checkpoints readers see: neither recorded nor answered.
		return reach{live: live, liveVersion: liveVersion}, nil
	}
	// The database's word replaces what notifications said, since a
	// checkpoint can move back (a rebuild, annals checkpoint set); unless a
	// notification came in while it was read, which may be newer.
	a.mu.Lock()
	for p, pos := range found {
		k := awaitKey{name, p}
		if a.gen == gen {
			a.seen[k] = pos
		} else {
			a.seen[k] = max(a.seen[k], pos)
		}
	}
	a.mu.Unlock()
	var r reach
	if !a.notified(name, part, position) {
		return r, nil
	}
	if !covers(found, part, position) {
		r.again = true
		return r, nil
	}
	if r.done = true; deadID == 0 {
		return r, nil
	}
	switch deadStatus {
	case "resolved": // re-delivered and applied
	case "retry":
		r.done, r.held = false, true
	default: // open, skipped
		r.done = false
		r.dead = &DeadLetteredError{Projection: name, Position: position, Stream: stream,
			DeadLetter: deadID, Reason: deadReason, Status: deadStatus}
	}
	return r, nil
}

// covers reports whether the checkpoints read (partition → position) have
// reached position: partition part's, or every one when part is -1.
func covers(found map[int]int64, part int, position int64) bool {
	if part >= 0 {
		pos, ok := found[part]
		return ok && pos >= position
	}
	for _, pos := range found {
		if pos < position {
			return false
		}
	}
	return len(found) > 0
}

// notified reports whether the positions known for name cover position.
func (a *Awaiter) notified(name string, part int, position int64) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if part >= 0 {
		return a.seen[awaitKey{name, part}] >= position
	}
	found := false
	for k, pos := range a.seen {
		if k.sub != name {
			continue
		}
		found = true
		if pos < position {
			return false
		}
	}
	return found
}

// failed returns the error of a query that failed: a BehindError when ctx
// has ended (the query failed because of it), else err.
func (a *Awaiter) failed(ctx context.Context, name string, position int64, part int, err error) error {
	if ctx.Err() != nil {
		return a.behind(ctx, name, position, part, ctx.Err())
	}
	return err
}

// behind builds the BehindError of a wait that ends, reading how far behind
// the projection is (best effort: ctx has ended, so with a short timeout of
// its own).
func (a *Awaiter) behind(ctx context.Context, name string, position int64, part int, cause error) error {
	e := &BehindError{Projection: name, Target: position, Err: cause}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	_ = a.pool.QueryRow(rctx, a.q["AwaitBehind"], name, position, part).Scan(&e.Partition, &e.Checkpoint, &e.Lag, &e.Stopped)
	return errors.WithStack(e)
}

// join registers a waiter, starting the listener if it is the first, and
// returns the current wake channel.
func (a *Awaiter) join() (wake, ready chan struct{}) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.waiters++
	if a.cancel == nil && !a.closed {
		ctx, cancel := context.WithCancel(context.Background())
		a.cancel, a.done, a.ready = cancel, make(chan struct{}), make(chan struct{})
		go a.listen(ctx, a.done, a.ready)
	}
	if a.ready == nil { // closed: poll only
		a.ready = make(chan struct{})
	}
	return a.wake, a.ready
}

// leave deregisters a waiter; the last one stops the listener.
func (a *Awaiter) leave() {
	a.mu.Lock()
	a.waiters--
	var cancel context.CancelFunc
	var done chan struct{}
	if a.waiters == 0 {
		clear(a.seen)
		if a.cancel != nil {
			cancel, done = a.cancel, a.done
			a.cancel = nil
		}
	}
	a.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

// listen holds a LISTEN connection until ctx ends, reconnecting after
// errors (with a backoff up to 2 s), and broadcasts every notification. A
// move committed while the connection was down is found by the waiters'
// next poll.
func (a *Awaiter) listen(ctx context.Context, done, ready chan struct{}) {
	defer close(done)
	var once sync.Once
	listening := func() { once.Do(func() { close(ready) }) }
	backoff := 50 * time.Millisecond
	for ctx.Err() == nil {
		err := a.listenOnce(ctx, listening)
		if ctx.Err() != nil {
			return
		}
		_ = err // a lost connection: reconnect after a pause
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

func (a *Awaiter) listenOnce(ctx context.Context, listening func()) error {
	c, err := a.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	conn := c.Hijack() // a LISTEN connection does not go back to the pool
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{a.channel}.Sanitize()); err != nil {
		return err
	}
	listening()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		pos, rest, ok1 := strings.Cut(n.Payload, ":")
		part, sub, ok2 := strings.Cut(rest, ":")
		p, err1 := strconv.ParseInt(pos, 10, 64)
		pt, err2 := strconv.Atoi(part)
		a.mu.Lock()
		a.gen++
		if ok1 && ok2 && err1 == nil && err2 == nil {
			k := awaitKey{sub, pt}
			a.seen[k] = max(a.seen[k], p)
		}
		close(a.wake)
		a.wake = make(chan struct{})
		a.mu.Unlock()
	}
}

// Await returns once the registered projection or observer name has
// processed every event through position (read-your-writes: pass the
// GlobalSequence of an append's last event), a *DeadLetteredError when it
// passed position without applying its event (a dead letter: failed or
// parked), or a *BehindError when ctx ends first. It knows the subscriber's partitions, and shares one
// Awaiter (one LISTEN connection while anybody waits) across calls. The
// runner need not be running in this process: any process's leader moves
// the checkpoint. For a blue/green projection it waits for the live
// generation, and follows a cut-over during the wait (see
// Awaiter.AwaitPartitions).
func (r *Runner) Await(ctx context.Context, name string, position int64) error {
	reg, err := r.lookup(name)
	if err != nil {
		return err
	}
	r.mu.Lock()
	if r.awaiter == nil {
		r.awaiter, err = NewAwaiter(r.pool, &AwaitOptions{Schema: r.cfg.Schema})
	}
	a := r.awaiter
	r.mu.Unlock()
	if err != nil {
		return err
	}
	parts, by := max(reg.opts.Partitions, 1), reg.opts.PartitionBy
	if by == "" {
		by = catchup.PartitionByStream
	}
	return a.await(ctx, name, reg.bg != nil, func(version int) (int, string) {
		if version == 0 || (reg.bg != nil && version == reg.bg.cfg.Version) {
			return parts, by
		}
		return 0, "" // another version's generation: its recorded layout, or every partition
	}, position)
}
