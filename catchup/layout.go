package catchup

import (
	"context"
	"fmt"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/annals-dev/annals/checkpoint"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/errmark"
)

// ErrPartitionLayout is matched (errors.Is) by the error of a subscription
// run with another partition count or key than its subscriber's checkpoints
// were written under: a *PartitionLayoutError.
var ErrPartitionLayout = errors.New("catchup: the subscriber's partition layout changed")

// PartitionLayoutError says why a subscription was refused: its subscriber
// has a recorded layout (or, from before layouts were recorded, checkpoints
// of another count) that its Partitions or PartitionBy contradict, and
// events were processed under it. Run, CatchUp and TakeOver return it
// without claiming anything; nothing was read or delivered.
//
// Running a subscriber with another layout would move events to partitions
// whose checkpoints were written for other events, so some would be skipped
// and others delivered again. A subscriber none of whose checkpoints ever
// moved past 0 takes a new layout (nothing was processed under the old
// one, and no rebuild owns its checkpoints). Otherwise, to change the
// layout: a projection's rebuild with projection.RebuildOptions.NewLayout,
// a blue/green read model's new BlueGreen.Version, or the subscriber under
// a new name (which starts from the beginning of the log).
type PartitionLayoutError struct {
	// Subscriber is the subscriber's name.
	Subscriber string
	// Partitions and PartitionBy are what the subscription asked for
	// (PartitionBy canonical: "stream" for "" and for one partition).
	Partitions  int
	PartitionBy string
	// RecordedPartitions and RecordedPartitionBy are the subscriber's
	// recorded layout; 0 and "" when it has none.
	RecordedPartitions  int
	RecordedPartitionBy string
	// HighestPartition and Checkpoints describe the checkpoints of a
	// subscriber that ran before layouts were recorded, when they refused
	// the subscription (-1 and 0 otherwise): checkpoints for each of the
	// partitions 0..HighestPartition mean it ran with HighestPartition+1;
	// fewer mean it ran with more than HighestPartition.
	HighestPartition int
	Checkpoints      int
}

// Error implements error.
func (e *PartitionLayoutError) Error() string {
	const why = "changing a subscriber's partition count or key skips or repeats events: run it as before, " +
		"or rebuild the projection with the new layout (RebuildOptions.NewLayout, projections rebuild --new-layout), " +
		"or run the new layout under a new subscriber name"
	switch {
	case e.RecordedPartitions > 0:
		return fmt.Sprintf("catchup: subscriber %q was run with %s; asked for %s now; %s",
			e.Subscriber, layoutString(e.RecordedPartitions, e.RecordedPartitionBy), layoutString(e.Partitions, e.PartitionBy), why)
	case e.Checkpoints == e.HighestPartition+1:
		return fmt.Sprintf("catchup: subscriber %q has checkpoints for partitions 0-%d, so it ran with %s; asked for %s now; %s",
			e.Subscriber, e.HighestPartition, layoutString(e.HighestPartition+1, ""), layoutString(e.Partitions, e.PartitionBy), why)
	}
	return fmt.Sprintf("catchup: subscriber %q has a checkpoint for partition %d, so it ran with more than %s; asked for %s now; %s",
		e.Subscriber, e.HighestPartition, layoutString(e.Partitions, ""), layoutString(e.Partitions, e.PartitionBy), why)
}

// Is reports whether target is ErrPartitionLayout.
func (e *PartitionLayoutError) Is(target error) bool { return target == ErrPartitionLayout }

func layoutString(partitions int, by string) string {
	switch {
	case partitions <= 1:
		return "1 partition"
	case by == "":
		return fmt.Sprintf("%d partitions", partitions)
	}
	return fmt.Sprintf("%d partitions by %s", partitions, by)
}

// layoutOf returns sub's layout as recorded: the count (at least 1) and the
// canonical key ("stream" for "", and for every unpartitioned subscriber,
// whose key decides nothing).
func layoutOf(sub *Subscription) (int, string) {
	n := max(sub.Partitions, 1)
	if n == 1 || sub.PartitionBy == "" {
		return n, PartitionByStream
	}
	return n, sub.PartitionBy
}

