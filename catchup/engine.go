package catchup

import (
	"context"
	_ "embed"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/advisorylock"
	"github.com/annals-dev/annals/checkpoint"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/errmark"
	"github.com/annals-dev/annals/internal/lockkey"
	"github.com/annals-dev/annals/internal/poolconn"
	"github.com/annals-dev/annals/internal/schemaname"
	"github.com/annals-dev/annals/internal/sqltmpl"
	"github.com/annals-dev/annals/internal/telemetry"
)

//go:embed queries.sql
var queriesSQL string

// Batch is what a Processor gets: the events after After that match the
// subscription, and Through, the position the batch covers (events between
// the last matching one and Through did not match and are done too).
type Batch struct {
	// After is the position the batch starts after (the cursor).
	After int64
	// Events are the matching events, in position order (may be empty).
	Events []eventstore.Event
	// Through is the position through which the batch accounts for every event.
	Through int64
	// Stopped is the reason the subscriber partition is halted (an operator
	// must act), or "". A stopped subscription processes nothing.
	Stopped string
	// Redeliveries counts dead letters an operator released for re-delivery.
	Redeliveries int
	// Unresolved counts dead letters not yet resolved (open or released):
	// while it is 0, no stream of the partition is parked.
	Unresolved int
	// Head is the newest position when the batch was read.
	Head int64

	// checkpoint is the checkpoint's position when the batch was read (0
	// for an ephemeral subscription).
	checkpoint int64
}

// Lease is one process's leadership of a subscriber partition.
type Lease struct {
	// Subscriber and Partition identify the checkpoint row.
	Subscriber string
	Partition  int
	// Epoch is the fencing epoch this leadership claimed.
	Epoch int64
	// Start is the checkpoint position when the leadership began.
	Start int64
	// Lock is the lease's own advisory lock, on a connection of its own
	// (TakeOver's leases); nil for a lease held on the engine's lock session
	// (Run, CatchUp) and for an ephemeral subscription. Use Do for the
	// lease's statements, whichever it is.
	Lock *advisorylock.Lock

	shared      *sharedLock   // the lock on the engine's lock session
	pool        *pgxpool.Pool // where Do runs for a shared lease
	checkpoints *checkpoint.Store
	stopping    <-chan struct{}
	changed     bool
	commitSQL   string // CommitFenced
	notifySQL   string // NotifyCheckpoint
	asyncSQL    string // AsyncCommit
	// behind: the batch in hand was read while the partition was behind its
	// head (and its target), and the subscription allows its commit not to
	// wait for its WAL flush (Subscription.SyncCommits unset).
	behind bool
	// CommitFencedHeld
	commitHeldSQL string
	// known is where this leadership knows the checkpoint (at it, or past
	// it for batched observer checkpoints): the position claimed, then the
	// cursor, set by the engine before each call of the processor, and each
	// move committed since. A commit fails with checkpoint.ErrMoved when the
	// stored checkpoint is past it: one of this leadership's commits
	// reported as failed landed.
	known atomic.Int64
}

// moved records that the lease's checkpoint was moved to position.
func (l *Lease) moved(position int64) {
	for {
		k := l.known.Load()
		if position <= k || l.known.CompareAndSwap(k, position) {
			return
		}
	}
}

// CommitTx writes the checkpoint at position in tx, fenced by the lease's
// epoch, and commits tx, in one round trip (the fenced update and COMMIT
// pipelined). On success tx is committed and must not be used again (not
// even rolled back); on failure it is not, and the caller rolls it back. A
// fenced lease gets checkpoint.ErrFenced and nothing is committed; so does
// a commit that finds the checkpoint past where the lease knows it
// (checkpoint.ErrMoved: an earlier commit of the lease's, reported as
// failed, landed since; the engine goes on from the checkpoint).
// Ephemeral leases only commit tx.
func (l *Lease) CommitTx(ctx context.Context, tx pgx.Tx, position int64) error {
	if l.Ephemeral() {
		return tx.Commit(ctx)
	}
	return l.CommitConn(ctx, tx.Conn(), false, position)
}

