package checkpoint

import (
	"context"
	"crypto/md5"
	_ "embed"
	"encoding/hex"
	"math"
	"strconv"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/annals-dev/annals/internal/schemaname"
	"github.com/annals-dev/annals/internal/sqltmpl"
)

//go:embed queries.sql
var queriesSQL string

var (
	// ErrFenced is returned by Commit when another leader has claimed the
	// subscriber partition since this one did (the epoch moved on).
	ErrFenced = errors.New("checkpoint: fenced off: another leader has claimed this subscriber partition")
	// ErrMoved is returned by CommitFrom when the checkpoint is already past
	// the position its leader knows it at, in the leader's own epoch: a
	// commit of the leader's whose answer was lost (its connection failed
	// after the COMMIT was sent) has landed since. Nothing is committed;
	// the leader goes on from the stored checkpoint, and applying its
	// events again would apply them twice.
	ErrMoved = errors.New("checkpoint: moved past the position this leader knows: an earlier commit of its own, reported as failed, landed")
	// ErrNotFound is returned by Load and Move for a subscriber partition
	// with no checkpoint.
	ErrNotFound = errors.New("checkpoint: not found")
	// ErrInvalid is matched by bad arguments: empty subscriber, negative partition or position.
	ErrInvalid = errors.New("checkpoint: invalid argument")
)

// DB is what the store runs its statements on: a *pgx.Conn, a pgx.Tx or a
// *pgxpool.Pool.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Checkpoint is one subscriber partition's row.
type Checkpoint struct {
	// Subscriber is the subscriber's name.
	Subscriber string
	// Partition is the partition number, 0 for an unpartitioned subscriber.
	Partition int
	// Position is the global sequence of the last event processed (0: none).
	Position int64
	// Epoch is the fencing epoch of the current leader.
	Epoch int64
	// Owner is the instance that claimed the epoch ("" after an operator's Set).
	Owner string
	// UpdatedAt is when the row last changed.
	UpdatedAt time.Time
}

// Store runs the checkpoint statements for one schema.
type Store struct {
	q map[string]string
}

// FenceChannel returns the NOTIFY channel on which the statements that
// fence a leader of a subscriber partition in schema (an operator's Set and
// Move, package catchup's TakeOver and layout replacement) announce it,
// with FencePayload as the payload. Package catchup's Listener listens to
// it, so that a leader waiting idle for new events lets go at once instead
// of at its next poll. The name is the schema's followed by "_fences" (at
// most 63 bytes, PostgreSQL's limit, for the longest schema name allowed).
func FenceChannel(schema string) string { return schemaname.FenceChannel(schemaname.Or(schema)) }

// FencePayload returns the payload of a fence announcement of partition
// part of subscriber sub: the hex MD5 of the UTF-8 bytes of
// "subscriber:partition", which SQL computes as
// md5(convert_to(subscriber || ':' || partition, 'UTF8')). A digest, not
// the name: a NOTIFY payload is limited to 8000 bytes, and a subscriber
// name is not. An announcement is a hint, never data: a leader that gets
// it reads its checkpoint's epoch again.
func FencePayload(sub string, part int) string {
	sum := md5.Sum([]byte(sub + ":" + strconv.Itoa(part)))
	return hex.EncodeToString(sum[:])
}

// New returns a Store for the schema (default "annals").
func New(schema string) (*Store, error) {
	var err error
	if schema, err = schemaname.Resolve(schema); err != nil {
		return nil, err
	}
	q, err := sqltmpl.Named("queries.sql", queriesSQL, sqltmpl.NewData(schema))
	if err != nil {
		return nil, err
	}
	return &Store{q: q}, nil
}

func validate(sub string, part int) error {
	if sub == "" {
		return errors.Wrap(ErrInvalid, "subscriber name is empty")
	}
	if part < 0 {
		return errors.Wrapf(ErrInvalid, "partition %d is negative", part)
	}
	return nil
}

// Claim makes owner the leader of the subscriber partition: it creates the
// row at position 0 or increments its epoch, and returns the row. Run it on
// the connection that holds the partition's advisory lock.
func (s *Store) Claim(ctx context.Context, db DB, sub string, part int, owner string) (Checkpoint, error) {
	if err := validate(sub, part); err != nil {
		return Checkpoint{}, err
	}
	c := Checkpoint{Subscriber: sub, Partition: part}
	var o *string
	err := db.QueryRow(ctx, s.q["Claim"], sub, part, owner).Scan(&c.Position, &c.Epoch, &o, &c.UpdatedAt)
	if o != nil {
		c.Owner = *o
	}
	return c, errors.Wrapf(err, "checkpoint: claim %s/%d", sub, part)
}