// CheckLayout records sub's partition layout (Partitions, PartitionBy) if
// its subscriber has none, replaces it while every checkpoint of the
// subscriber is at 0 and no rebuild owns one (fencing the leaders of the
// old one, and announcing it so that idle ones let go at once), and
// otherwise refuses another with a *PartitionLayoutError
// (ErrPartitionLayout). Run, CatchUp and TakeOver call it before they
// stand by, and every claim of a checkpoint is made only while the
// recorded layout is the subscription's; call it yourself to refuse a
// misconfigured deployment at start-up. Ephemeral subscriptions keep no
// checkpoint and pass.
func (e *Engine) CheckLayout(ctx context.Context, sub *Subscription) error {
	if sub.Ephemeral {
		return nil
	}
	n, by := layoutOf(sub)
	// A layout that a concurrent first run inserted after RecordLayout's
	// snapshot was taken is neither inserted nor seen: read again.
	// RecordLayout runs READ COMMITTED whatever the session's
	// default_transaction_isolation: under REPEATABLE READ or SERIALIZABLE,
	// its ON CONFLICT on a layout that a concurrent first run inserted after
	// its snapshot fails to serialize (40001) instead of reading it.
	for attempt := 0; ; attempt++ {
		var (
			written bool
			recN    *int32
			recBy   *string
			highest *int32
			count   int64
			moved   bool
			refused = &PartitionLayoutError{Subscriber: sub.Name, Partitions: n, PartitionBy: by, HighestPartition: -1}
		)
		if err := e.recordLayout(ctx, sub.Name, n, by, &written, &recN, &recBy, &highest, &count, &moved); err != nil {
			return notGranted(errors.Wrapf(err, "catchup: record the partition layout of %s", sub.Name))
		}
		switch {
		case written:
			return nil
		case recN != nil && recBy != nil:
			if int(*recN) == n && *recBy == by {
				return nil
			}
			refused.RecordedPartitions, refused.RecordedPartitionBy = int(*recN), *recBy
			return errors.WithStack(refused)
		case highest != nil && moved:
			refused.HighestPartition, refused.Checkpoints = int(*highest), int(count)
			return errors.WithStack(refused)
		case attempt < 3:
			continue
		}
		return errors.Newf("catchup: the partition layout of %s is neither recorded nor recordable", sub.Name)
	}
}