// CommitConn is CommitTx for a transaction run by hand on conn (the lock's
// connection): with begin, the transaction has not been begun yet and BEGIN
// is sent first in the same round trip (a batch that wrote nothing, an
// observer's checkpoint write). On failure the caller rolls back a
// transaction it began itself; one CommitConn began, it rolls back.
func (l *Lease) CommitConn(ctx context.Context, conn *pgx.Conn, begin bool, position int64) error {
	if position < 0 {
		return errors.Wrapf(checkpoint.ErrInvalid, "position %d is negative", position)
	}
	b := &pgx.Batch{}
	if begin {
		b.Queue("BEGIN")
	}
	switch {
	case l.shared != nil:
		k1, k2 := lockkey.Pair(l.shared.key)
		b.Queue(l.commitHeldSQL, l.Subscriber, l.Partition, l.Epoch, position, k1, k2, l.known.Load())
	case !l.Ephemeral():
		b.Queue(l.commitSQL, l.Subscriber, l.Partition, l.Epoch, position, l.known.Load())
	}
	if l.behind && l.asyncSQL != "" {
		b.Queue(l.asyncSQL)
	}
	b.Queue("COMMIT")
	notify := !l.Ephemeral() && l.notifySQL != "" && position > 0
	if notify {
		b.Queue(l.notifySQL, position, l.Partition, l.Subscriber)
	}
	br := conn.SendBatch(ctx, b)
	var err error
	for range b.Len() - btoi(notify) {
		if _, err = br.Exec(); err != nil {
			break
		}
	}
	if err == nil && notify {
		// The batch has committed; a notification that fails (a full
		// notification queue, say) only costs awaiters their poll, and must
		// not make the caller think the commit failed.
		_, _ = br.Exec()
	}
	if cerr := br.Close(); err == nil && !notify {
		err = cerr
	}
	if err != nil && begin {
		rollbackOpen(ctx, conn)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "22P02" && l.shared != nil && l.shared.server != 0 &&
		strings.Contains(pgErr.Message, "annals: checkpoint fenced") &&
		strings.Contains(pgErr.Message, ", server session "+strconv.FormatUint(uint64(l.shared.server), 10)+"\"") {
		// The transaction ran on the server session that holds the
		// partition's lock (CommitFencedHeld): fenced, as every commit
		// through that pooler will be, but by a misconfiguration.
		return errmark.Mark(errors.Wrapf(advisorylock.ErrPooledSession, "commit %s/%d at epoch %d: the transaction ran on the server session that holds the partition's lock",
			l.Subscriber, l.Partition, l.Epoch), checkpoint.ErrFenced)
	}
	if errors.As(err, &pgErr) && pgErr.Code == "22P02" && strings.Contains(pgErr.Message, "annals: checkpoint fenced") {
		return errors.Wrapf(checkpoint.ErrFenced, "commit %s/%d at epoch %d", l.Subscriber, l.Partition, l.Epoch)
	}
	if errors.As(err, &pgErr) && pgErr.Code == "22P02" && strings.Contains(pgErr.Message, "annals: checkpoint moved past") {
		return errors.Wrapf(checkpoint.ErrMoved, "commit %s/%d at %d: the checkpoint is past %d", l.Subscriber, l.Partition, position, l.known.Load())
	}
	if err == nil {
		l.moved(position)
	}
	return errors.Wrapf(err, "catchup: commit %s/%d at %d", l.Subscriber, l.Partition, position)
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Changed tells the engine that processing the batch in hand changed what
// the next read reports besides events (the processor wrote a dead letter or
// stopped the partition): a batch read ahead while it ran is discarded and
// read again. Call it from Process only.
func (l *Lease) Changed() { l.changed = true }

// Stopping is closed when the run is shutting down: a processor waiting to
// retry should give up its wait then (the batch in hand may still finish).
func (l *Lease) Stopping() <-chan struct{} { return l.stopping }

// Lost is closed when the lease's lock is lost or released (never, when
// ephemeral).
func (l *Lease) Lost() <-chan struct{} {
	switch {
	case l.Lock != nil:
		return l.Lock.Lost()
	case l.shared != nil:
		return l.shared.lost
	}
	return nil
}

// Err returns nil while the lease's lock is held; afterwards an error
// matching advisorylock.ErrLost or advisorylock.ErrReleased.
func (l *Lease) Err() error {
	switch {
	case l.Lock != nil:
		return l.Lock.Err()
	case l.shared != nil:
		return l.shared.Err()
	}
	return nil
}

// Ephemeral reports whether the lease belongs to a subscription without a
// lock or a stored checkpoint.
func (l *Lease) Ephemeral() bool { return l.Lock == nil && l.shared == nil }

// Do runs fn on a connection for the lease's statements: the lock's own
// connection for a lease with a Lock (TakeOver), else a connection of the
// engine's pool, held for the duration of fn. Either way what fn commits
// is protected by the epoch fence (Commit, CommitTx, CommitConn), not by
// the connection: a lease held on the lock session may lose its lock while
// fn runs, and a commit fenced since fails with checkpoint.ErrFenced. fn
// must not keep the connection or leave a transaction open (Do rolls it
// back and returns an error). On a lease with a Lock, fn must not leave
// the connection idle outside a transaction for the lock's FreezeTimeout
// either: nothing pings it meanwhile, and the server would end the
// session, which loses the lock (see advisorylock.Lock.Do). After the lock
// is lost or released, Do returns the lease's Err without calling fn.
func (l *Lease) Do(ctx context.Context, fn func(conn *pgx.Conn) error) error {
	if l.Lock != nil {
		return l.Lock.Do(ctx, fn)
	}
	if l.shared == nil {
		return errors.New("catchup: Do on an ephemeral lease")
	}
	if err := l.shared.Err(); err != nil {
		return err
	}
	pc, err := l.pool.Acquire(ctx)
	if err != nil {
		return errors.Wrapf(err, "catchup: %s/%d: acquire a connection", l.Subscriber, l.Partition)
	}
	defer pc.Release()
	conn := pc.Conn()
	// If the lock is lost (or given back: an abandoned batch) while fn
	// runs, end the connection's session under fn, so that its transaction
	// rolls back now and its row locks do not hold up the next leader.
	// The watcher has returned before the connection goes back to the pool
	// (deferred calls run last-in first-out), so it never closes a
	// connection someone else has acquired since.
	sock := conn.PgConn().Conn()
	done, watched := make(chan struct{}), make(chan struct{})
	defer func() { close(done); <-watched }()
	go func() {
		defer close(watched)
		select {
		case <-l.shared.lost:
			_ = sock.Close()
		case <-done:
		}
	}()
	err = fn(conn)
	if rollbackOpen(ctx, conn) {
		err = errors.CombineErrors(err, errors.Newf("catchup: %s/%d: fn returned with a transaction open; it was rolled back", l.Subscriber, l.Partition))
	}
	return err
}

// rollbackOpen rolls back the transaction open on conn, if any (closing
// conn if that fails), and reports whether there was one.
func rollbackOpen(ctx context.Context, conn *pgx.Conn) bool {
	if conn.IsClosed() || conn.PgConn().TxStatus() == 'I' {
		return false
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := conn.Exec(rctx, "ROLLBACK"); err != nil {
		_ = conn.Close(rctx)
	}
	return true
}

// Handover is closed when the engine asks the leader to hand the partition
// over to another instance (balanced leadership): the run ends its
// leadership as it does at shutdown. Nil for leases that are never asked.
func (l *Lease) Handover() <-chan struct{} {
	if l.shared == nil {
		return nil
	}
	return l.shared.handover
}

// Commit writes the checkpoint at position on db (the lock's connection or a
// transaction on it), fenced by the lease's epoch: checkpoint.ErrFenced when
// another leader has claimed the partition since, checkpoint.ErrMoved when
// the checkpoint is past where the lease knows it (see CommitTx). No-op when
// ephemeral.
func (l *Lease) Commit(ctx context.Context, db checkpoint.DB, position int64) error {
	if l.Ephemeral() {
		return nil
	}
	err := l.checkpoints.CommitFrom(ctx, db, l.Subscriber, l.Partition, l.Epoch, l.known.Load(), position)
	if err == nil {
		// In a transaction that may yet fail to commit: then the batch
		// fails, and the engine sets known to its cursor again before it
		// retries.
		l.moved(position)
	}
	return err
}

// Processor handles the batches of one subscription.
type Processor interface {
	// Start is called when a leadership (or an ephemeral run) begins, before
	// the first batch.
	Start(ctx context.Context, lease *Lease) error
	// Process handles batch and returns the position through which its work
	// is done (and its checkpoint, if it keeps one, is written or buffered):
	// batch.Through on success; on failure, how far it got (batch.After if
	// nowhere). The next batch starts after the returned position.
	Process(ctx context.Context, lease *Lease, batch Batch) (int64, error)
	// Redeliver is called when the batch read reports dead letters released
	// by an operator: deliver them (in position order) and resolve them.
	Redeliver(ctx context.Context, lease *Lease) error
	// Idle is called each time the subscription is about to wait for new
	// events: the moment to write a buffered checkpoint that is due. The
	// wait lasts up to a poll interval; a Processor whose work comes due
	// sooner says when by implementing IdleDeadliner.
	Idle(ctx context.Context, lease *Lease) error
	// End is called when the leadership (or the run) ends, however it ends:
	// write any buffered checkpoint now.
	End(ctx context.Context, lease *Lease) error
}

// IdleDeadliner is implemented by a Processor whose Idle has work that comes
// due at a time rather than with an event, such as a buffered checkpoint
// written every interval. A caught-up subscription then waits idle only
// until NextIdle (when that is sooner than its poll interval), and calls
// Idle again; without it, Idle is called once per poll interval or signal.
// Each idle wake is followed by a read of the log.
//
// A wrapper that embeds another Processor hides this method: it must
// forward NextIdle itself (the zero time when the wrapped one has none).
type IdleDeadliner interface {
	// NextIdle returns when Idle next has work due, or the zero time when
	// it has none. It is called right after Idle, on the same goroutine.
	//
	// After an Idle that returned nil, the work that was due is done: a
	// deadline that had passed when Idle was called must then move into the
	// future (or become zero). One that is still not in the future is taken
	// for work Idle cannot do yet, and Idle is called again only after
	// RetryBackoff, as after an Idle that failed, rather than at once.
	NextIdle() time.Time
}

// Subscription describes one subscriber partition to drive.
type Subscription struct {
	// Name is the subscriber's name: the checkpoint row and the lock key.
	Name string
	// Partition is this subscription's partition (0-based) of Partitions.
	Partition int
	// Partitions splits the subscriber by a stable hash
	// (annals.stream_partition) of each event's partition key. 0 or 1:
	// unpartitioned.
	Partitions int
	// PartitionBy is the partition key: PartitionByStream (the default,
	// ""), PartitionByCategory, or PartitionByMetadataPrefix and a field.
	PartitionBy string
	// Filter selects event types; the zero Filter selects all.
	Filter Filter
	// BatchSize is the number of events read per batch.
	BatchSize int
	// SyncCommits makes every batch commit through Lease.CommitTx or
	// CommitConn wait for its WAL flush. By default a batch read while the
	// partition is behind its head commits without waiting (see
	// "Committing while behind" in the package doc), unless its
	// transaction appended events.
	SyncCommits bool
	// Processor handles the batches.
	Processor Processor
	// Balance makes Run share the subscriber's partitions fairly with the
	// other instances that run it with Balance (see "Balanced leadership"
	// in the package documentation): with P partitions and N instances each
	// leads ⌊P/N⌋ or ⌈P/N⌉. Without it, Run takes the lock whenever it is
	// free. CatchUp and TakeOver ignore it.
	Balance bool
	// Ephemeral subscriptions take no lock and keep no checkpoint: they start
	// after StartAfter and keep their position in memory (a plain tail).
	Ephemeral  bool
	StartAfter int64
}

// Config configures an Engine. A nil *Config means defaults.
type Config struct {
	// Schema is the annals schema. Defaults to "annals".
	Schema string
	// Owner names this process in checkpoints.owner (the instance ID).
	// Defaults to "host:pid".
	Owner string
	// PollInterval is how long a caught-up subscription waits for a signal
	// before it reads again anyway. Defaults to 1s.
	PollInterval time.Duration
	// LockRetryInterval is how often a standby process polls the locks of
	// the partitions it stands by for, all in one statement on one session,
	// ±25% jitter. Defaults to DefaultLockRetryInterval (20ms). A leader that
	// stops gracefully hands over at once, whatever the interval.
	LockRetryInterval time.Duration
	// RetryBackoff is the pause before a failed batch is tried again, and
	// the first pause before the lock is tried again after a failure (the
	// pause then doubles up to 1s, or RetryBackoff if longer). Defaults to
	// 500ms.
	RetryBackoff time.Duration
	// ShutdownTimeout bounds how long the batch in hand may run after the
	// context ends before its context is cancelled; a batch that ignores
	// that for another second is abandoned (see Run). Defaults to 30s.
	ShutdownTimeout time.Duration
	// Lock configures the advisory locks' connections. Defaults to
	// advisorylock's defaults, with a Connect that opens them as the
	// engine's pool opens its own (its BeforeConnect and AfterConnect hooks
	// run at each dial).
	Lock *advisorylock.Config
	// ReadPool, if set, is where batches are read: a pool on a streaming
	// replica of the database (a hot standby). Locks, claims, checkpoints,
	// the batch header (epoch, stop reason, dead letters) and the
	// processors' transactions stay on the primary. Positions are commit
	// order and a replica replays commits in that order, so a replica shows
	// a prefix of the log: a lagging one delays delivery, it never skips.
	// Defaults to none: everything on the pool.
	ReadPool *pgxpool.Pool
	// ReadPollInterval is how long a caught-up subscription waits before
	// reading again when it reads from ReadPool: a NOTIFY comes from the
	// primary, possibly before the replica has the event. Defaults to
	// 100ms, at most PollInterval.
	ReadPollInterval time.Duration
	// ReadPoolWait bounds how long a Drive (a catch-up to a target, not a
	// leadership's live reads) waits in a row for ReadPool to show the
	// positions up to its target: past it, the Drive fails with
	// ErrReadPoolBehind after what it read, and the caller reads the rest
	// elsewhere (a blue/green rebuild, from the primary). A ReadPool
	// spanning several standbys (fallback hosts, a load balancer) may show
	// one a read further than the next. Defaults to 0: it waits as long as
	// the replica lags.
	ReadPoolWait time.Duration
	// ReadLagCheck is how often a live leadership reading from ReadPool
	// that finds nothing new checks that the replica keeps up: it compares
	// the replica's head with the primary's as of ReadLagCheck before (at
	// most one statement on the primary per ReadLagCheck/2, shared by the
	// engine's leaderships, only while one is idle). A replica
	// that has not replayed in that time what the primary had committed
	// (its replay paused, or lagging) is logged at WARN, at most once a
	// minute, with both heads and whether its replay is paused, and at INFO
	// once it has caught up: otherwise the subscriber would wait in silence.
	// Defaults to DefaultReadLagCheck (5s); negative: no check.
	ReadLagCheck time.Duration
	// Logger receives leadership changes and failures. Defaults to warnings
	// and errors on slog.Default() (information and debug records dropped).
	Logger *slog.Logger
	// OnLeadership is called with true when this process starts leading a
	// subscriber partition and with false when it stops. Defaults to nothing.
	OnLeadership func(sub string, partition int, epoch int64, leading bool)
	// OnProgress is called after each read of a led partition, and again
	// after each batch that got anywhere, with its cursor, the head (as of
	// the read), and the recording time of the oldest event not yet
	// processed (zero when caught up), for lag metrics. Defaults to nothing.
	OnProgress func(sub string, partition int, cursor, head int64, oldest time.Time)
	// WakeFor, when set, makes the Waker of each live leadership (see
	// WakeFor) in place of the engine's Listener, which still brings the
	// fence announcements. Defaults to nil: the Listener (NOTIFY).
	WakeFor WakeFor
	// HolderWarnAfter, when positive, makes the engine say when a partition
	// it wants (see "A lock no live instance holds" in the package doc)
	// stays held by another session that no live runner instance lists:
	// once the partition has been seen held for this long, one statement
	// looks up the holder, the instance registry (an instance whose
	// heartbeat is younger than HolderWarnAfter is live) and the
	// checkpoint, and when no live instance lists the partition and no
	// rebuild of it runs (RebuildKey), a WARN names the holder's backend
	// pid, what pg_stat_activity shows of it and the remedy; at most once
	// a minute per partition, and an INFO once the partition is free or a
	// live instance's again. The projection runner sets it to three of its
	// heartbeats (the threshold past which annals status calls an instance
	// stale). Defaults to 0: no check, and no statement.
	HolderWarnAfter time.Duration
	// RebuildKey returns the advisory-lock key that a rebuild of the
	// subscriber holds for its whole run ("": none), for HolderWarnAfter: a
	// rebuild leads its partitions without heartbeats, so a partition held
	// while a session holds that key is taken for the rebuild's, and nothing
	// is logged. Defaults to nil: no rebuild is recognised.
	RebuildKey func(subscriber string) string
}

// Engine drives subscriptions: leader election, catch-up, live tail.
type Engine struct {
	pool        *pgxpool.Pool
	connConfig  *pgx.ConnConfig
	schema      string
	listener    *Listener
	checkpoints *checkpoint.Store
	cfg         Config
	q           map[string]string
	sessions    *sessions
	// lockFailures logs the lock retries of all partitions (see
	// lockFailures).
	lockFailures *lockFailures
	// archived is the newest archived position a read saw (a hint: see
	// readBatches).
	archived atomic.Int64
	// headSample is the primary's head as last read for a readLag, shared
	// by the engine's leaderships (see primaryHead).
	headSample atomic.Pointer[headSample]
	// takeOverSeen, when set (tests), replaces the backend PID TakeOver
	// looks for in pg_locks.
	takeOverSeen func(pid uint32) uint32
}

// NewEngine returns an Engine reading through pool. listener may be nil for
// engines that only catch up (CatchUp) or take over (TakeOver); Run then
// polls, and a leader fenced while it waits idle notices only at its next
// poll. With Config.WakeFor, pass a Listener all the same: it brings the
// fence announcements (see "Announcing a fence" in the package doc).
func NewEngine(pool *pgxpool.Pool, listener *Listener, cfg *Config) (*Engine, error) {
	if pool == nil {
		return nil, errors.New("catchup: pool is nil")
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	var err error
	if c.Schema, err = schemaname.Resolve(c.Schema); err != nil {
		return nil, err
	}
	if c.Owner == "" {
		c.Owner = DefaultOwner()
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.PollInterval, time.Second)
	def(&c.LockRetryInterval, DefaultLockRetryInterval)
	def(&c.RetryBackoff, 500*time.Millisecond)
	def(&c.ShutdownTimeout, 30*time.Second)
	def(&c.ReadPollInterval, 100*time.Millisecond)
	if c.ReadLagCheck == 0 {
		c.ReadLagCheck = DefaultReadLagCheck
	}
	c.ReadPollInterval = min(c.ReadPollInterval, c.PollInterval)
	if c.Logger == nil {
		c.Logger = telemetry.DefaultLogger()
	}
	cps, err := checkpoint.New(c.Schema)
	if err != nil {
		return nil, err
	}
	q, err := sqltmpl.Named("queries.sql", queriesSQL, sqltmpl.NewData(c.Schema))
	if err != nil {
		return nil, err
	}
	// ReadBatchArchive: ReadBatch over the whole log (see queries.sql).
	hot := "." + `"events" ev` + "\n"
	if !strings.Contains(q["ReadBatch"], hot) {
		hot = ".events ev\n"
	}
	if strings.Count(q["ReadBatch"], hot) != 1 {
		return nil, errors.New("catchup: ReadBatch does not read the events table as expected")
	}
	q["ReadBatchArchive"] = strings.Replace(q["ReadBatch"], hot, strings.Replace(hot, "events", "events_all", 1), 1)
	// On the lock's connection a cancelled statement (a handler's timeout) must
	// be cancelled on the server, not end the session: pgx's default closes
	// the connection, which would release the lock and restart leadership on
	// the same event forever instead of recording a failed attempt.
	cc := pool.Config().ConnConfig.Copy()
	cc.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: pc, DeadlineDelay: 5 * time.Second}
	}
	// The lock sessions log in as the pool's connections do (its
	// BeforeConnect and AfterConnect, at every dial), unless Lock names a
	// Connect of its own.
	c.Lock = poolconn.LockConfig(pool, lockConfig(c.Lock, c.Schema))
	e := &Engine{pool: pool, connConfig: cc, schema: c.Schema, listener: listener, checkpoints: cps, cfg: c, q: q}
	e.sessions = newSessions(e)
	e.lockFailures = newLockFailures(c.Logger)
	return e, nil
}

// ErrStopped is returned by CatchUp for a subscriber partition halted by
// the Stop policy: an operator must retry or skip its dead letter.
var ErrStopped = errors.New("catchup: subscriber is stopped")

// ErrReadPoolBehind is returned by a Drive whose ReadPool has not shown
// the positions up to its target for Config.ReadPoolWait.
var ErrReadPoolBehind = errors.New("catchup: the read pool is behind the drive's target")

// LockKey returns the advisory-lock key of a subscriber partition:
// "schema:subscriber:partition".
func LockKey(schema, subscriber string, partition int) string {
	return fmt.Sprintf("%s:%s:%d", schemaname.Or(schema), subscriber, partition)
}

// Head returns the newest position.
func (e *Engine) Head(ctx context.Context) (int64, error) {
	var h int64
	err := e.pool.QueryRow(ctx, e.q["Head"]).Scan(&h)
	return h, errors.Wrap(err, "catchup: read head")
}

// ReadHead returns the newest position the engine's reads see: the head as
// Config.ReadPool shows it when the engine has one, else Head. A replica
// shows a prefix of the log (positions are commit order, replayed in that
// order), so every event up to its head can be read there, and a Drive to
// it never waits for the replica; its head is at or behind the primary's
// (Head), by the replica's lag.
func (e *Engine) ReadHead(ctx context.Context) (int64, error) {
	if e.cfg.ReadPool == nil {
		return e.Head(ctx)
	}
	var h int64
	err := e.cfg.ReadPool.QueryRow(ctx, e.q["Head"]).Scan(&h)
	return h, errors.Wrap(err, "catchup: read the read pool's head")
}

// Run drives sub until ctx ends: it stands by until it holds the
// subscription's lock, then leads (catch up, then live) until the lock is
// lost, and stands by again. After ctx ends, the batch in hand finishes
// (bounded by ShutdownTimeout), buffered checkpoints are flushed, and the
// lock is released. It returns nil then. A batch that ignores the end of its
// context for a second more is abandoned: its connection is closed under it
// (the transaction rolls back, the next leader processes it again) and Run
// returns without waiting for the handler.
func (e *Engine) Run(ctx context.Context, sub *Subscription) error {
	if err := e.validate(sub); err != nil {
		return err
	}
	procCtx, stop := e.processContext(ctx)
	defer stop()
	if sub.Ephemeral {
		lease := &Lease{Subscriber: sub.Name, Partition: sub.Partition, Start: sub.StartAfter}
		err := e.lead(ctx, procCtx, sub, lease, math.MaxInt64)
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	log := e.cfg.Logger.With(slog.String("subscriber", sub.Name), slog.Int("partition", sub.Partition))
	var g *group
	if sub.Balance {
		g = e.sessions.join(sub.Name, max(sub.Partitions, 1))
		defer e.sessions.leave(g)
		// At shutdown the member slot goes first, so that the other members'
		// shares grow before this one's partitions are released.
		stop := context.AfterFunc(ctx, func() { e.sessions.depart(g) })
		defer stop()
	}
	backoff := e.cfg.RetryBackoff
	for ctx.Err() == nil {
		lease, err := e.standBy(ctx, sub, g)
		if errors.Is(err, ErrPartitionLayout) {
			return err
		}
		if err != nil {
			if ctx.Err() == nil {
				// During an outage every partition fails here about once a
				// second: the engine logs the first failure of all of them
				// at WARN, the repeats DEBUG (see lockFailures).
				e.lockFailures.failed(ctx, sub, err)
				sleep(ctx, jitter(backoff))
				backoff = min(backoff*2, max(maxReconnectBackoff, e.cfg.RetryBackoff))
			}
			continue
		}
		e.lockFailures.took(ctx, sub)
		backoff = e.cfg.RetryBackoff
		log.InfoContext(ctx, "annals: leading", slog.Int64("epoch", lease.Epoch), slog.Int64("checkpoint", lease.Start))
		// A handover request ends the leadership as a shutdown does: the
		// batch in hand finishes, the checkpoint is flushed, the lock is
		// given back and announced.
		leadCtx, endLead := context.WithCancel(ctx)
		if h := lease.Handover(); h != nil {
			go func() {
				select {
				case <-h:
					endLead()
				case <-leadCtx.Done():
				}
			}()
		}
		abandoned, err := e.leadBounded(leadCtx, procCtx, sub, lease)
		handedOver := ctx.Err() == nil && leadCtx.Err() != nil
		endLead()
		if abandoned {
			log.WarnContext(ctx, "annals: the batch in hand did not stop after ShutdownTimeout; abandoned it",
				slog.Int64("epoch", lease.Epoch), slog.Duration("shutdown_timeout", e.cfg.ShutdownTimeout))
			return nil
		}
		e.release(procCtx, lease)
		if ctx.Err() != nil {
			return nil
		}
		if handedOver && err == nil {
			log.InfoContext(ctx, "annals: handed over", slog.Int64("epoch", lease.Epoch))
			continue
		}
		switch {
		case errors.Is(err, advisorylock.ErrPooledSession):
			// A pooler in transaction mode ran the batch on the lock's own
			// server session, where no commit can pass the lock check: the
			// partition stalls until the pooler is out of the lock's path.
			// The error says so, and what to do.
			log.WarnContext(ctx, "annals: stopped leading: a pooler ran the batch on the server session of the partition's lock", slog.Int64("epoch", lease.Epoch), telemetry.Err(err))
		case errors.Is(err, checkpoint.ErrFenced):
			// Another leader (or a rebuild) claimed the partition: the
			// fencing did its work, and the lease is theirs; how this one
			// lost its lock, if it did, advisorylock warns of.
			log.InfoContext(ctx, "annals: stopped leading: the partition was claimed by another leader, a rebuild or an operator (annals checkpoint set)", slog.Int64("epoch", lease.Epoch), telemetry.Err(err))
		default:
			log.WarnContext(ctx, "annals: stopped leading", slog.Int64("epoch", lease.Epoch), telemetry.Err(err))
		}
		if lease.shared != nil && errors.Is(err, advisorylock.ErrLost) {
			// The lock session ended (killed, or the server restarted): the
			// poller opens a new one, paced by its own back-off, and this
			// partition stands by again at once. A pause here left it (and,
			// balanced, every partition owed to this member, whose new
			// session holds a member slot at once) without a leader until
			// the orphan rule gave it to another member, ~250 ms later.
			continue
		}
		sleep(ctx, jitter(e.cfg.RetryBackoff))
	}
	return nil
}

// maxReconnectBackoff caps the doubling pause between attempts to take a
// subscription's lock after a failure (the database is down, say). With the
// ±50% jitter a runner tries again at least every 1.5 s, so it resumes within
// about that (plus a connect and a claim) of the database accepting
// connections again: a longer pause left projections idle for tens of
// seconds after writes had resumed. A connection attempt per partition and
// second is cheap, for PostgreSQL and for the log.
const maxReconnectBackoff = time.Second

// CatchUp processes sub through position target (typically the head when
// called) and returns: it waits for the subscription's lock (a live leader
// elsewhere blocks it), claims it, processes, flushes and releases.
func (e *Engine) CatchUp(ctx context.Context, sub *Subscription, target int64) error {
	if err := e.validate(sub); err != nil {
		return err
	}
	if sub.Ephemeral {
		lease := &Lease{Subscriber: sub.Name, Partition: sub.Partition, Start: sub.StartAfter}
		return e.lead(ctx, ctx, sub, lease, target)
	}
	lease, err := e.standBy(ctx, sub, nil)
	if errors.Is(err, ErrPartitionLayout) {
		return err // refused before it waited for anything
	}
	if err != nil {
		return errors.Wrapf(err, "catchup: waiting for the lock of %s/%d", sub.Name, sub.Partition)
	}
	err = e.lead(ctx, ctx, sub, lease, target)
	e.release(ctx, lease)
	return err
}

func (e *Engine) validate(sub *Subscription) error {
	switch {
	case sub == nil || sub.Processor == nil:
		return errors.New("catchup: subscription without a processor")
	case sub.Name == "":
		return errors.New("catchup: subscription name is empty")
	case sub.Partitions > 1 && (sub.Partition < 0 || sub.Partition >= sub.Partitions):
		return errors.Newf("catchup: partition %d is outside 0..%d", sub.Partition, sub.Partitions-1)
	case sub.Partitions <= 1 && sub.Partition != 0:
		return errors.Newf("catchup: partition %d of an unpartitioned subscription", sub.Partition)
	case sub.BatchSize < 0:
		return errors.New("catchup: negative batch size")
	}
	return ParsePartitionBy(sub.PartitionBy)
}

// abandonGrace is how long Run waits, after the batch in hand's context was
// cancelled (ShutdownTimeout after Run's), for the batch to return before it
// abandons it. A statement on the lock's connection is cancelled by the
// server at once, so a batch that honours its context returns well within it.
const abandonGrace = time.Second

// leadBounded leads until lead returns, or until the batch in hand has
// ignored the end of procCtx for abandonGrace (a handler stuck outside the
// database). Then it does not wait for it: it releases the lease with an
// ended context, which closes the lock's connection under the batch, so its
// transaction rolls back and the lock is free for the next leader, which
// processes the batch again; and it returns abandoned. The goroutine running
// the batch ends when the handler returns.
func (e *Engine) leadBounded(ctx, procCtx context.Context, sub *Subscription, lease *Lease) (abandoned bool, err error) {
	leadDone := make(chan error, 1)
	go func() { leadDone <- e.lead(ctx, procCtx, sub, lease, math.MaxInt64) }()
	procDone := procCtx.Done()
	var grace <-chan time.Time
	for {
		select {
		case err := <-leadDone:
			return false, err
		case <-procDone:
			procDone = nil
			grace = time.After(abandonGrace)
		case <-grace:
			if e.cfg.OnLeadership != nil {
				e.cfg.OnLeadership(lease.Subscriber, lease.Partition, lease.Epoch, false)
			}
			ended, cancel := context.WithCancel(context.Background())
			cancel()
			if lease.Lock != nil {
				_ = lease.Lock.Release(ended)
			} else {
				// The batch runs on a pool connection: giving the lock back
				// lets the next leader claim, which fences its commit.
				e.releaseLock(context.Background(), lease)
			}
			return true, nil
		}
	}
}

// processContext returns the context batches run under: it outlives ctx by
// up to ShutdownTimeout so that the batch in hand can finish.
func (e *Engine) processContext(ctx context.Context) (context.Context, func()) {
	procCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		select {
		case <-done:
		case <-ctx.Done():
			select {
			case <-done:
			case <-time.After(e.cfg.ShutdownTimeout):
				e.cfg.Logger.Warn("annals: shutdown timeout: cancelling the batch in hand")
				cancel()
			}
		}
	}()
	return procCtx, func() { close(done); cancel() }
}

func (e *Engine) release(ctx context.Context, lease *Lease) {
	if e.cfg.OnLeadership != nil {
		e.cfg.OnLeadership(lease.Subscriber, lease.Partition, lease.Epoch, false)
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	e.releaseLock(rctx, lease)
}

// lead processes batches from the lease's checkpoint until ctx ends, the
// lock is lost, or (target < MaxInt64) the cursor reaches target.
func (e *Engine) lead(ctx, procCtx context.Context, sub *Subscription, lease *Lease, target int64) error {
	lost := lease.Lost()
	live := target == math.MaxInt64
	var signal, fenced <-chan struct{}
	var waker Waker
	if live {
		var stopWaker func()
		waker, stopWaker = e.waker(ctx, sub, lease)
		defer stopWaker()
		if e.listener != nil && !lease.Ephemeral() {
			// An announced fence of the partition cuts every wait short, so
			// that the next read finds the epoch changed, whatever the
			// waker (see "Announcing a fence" in the package doc).
			var unsubscribe func()
			fenced, unsubscribe = e.listener.subscribeFence(sub.Name, sub.Partition)
			defer unsubscribe()
		}
	}
	if waker != nil {
		var unsubscribe func()
		signal, unsubscribe = waker.Subscribe()
		defer unsubscribe()
		// Listen before the first read, so nothing committed while catching up
		// goes unnoticed. Without a listener within a poll interval, poll.
		select {
		case <-waker.Listening():
		case <-time.After(e.cfg.PollInterval):
		case <-ctx.Done():
			return nil
		}
	}
	lease.stopping = ctx.Done()
	lease.known.Store(lease.Start)
	if err := sub.Processor.Start(procCtx, lease); err != nil {
		return errors.Wrap(err, "catchup: start processor")
	}
	defer func() {
		// A cancelled context must not cost the final flush; the lock still
		// fences it.
		ectx, cancel := context.WithTimeout(context.WithoutCancel(procCtx), 5*time.Second)
		defer cancel()
		_ = sub.Processor.End(ectx, lease)
	}()

	batchSize := sub.BatchSize
	if batchSize <= 0 {
		batchSize = 500
	}
	cursor := lease.Start
	lease.known.Store(cursor)
	// Reading ahead (see the package doc): pending are batches read
	// ahead, in order; next is a read ahead in flight, which is always
	// waited for before lead returns.
	var (
		pending []Batch
		next    chan readAhead
	)
	defer func() {
		if next != nil {
			<-next
		}
	}()
	// idle is the IDLE state: flush what is due, then wait for a signal, a
	// poll interval, the processor's next deadline (IdleDeadliner), or the
	// lock's loss.
	deadliner, _ := sub.Processor.(IdleDeadliner)
	// due is the deadline NextIdle returned last (zero: none).
	var due time.Time
	idle := func() error {
		// floor keeps a deadline already past (a write that failed, or that
		// came due just now) from spinning: after a failure the write is
		// tried again after RetryBackoff, as a failed batch is, and so is
		// a deadline that Idle, called after it, did not move (see
		// IdleDeadliner): 1 ms waits would each be followed by a read.
		floor := time.Millisecond
		called := time.Now()
		lease.known.Store(cursor)
		if err := sub.Processor.Idle(procCtx, lease); err != nil {
			if isFatal(err) {
				return err
			}
			e.cfg.Logger.WarnContext(ctx, "annals: flushing the checkpoint failed", slog.String("subscriber", sub.Name), telemetry.Err(err))
			floor = e.cfg.RetryBackoff
		}
		d := e.cfg.PollInterval
		if e.cfg.ReadPool != nil {
			d = e.cfg.ReadPollInterval
		}
		if deadliner != nil {
			next := deadliner.NextIdle()
			if !due.IsZero() && !called.Before(due) && !next.IsZero() && time.Until(next) <= 0 {
				floor = e.cfg.RetryBackoff
			}
			due = next
			if !next.IsZero() {
				d = min(d, max(time.Until(next), floor))
			}
		}
		return e.wait(ctx, lost, fenced, signal, d)
	}
	// atHead: the last batch, processed completely, was read up to the head
	// of its snapshot, so the next read would find only what was committed
	// since, which a signal announces: wait for it instead of reading at
	// once (a live subscription's second, empty read per batch). Only when
	// the signals are the Listener's NOTIFYs, sent after the commit is
	// visible, and the reads come from the primary: a replica may not have
	// replayed what a signal announced, and a WAL wake may come a moment
	// before the commit is visible, and the old immediate second read then
	// often caught it.
	atHead := false
	notified := waker != nil && waker == Waker(e.listener) && e.cfg.ReadPool == nil
	// slowest is about the longest recent Process call (see the read
	// ahead); until a batch has been timed, as if slow.
	slowest := aheadQuick
	// redelivered is how many released dead letters the read before the
	// last re-delivery counted, when that re-delivery returned nil (0
	// otherwise); stuck says that a warning about it was logged.
	redelivered, stuck := 0, false
	// behindSince is when a Drive began to wait for ReadPool to show more
	// (see ReadPoolWait); zero while its reads get somewhere.
	var behindSince time.Time
	// lag watches the replica of a live leadership reading from ReadPool
	// (see readLag).
	var lag readLag
	// readFails is the run of failed reads (see readFailures).
	var readFails readFailures
	for {
		if ctx.Err() != nil {
			if live {
				return nil
			}
			if cursor >= target {
				// Everything through target is processed; ctx ended during
				// the look for more (released dead letters, say).
				return errors.Wrapf(ctx.Err(), "catchup: %s/%d reached %d, then stopped before it had looked for released dead letters", sub.Name, sub.Partition, target)
			}
			return errors.Wrapf(ctx.Err(), "catchup: %s/%d stopped at %d before reaching %d", sub.Name, sub.Partition, cursor, target)
		}
		select {
		case <-lost:
			return lease.Err()
		default:
		}
		if atHead {
			atHead = false
			if err := idle(); err != nil {
				return err
			}
			continue
		}
		if len(pending) == 0 && next != nil {
			r := <-next
			next = nil
			if r.err == nil {
				pending = r.batches
			}
		}
		var batch Batch
		var err error
		if len(pending) > 0 && pending[0].After == cursor {
			batch, pending = pending[0], pending[1:]
		} else {
			pending = nil
			batch, err = e.read(ctx, sub, lease, cursor, batchSize, target)
		}
		if err != nil {
			if ctx.Err() != nil {
				continue // the loop's top: nil when live, else stopped short of target
			}
			if isFatal(err) {
				return err
			}
			readFails.failed(ctx, e, sub, err)
			if !live {
				return err
			}
			if err := e.wait(ctx, lost, fenced, nil, e.cfg.RetryBackoff); err != nil {
				return err
			}
			continue
		}
		readFails.ok(ctx, e, sub)
		if batch.checkpoint > cursor {
			// The checkpoint is past the cursor in this leadership's epoch,
			// which only this leadership's commits move: one of them whose
			// answer was lost (the connection failed after the COMMIT was
			// sent, and the batch was taken as failed) had committed. Go on
			// from it: the events up to it are applied, and applying them
			// again would apply them twice.
			e.cfg.Logger.WarnContext(ctx, "annals: a commit reported as failed had committed; going on from the checkpoint",
				slog.String("subscriber", sub.Name), slog.Int("partition", sub.Partition),
				slog.Int64("cursor", cursor), slog.Int64("checkpoint", batch.checkpoint))
			cursor = batch.checkpoint
			pending = nil
			if next != nil {
				<-next
				next = nil
			}
			continue
		}
		if e.cfg.OnProgress != nil && !lease.Ephemeral() {
			var oldest time.Time
			if len(batch.Events) > 0 {
				oldest = batch.Events[0].RecordedAt
			}
			e.cfg.OnProgress(sub.Name, sub.Partition, cursor, batch.Head, oldest)
		}
		if batch.Redeliveries > 0 {
			// The batches read ahead carry the same header, stale once the
			// re-delivery has settled what it counted: each would ask for a
			// re-delivery again (and find nothing, and wait a RetryBackoff).
			// Read again after it.
			pending = nil
			if next != nil {
				<-next
				next = nil
			}
			if redelivered > 0 && batch.Redeliveries >= redelivered {
				// The last re-delivery returned nil and yet settled none
				// of what the read counted (a processor that cannot
				// re-deliver, or entries it cannot see): the count would
				// not drain, and re-reading at once would spin. Try again
				// after a RetryBackoff, as after a failed re-delivery.
				if !stuck {
					stuck = true
					e.cfg.Logger.WarnContext(ctx, "annals: released dead letters are not being re-delivered; retrying",
						slog.String("subscriber", sub.Name), slog.Int("partition", sub.Partition), slog.Int("released", batch.Redeliveries))
				}
				if err := e.wait(ctx, lost, fenced, nil, e.cfg.RetryBackoff); err != nil {
					return err
				}
			}
			redelivered = 0
			lease.known.Store(cursor)
			if err := sub.Processor.Redeliver(procCtx, lease); err != nil {
				if isFatal(err) {
					return err
				}
				e.cfg.Logger.WarnContext(ctx, "annals: re-delivering dead letters failed",
					slog.String("subscriber", sub.Name), slog.Int("partition", sub.Partition), telemetry.Err(err))
				if err := e.wait(ctx, lost, fenced, nil, e.cfg.RetryBackoff); err != nil {
					return err
				}
			} else {
				redelivered = batch.Redeliveries
			}
			continue
		}
		redelivered, stuck = 0, false
		if batch.Stopped != "" {
			if !live {
				return errors.Wrapf(ErrStopped, "%s/%d: %s", sub.Name, sub.Partition, batch.Stopped)
			}
			if err := e.wait(ctx, lost, fenced, signal, e.cfg.PollInterval); err != nil {
				return err
			}
			continue
		}
		if batch.Through <= cursor {
			if !live && e.cfg.ReadPool != nil && cursor < target {
				// The replica has not replayed through target yet: wait for
				// it, for at most ReadPoolWait in a row if bounded.
				if behindSince.IsZero() {
					behindSince = time.Now()
				} else if e.cfg.ReadPoolWait > 0 && time.Since(behindSince) >= e.cfg.ReadPoolWait {
					return errors.Wrapf(ErrReadPoolBehind, "%s/%d: at %d for %s, the target is %d",
						sub.Name, sub.Partition, cursor, e.cfg.ReadPoolWait, target)
				}
				if err := e.wait(ctx, lost, fenced, nil, e.cfg.ReadPollInterval); err != nil {
					return err
				}
				continue
			}
			if !live {
				return nil // target is beyond the head: nothing more to read
			}
			lag.idle(ctx, e, sub, batch.Head)
			if err := idle(); err != nil {
				return err
			}
			continue
		}
		behindSince = time.Time{}
		// Read the next batches while this one is processed (see "Reading
		// ahead" in the package doc): only when the last batch known is
		// full, so more is likely there, and nothing about the partition is
		// pending that its processing may change.
		last := batch
		if len(pending) > 0 {
			last = pending[len(pending)-1]
		}
		if next == nil && len(last.Events) == batchSize && last.Through < target &&
			batch.Unresolved == 0 && batch.Redeliveries == 0 && batch.Stopped == "" {
			// Several batches at once only while batches are quick: what is
			// read ahead carries its read's header (stop reason, released
			// dead letters), so a slow processor would notice an operator's
			// action only after working through them.
			n := 1
			if slowest < aheadQuick {
				n = aheadBatches(batchSize)
			}
			next = make(chan readAhead, 1)
			go func(after int64) {
				bs, err := e.readBatches(ctx, sub, lease, after, batchSize, n, target)
				next <- readAhead{batches: bs, err: err}
			}(last.Through)
		}
		lease.changed = false
		lease.behind = !sub.SyncCommits && batch.Through < min(batch.Head, target)
		started := time.Now()
		lease.known.Store(cursor)
		done, err := sub.Processor.Process(procCtx, lease, batch)
		slowest = max(slowest*7/8, time.Since(started)) // decays over a few quick batches
		lease.behind = false
		atHead = live && notified && err == nil && done == batch.Through && !lease.changed && len(batch.Events) < batchSize &&
			batch.Through >= batch.Head && len(pending) == 0 && next == nil
		if err != nil || done != batch.Through || lease.changed {
			// What was read ahead may be stale (a dead letter, a stop) or
			// start elsewhere: read again.
			pending = nil
			if next != nil {
				<-next
				next = nil
			}
		}
		if done > cursor {
			cursor = done
		}
		if e.cfg.OnProgress != nil && !lease.Ephemeral() && done > batch.After {
			// Report what the batch got through: the report before it
			// carried the cursor it started from, and a batch that reached
			// the head is followed by no read (atHead) until the next
			// signal or poll, which would leave the lag at the batch's size.
			e.progressAfter(sub, batch, cursor)
		}
		if err != nil {
			if isFatal(err) {
				return err
			}
			if errors.Is(err, checkpoint.ErrMoved) {
				// A commit of this leadership's that was reported as
				// failed has landed, and nothing of this batch committed:
				// read again at once, and go on from the checkpoint (the
				// read's header has it past the cursor).
				e.cfg.Logger.DebugContext(ctx, "annals: the checkpoint moved past the batch's start; reading again",
					slog.String("subscriber", sub.Name), slog.Int("partition", sub.Partition),
					slog.Int64("after", cursor), telemetry.Err(err))
				continue
			}
			e.cfg.Logger.WarnContext(ctx, "annals: batch failed; retrying",
				slog.String("subscriber", sub.Name), slog.Int("partition", sub.Partition),
				slog.Int64("after", cursor), telemetry.Err(err))
			if err := e.wait(ctx, lost, fenced, nil, e.cfg.RetryBackoff); err != nil {
				return err
			}
		}
	}
}

// progressAfter reports to OnProgress that sub's cursor is at cursor after
// batch: caught up (no oldest unprocessed event) when it reached the batch's
// head, else with the first event of the batch it did not get through. When
// it got through the whole batch short of the head, the age of the next
// event is unknown; the next batch's read, which follows at once, reports
// it.
func (e *Engine) progressAfter(sub *Subscription, batch Batch, cursor int64) {
	if cursor >= batch.Head {
		e.cfg.OnProgress(sub.Name, sub.Partition, cursor, batch.Head, time.Time{})
		return
	}
	for _, ev := range batch.Events {
		if ev.GlobalSequence > cursor {
			e.cfg.OnProgress(sub.Name, sub.Partition, cursor, batch.Head, ev.RecordedAt)
			return
		}
	}
}

// readAhead is what a read ahead returns: consecutive batches, or an error
// (then the loop reads again itself, and meets the error there if it
// persists).
type readAhead struct {
	batches []Batch
	err     error
}

// aheadEvents is about how many events a read ahead asks for: several
// batches in one statement, so that a partition far behind its head pays
// one round trip and one statement start per few thousand events rather
// than per batch, while what is held in memory stays bounded (about this
// many events read ahead, plus the chunk being read).
const aheadEvents = 4000

// aheadQuick: a read ahead asks for several batches only while the recent
// batches were each processed within it (about 8 of them are then read
// ahead, so what they say about the partition is at most ~0.4 s old when
// the last is processed).
const aheadQuick = 50 * time.Millisecond

// aheadBatches is how many batches of batchSize a read ahead asks for.
func aheadBatches(batchSize int) int { return max(1, aheadEvents/batchSize) }

// ErrEndLeadership, matched by an error a Processor returns, ends the
// leadership as fencing does (the engine stands by and claims again, from
// the checkpoint, after RetryBackoff), without claiming that another leader
// took over: for a processor that cannot go on from where the engine's
// cursor is (the relay, after a publish failed).
var ErrEndLeadership = errors.New("catchup: the processor ended its leadership")

// isFatal reports errors that end a leadership: fencing, a lost lock, and
// a processor's ErrEndLeadership.
func isFatal(err error) bool {
	return errors.Is(err, checkpoint.ErrFenced) || errors.Is(err, advisorylock.ErrLost) || errors.Is(err, advisorylock.ErrReleased) ||
		errors.Is(err, ErrEndLeadership)
}

// wait returns after d, on a signal, on an announced fence of the
// partition (the caller's next read finds out whether it is fenced), or
// with an error when the lock is lost; nil when ctx ends (the caller checks
// ctx).
func (e *Engine) wait(ctx context.Context, lost, fenced, signal <-chan struct{}, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-lost:
		return errors.Wrap(advisorylock.ErrLost, "catchup: lock lost while waiting")
	case <-fenced:
	case <-signal:
	case <-t.C:
	}
	return nil
}

// read fetches the next batch after cursor.
// A leader (not an ephemeral subscription) whose epoch is no longer the
// checkpoint's is told so with checkpoint.ErrFenced.
func (e *Engine) read(ctx context.Context, sub *Subscription, lease *Lease, after int64, limit int, target int64) (Batch, error) {
	bs, err := e.readBatches(ctx, sub, lease, after, limit, 1, target)
	if err != nil {
		return Batch{}, err
	}
	return bs[0], nil
}

// readBatches reads up to batchSize × n events after cursor in one
// statement and returns them as consecutive batches of batchSize (the last
// may be shorter, or empty when nothing matched). Every batch carries the
// one header the statement read.
func (e *Engine) readBatches(ctx context.Context, sub *Subscription, lease *Lease, after int64, batchSize, n int, target int64) ([]Batch, error) {
	var regex *string
	if re := sub.Filter.Regex(); re != "" {
		regex = &re
	}
	key, err := parsePartitionBy(sub.PartitionBy)
	if err != nil {
		return nil, err
	}
	readPool := e.pool
	if e.cfg.ReadPool != nil {
		readPool = e.cfg.ReadPool
	}
	limit := batchSize * n
	// The hot read (ReadBatch) sees the events table alone; below the
	// newest archived position the events come from ReadBatchArchive. The
	// engine remembers the newest archived position it saw, so that a
	// cursor in the archive goes there directly; a stale memory only costs
	// a second read, as ReadBatch returns the position from the snapshot
	// it read.
	query := "ReadBatch"
	if after < e.archived.Load() {
		query = "ReadBatchArchive"
	}
	var (
		h      batchHeader
		chunks [][]eventstore.Event
	)
	for {
		rows, err := readPool.Query(ctx, e.q[query], binaryResults, after, limit, regex, max(sub.Partitions, 1), sub.Partition, target, sub.Name, key.kind, key.field)
		if err != nil {
			return nil, errors.Wrap(err, "catchup: read batch")
		}
		if h, chunks, err = scanBatch(rows, batchSize); err != nil {
			return nil, errors.Wrap(err, "catchup: read batch")
		}
		e.archived.Store(h.archived)
		if query == "ReadBatchArchive" || after >= h.archived {
			break
		}
		query = "ReadBatchArchive"
	}
	if e.cfg.ReadPool != nil && !lease.Ephemeral() {
		if err := e.pool.QueryRow(ctx, e.q["ReadHeader"], sub.Name, sub.Partition).Scan(&h.epoch, &h.stopped, &h.retry, &h.unresolved, &h.checkpoint); err != nil {
			return nil, errors.Wrap(err, "catchup: read the batch header")
		}
	}
	if !lease.Ephemeral() && h.epoch != lease.Epoch {
		return nil, errors.Wrapf(checkpoint.ErrFenced, "catchup: %s/%d: the checkpoint's epoch is no longer %d", sub.Name, sub.Partition, lease.Epoch)
	}
	if len(chunks) == 0 {
		chunks = [][]eventstore.Event{make([]eventstore.Event, 0)}
	}
	total := 0
	for _, c := range chunks {
		total += len(c)
	}
	batches := make([]Batch, 0, len(chunks))
	for i, c := range chunks {
		b := Batch{After: after, Events: c, Head: h.head}
		if !lease.Ephemeral() {
			b.Redeliveries, b.Unresolved, b.Stopped, b.checkpoint = h.retry, h.unresolved, h.stopped, h.checkpoint
		}
		if i < len(chunks)-1 || total == limit {
			// Not the last batch, or the read was cut at its limit: this
			// batch accounts for the events up to its last one.
			b.Through = c[len(c)-1].GlobalSequence
		} else {
			// Fewer than the limit matched: every event up to the head
			// (and target) has been considered.
			b.Through = min(max(h.head, after), target)
		}
		batches = append(batches, b)
		after = b.Through
	}
	return batches, nil
}

func jitter(d time.Duration) time.Duration {
	return d/2 + rand.N(d+1)
}

// sleep waits for d or until ctx ends (then returns its error).
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