// Load returns the subscriber partition's checkpoint, or ErrNotFound.
func (s *Store) Load(ctx context.Context, db DB, sub string, part int) (Checkpoint, error) {
	if err := validate(sub, part); err != nil {
		return Checkpoint{}, err
	}
	c := Checkpoint{Subscriber: sub, Partition: part}
	var o *string
	err := db.QueryRow(ctx, s.q["Load"], sub, part).Scan(&c.Position, &c.Epoch, &o, &c.UpdatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return c, errors.Wrapf(ErrNotFound, "checkpoint %s/%d", sub, part)
	}
	if o != nil {
		c.Owner = *o
	}
	return c, errors.Wrapf(err, "checkpoint: load %s/%d", sub, part)
}

// Commit moves the checkpoint to position if epoch is still the partition's
// epoch; otherwise it fails with ErrFenced. It never moves it backwards.
// A leader that may retry a commit whose answer it lost uses CommitFrom.
func (s *Store) Commit(ctx context.Context, db DB, sub string, part int, epoch, position int64) error {
	return s.CommitFrom(ctx, db, sub, part, epoch, math.MaxInt64, position)
}

// CommitFrom is Commit for a leader that knows the checkpoint at from (or
// behind it): it also fails, with ErrMoved, when the checkpoint is past
// from. A commit whose answer was lost may still land on the server after
// its leader has read the checkpoint again and applied the same events
// once more on another connection; both transactions pass the epoch fence,
// but only the first one to move the checkpoint past from commits (they
// serialize on the checkpoint's row). It never moves it backwards.
func (s *Store) CommitFrom(ctx context.Context, db DB, sub string, part int, epoch, from, position int64) error {
	if err := validate(sub, part); err != nil {
		return err
	}
	if position < 0 {
		return errors.Wrapf(ErrInvalid, "position %d is negative", position)
	}
	var got int64
	err := db.QueryRow(ctx, s.q["Commit"], sub, part, epoch, position, from).Scan(&got)
	if errors.Is(err, pgx.ErrNoRows) {
		// Which fence it was: read the row (the update changed nothing, so
		// the transaction, if any, is still usable). A read that fails says
		// fenced, which ends the leadership: safe either way.
		if c, lerr := s.Load(ctx, db, sub, part); lerr == nil && c.Epoch == epoch && c.Position > from {
			return errors.Wrapf(ErrMoved, "commit %s/%d at %d: the checkpoint is at %d, past %d", sub, part, position, c.Position, from)
		}
		return errors.Wrapf(ErrFenced, "commit %s/%d at epoch %d", sub, part, epoch)
	}
	return errors.Wrapf(err, "checkpoint: commit %s/%d", sub, part)
}

// Set moves the checkpoint to position unconditionally and bumps the epoch,
// so that a running leader is fenced off and re-reads from the new
// position; it creates the checkpoint if there is none. It touches nothing
// else: an operator moving an existing checkpoint calls Move, which also
// settles the dead letters a move back delivers again.
func (s *Store) Set(ctx context.Context, db DB, sub string, part int, position int64) (Checkpoint, error) {
	if err := validate(sub, part); err != nil {
		return Checkpoint{}, err
	}
	if position < 0 {
		return Checkpoint{}, errors.Wrapf(ErrInvalid, "position %d is negative", position)
	}
	c := Checkpoint{Subscriber: sub, Partition: part}
	var o *string
	err := db.QueryRow(ctx, s.q["Set"], sub, part, position).Scan(&c.Position, &c.Epoch, &o, &c.UpdatedAt)
	return c, errors.Wrapf(err, "checkpoint: set %s/%d", sub, part)
}

// Moved is what Move did: the checkpoint before and after the move, and
// how many dead letters it settled.
type Moved struct {
	// Before is the checkpoint as it was.
	Before Checkpoint
	// After is the checkpoint as it is now: at the new position, with the
	// epoch bumped and no owner.
	After Checkpoint
	// DeadLettersSettled counts the dead letters of the partition after the
	// new position that a move back settled as resolved (0 for any other
	// move).
	DeadLettersSettled int64
}