// recordLayout runs RecordLayout for subscriber name, n partitions by key
// by, in a READ COMMITTED transaction (BEGIN, the statement and COMMIT in
// one round trip), and scans its row into dest. A batch that fails leaves
// its connection in a transaction, which the pool discards.
func (e *Engine) recordLayout(ctx context.Context, name string, n int, by string, dest ...any) error {
	b := &pgx.Batch{}
	b.Queue("BEGIN ISOLATION LEVEL READ COMMITTED")
	b.Queue(e.q["RecordLayout"], name, n, by)
	b.Queue("COMMIT")
	br := e.pool.SendBatch(ctx, b)
	_, err := br.Exec()
	if err == nil {
		err = br.QueryRow().Scan(dest...)
	}
	if err == nil {
		_, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return err
}

// claimLaidOut is TakeOver's claim of sub's checkpoint (its partition) for
// this engine, on db: the connection holding the partition's lock, or the
// pool (to fence the leader before the lock is taken). It is the checkpoint
// package's Claim, made only while the subscriber's recorded layout is
// sub's (a layout replaced since CheckLayout refuses it with a
// *PartitionLayoutError), announced on the fence channel (so that a leader
// waiting idle lets go at once), in a transaction of its own in which no
// lock_timeout or statement_timeout of the server's applies: ctx alone
// bounds the wait for a checkpoint row held elsewhere for a moment.
func (e *Engine) claimLaidOut(ctx context.Context, db claimDB, sub *Subscription) (checkpoint.Checkpoint, error) {
	n, by := layoutOf(sub)
	return e.claimTx(ctx, db, sub, statement{sql: e.q["ClaimUnbounded"]},
		statement{e.q["ClaimAnnounced"], []any{sub.Name, sub.Partition, e.cfg.Owner, n, by}})
}

// claimDB is where a claim runs: a connection (the lock session's, a
// TakeOver lock's) or the pool.
type claimDB interface {
	checkpoint.DB
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// statement is a statement to queue and its arguments.
type statement struct {
	sql  string
	args []any
}

// claimTx runs a claim in a transaction of its own on db: BEGIN, setup
// (which sets the transaction's timeouts), claim (which returns the
// checkpoint row, or no row when the layout refuses it) and COMMIT, in one
// round trip: a takeover waits for it. A claim that fails leaves no
// transaction open on a connection (it is rolled back); a pool's
// connection left in a failed transaction is discarded by the pool. The
// transaction is READ COMMITTED whatever the session's
// default_transaction_isolation: a claim that waits for the checkpoint row
// (a leader's commit in flight) then updates the row as committed; under
// REPEATABLE READ or SERIALIZABLE it would fail to serialize (40001).
func (e *Engine) claimTx(ctx context.Context, db claimDB, sub *Subscription, setup, claim statement) (checkpoint.Checkpoint, error) {
	b := &pgx.Batch{}
	b.Queue("BEGIN ISOLATION LEVEL READ COMMITTED")
	b.Queue(setup.sql, setup.args...)
	b.Queue(claim.sql, claim.args...)
	b.Queue("COMMIT")
	br := db.SendBatch(ctx, b)
	var c checkpoint.Checkpoint
	_, err := br.Exec()
	if err == nil {
		_, err = br.Exec()
	}
	if err == nil {
		c, err = scanClaim(sub, br.QueryRow())
	}
	noRow := errors.Is(err, pgx.ErrNoRows)
	if err == nil || noRow {
		if _, cerr := br.Exec(); cerr != nil {
			err = cerr
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	switch {
	case noRow && errors.Is(err, pgx.ErrNoRows):
		return c, e.layoutRefused(ctx, db, sub)
	case err != nil:
		if conn, ok := db.(*pgx.Conn); ok {
			rollbackOpen(ctx, conn)
		}
		return c, errors.Wrapf(err, "catchup: claim %s/%d", sub.Name, sub.Partition)
	}
	return c, nil
}

// scanClaim scans the row of sub's Claim statement (pgx.ErrNoRows: the
// recorded layout is another one).
func scanClaim(sub *Subscription, row pgx.Row) (checkpoint.Checkpoint, error) {
	c := checkpoint.Checkpoint{Subscriber: sub.Name, Partition: sub.Partition}
	var o *string
	err := row.Scan(&c.Position, &c.Epoch, &o, &c.UpdatedAt)
	if o != nil {
		c.Owner = *o
	}
	return c, err
}

// layoutRefused is the error of a claim that the recorded layout refused:
// a *PartitionLayoutError saying what the layout is now (read here, not
// CheckLayout, which could replace it back).
func (e *Engine) layoutRefused(ctx context.Context, db checkpoint.DB, sub *Subscription) error {
	n, by := layoutOf(sub)
	refused := &PartitionLayoutError{Subscriber: sub.Name, Partitions: n, PartitionBy: by, HighestPartition: -1}
	var recN int32
	if err := db.QueryRow(ctx, e.q["Layout"], sub.Name).Scan(&recN, &refused.RecordedPartitionBy); err != nil {
		return errors.Wrapf(err, "catchup: claim %s/%d: read the subscriber's partition layout", sub.Name, sub.Partition)
	}
	refused.RecordedPartitions = int(recN)
	return errors.WithStack(refused)
}

// claimBounded is the lock session's claim of sub's checkpoint on conn:
// the checkpoint package's Claim, made only while the recorded layout is
// sub's, in a transaction whose lock_timeout is claimLockTimeout, so that a
// checkpoint row held elsewhere holds up the lock session's poller for that
// long at most (isClaimTimeout tells that failure apart). Not announced:
// the partition's lock was free, so no leader is left to tell.
func (e *Engine) claimBounded(ctx context.Context, conn *pgx.Conn, sub *Subscription) (checkpoint.Checkpoint, error) {
	n, by := layoutOf(sub)
	return e.claimTx(ctx, conn, sub, statement{e.q["ClaimLockTimeout"], []any{claimLockTimeoutSetting}},
		statement{e.q["Claim"], []any{sub.Name, sub.Partition, e.cfg.Owner, n, by}})
}

// notGranted marks err, when PostgreSQL refused it for want of a privilege
// (SQLSTATE 42501), as eventstore.ErrNotGranted and says what mends it. The
// first statement of a runner's start that meets such a refusal is
// CheckLayout's, on subscriber_layouts (migration 0022): a role granted
// by an older annals lacks what later migrations added until 'annals
// grant' runs again, which 'annals migrate' does not do.
func notGranted(err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
		return err
	}
	return errmark.Mark(errors.Wrap(err,
		"the runner's role lacks a grant on the annals schema (after an upgrade, a role granted by an older annals lacks what the new migrations added): "+
			"run 'annals grant runner ROLE' as the schema's owner"), eventstore.ErrNotGranted)
}
