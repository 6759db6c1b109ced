package catchup

import (
	"context"
	"fmt"

	"github.com/cockroachdb/errors"
)

// ErrPartitionLayout is matched (errors.Is) by the error of a subscription
// run with another partition count or key than its subscriber's checkpoints
// were written under: a *PartitionLayoutError.
var ErrPartitionLayout = errors.New("catchup: the subscriber's partition layout changed")

// PartitionLayoutError says why a subscription was refused: its subscriber
// has a recorded layout (or, recorded before there were layouts, a
// checkpoint of a partition it would not have) that its Partitions or
// PartitionBy contradict. Run, CatchUp and TakeOver return it without
// claiming anything; nothing was read or delivered.
//
// Running a subscriber with another layout would move events to partitions
// whose checkpoints were written for other events, so some would be skipped
// and others delivered again. To change the layout, run the projection
// under a new name (a new subscriber, which starts from the beginning of
// the log), and retire the old one.
type PartitionLayoutError struct {
	// Subscriber is the subscriber's name.
	Subscriber string
	// Partitions and PartitionBy are what the subscription asked for
	// (PartitionBy canonical: "stream" for "").
	Partitions  int
	PartitionBy string
	// RecordedPartitions and RecordedPartitionBy are the subscriber's
	// recorded layout; 0 and "" when it has none.
	RecordedPartitions  int
	RecordedPartitionBy string
	// HighestPartition is the highest partition with a checkpoint, when
	// that is what refused the subscription: a subscriber that ran before
	// layouts were recorded, with HighestPartition+1 partitions. -1
	// otherwise.
	HighestPartition int
}

// Error implements error.
func (e *PartitionLayoutError) Error() string {
	if e.RecordedPartitions == 0 {
		return fmt.Sprintf("catchup: subscriber %q has checkpoints up to partition %d, so it ran with %s; asked for %s now; "+
			"changing a subscriber's partition count skips or repeats events: run it as before, or the new layout under a new subscriber name",
			e.Subscriber, e.HighestPartition, layoutString(e.HighestPartition+1, ""), layoutString(e.Partitions, e.PartitionBy))
	}
	return fmt.Sprintf("catchup: subscriber %q was run with %s; asked for %s now; "+
		"changing a subscriber's partition count or key skips or repeats events: run it as before, or the new layout under a new subscriber name",
		e.Subscriber, layoutString(e.RecordedPartitions, e.RecordedPartitionBy), layoutString(e.Partitions, e.PartitionBy))
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
// its subscriber has none, and refuses it with a *PartitionLayoutError
// (ErrPartitionLayout) if the subscriber has another. Run, CatchUp and
// TakeOver call it before they claim anything; call it yourself to refuse
// a misconfigured deployment at start-up rather than when a subscription
// starts. It asks the database once per subscriber and layout for the
// engine's life. Ephemeral subscriptions keep no checkpoint and pass.
func (e *Engine) CheckLayout(ctx context.Context, sub *Subscription) error {
	if sub.Ephemeral {
		return nil
	}
	n, by := layoutOf(sub)
	key := fmt.Sprintf("%d\x00%s\x00%s", n, by, sub.Name)
	if _, ok := e.layouts.Load(key); ok {
		return nil
	}
	// RecordLayout inserts the layout unless the subscriber has one or a
	// checkpoint contradicts it. A layout that a concurrent first run
	// inserted after this statement's snapshot is neither inserted nor
	// seen: read again.
	for attempt := 0; ; attempt++ {
		var (
			inserted bool
			recN     *int32
			recBy    *string
			highest  *int32
			refused  = &PartitionLayoutError{Subscriber: sub.Name, Partitions: n, PartitionBy: by, HighestPartition: -1}
		)
		if err := e.pool.QueryRow(ctx, e.q["RecordLayout"], sub.Name, n, by).Scan(&inserted, &recN, &recBy, &highest); err != nil {
			return errors.Wrapf(err, "catchup: record the partition layout of %s", sub.Name)
		}
		switch {
		case inserted:
		case recN != nil && recBy != nil:
			if int(*recN) != n || *recBy != by {
				refused.RecordedPartitions, refused.RecordedPartitionBy = int(*recN), *recBy
				return errors.WithStack(refused)
			}
		case highest != nil && int(*highest) != n-1:
			refused.HighestPartition = int(*highest)
			return errors.WithStack(refused)
		case attempt < 3:
			continue
		default:
			return errors.Newf("catchup: the partition layout of %s is neither recorded nor recordable", sub.Name)
		}
		e.layouts.Store(key, struct{}{})
		return nil
	}
}