// Move is an operator's move of an existing checkpoint (annals checkpoint
// set, the console's checkpoint set): it moves the checkpoint to position
// and bumps the epoch, as Set does, and when position is before where the
// checkpoint was, it settles the partition's dead letters after position
// (open, retry, or skipped by an operator) as resolved, since their events
// are delivered again: one that fails again is open again, as after a
// rebuild. Without that a later retry of such a dead letter (annals dlq
// retry) would deliver its event a second time. It returns ErrNotFound, and
// changes nothing, when the partition has no checkpoint (Set creates one).
//
// It is one statement, which locks the row: in the caller's transaction,
// the move, the settling and whatever the caller writes (an audit entry)
// commit together.
func (s *Store) Move(ctx context.Context, db DB, sub string, part int, position int64) (Moved, error) {
	if err := validate(sub, part); err != nil {
		return Moved{}, err
	}
	if position < 0 {
		return Moved{}, errors.Wrapf(ErrInvalid, "position %d is negative", position)
	}
	m := Moved{Before: Checkpoint{Subscriber: sub, Partition: part}, After: Checkpoint{Subscriber: sub, Partition: part}}
	var bo, ao *string
	err := db.QueryRow(ctx, s.q["Move"], sub, part, position).Scan(&m.Before.Position, &m.Before.Epoch, &bo, &m.Before.UpdatedAt,
		&m.After.Position, &m.After.Epoch, &ao, &m.After.UpdatedAt, &m.DeadLettersSettled)
	if errors.Is(err, pgx.ErrNoRows) {
		return Moved{}, errors.Wrapf(ErrNotFound, "checkpoint %s/%d", sub, part)
	}
	if err != nil {
		return Moved{}, errors.Wrapf(err, "checkpoint: move %s/%d", sub, part)
	}
	if bo != nil {
		m.Before.Owner = *bo
	}
	if ao != nil {
		m.After.Owner = *ao
	}
	return m, nil
}

// List returns every checkpoint, ordered by subscriber and partition.
func (s *Store) List(ctx context.Context, db DB) ([]Checkpoint, error) {
	rows, err := db.Query(ctx, s.q["List"])
	if err != nil {
		return nil, errors.Wrap(err, "checkpoint: list")
	}
	var out []Checkpoint
	var c Checkpoint
	var o *string
	_, err = pgx.ForEachRow(rows, []any{&c.Subscriber, &c.Partition, &c.Position, &c.Epoch, &o, &c.UpdatedAt}, func() error {
		c.Owner = ""
		if o != nil {
			c.Owner = *o
		}
		out = append(out, c)
		return nil
	})
	return out, errors.Wrap(err, "checkpoint: list")
}

// Batcher keeps an observer's position in memory and writes it every N
// events or every interval, and on Flush. Not safe for concurrent use.
type Batcher struct {
	commit   func(ctx context.Context, position int64) error
	every    int
	interval time.Duration
	now      func() time.Time

	position  int64 // in memory
	flushed   int64 // last written
	pending   int
	lastFlush time.Time
}

// NewBatcher returns a Batcher that writes through commit (a fenced write of
// the position: Store.Commit, or an observer's catchup.Lease.CommitConn) every `every` events or
// `interval`, whichever comes first. position is the starting (stored)
// position. now may be nil (time.Now).
func NewBatcher(commit func(ctx context.Context, position int64) error, position int64, every int, interval time.Duration, now func() time.Time) *Batcher {
	if now == nil {
		now = time.Now
	}
	if every < 1 {
		every = 1
	}
	return &Batcher{commit: commit, every: every, interval: interval, now: now, position: position, flushed: position, lastFlush: now()}
}

// Advance records that everything through position is processed, counting
// events handled since the last call, and writes when a threshold is met.
func (b *Batcher) Advance(ctx context.Context, position int64, events int) error {
	if position > b.position {
		b.position = position
	}
	b.pending += events
	if b.pending >= b.every || b.now().Sub(b.lastFlush) >= b.interval {
		return b.Flush(ctx)
	}
	return nil
}

// Flush writes the in-memory position if it moved since the last write.
func (b *Batcher) Flush(ctx context.Context) error {
	if b.position == b.flushed {
		b.pending = 0
		b.lastFlush = b.now()
		return nil
	}
	if err := b.commit(ctx, b.position); err != nil {
		return err
	}
	b.flushed = b.position
	b.pending = 0
	b.lastFlush = b.now()
	return nil
}

// FlushIfDue writes the in-memory position if it moved and the interval has
// passed since the last write.
func (b *Batcher) FlushIfDue(ctx context.Context) error {
	if b.position == b.flushed || b.now().Sub(b.lastFlush) < b.interval {
		return nil
	}
	return b.Flush(ctx)
}

// Due returns when FlushIfDue will next write: the last write plus the
// interval, or the zero time when the position has not moved since the last
// write and nothing is due at all.
func (b *Batcher) Due() time.Time {
	if b.position == b.flushed {
		return time.Time{}
	}
	return b.lastFlush.Add(b.interval)
}

// Committed records that position was written by the caller (in a
// transaction of its own, e.g. with a dead letter): nothing is pending.
func (b *Batcher) Committed(position int64) {
	if position > b.position {
		b.position = position
	}
	if position > b.flushed {
		b.flushed = position
	}
	if b.position == b.flushed {
		b.pending = 0
	}
}

// Position returns the in-memory position.
func (b *Batcher) Position() int64 { return b.position }

// Flushed returns the last position written.
func (b *Batcher) Flushed() int64 { return b.flushed }
