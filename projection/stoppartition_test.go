package projection_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/projection"
)

// Stop halts only the partition of the event it dead-letters
// (docs/guarantees.md, item 7): the subscriber's other partition keeps
// applying its streams' events, before and after the stop, while the
// stopped one applies nothing more and keeps its checkpoint at the failed
// event.
func TestFailureStopHaltsOnlyItsPartition(t *testing.T) {
	t.Parallel()
	for _, k := range failKinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			h := newFailHarness(t)
			const sub = "stopper"
			// A stream in each of the two partitions.
			byPart := map[int64]string{}
			for i := 0; len(byPart) < 2; i++ {
				s := fmt.Sprintf("acct-%d", i)
				p := h.queryInt(`SELECT annals.stream_partition($1, 2)`, s)
				if _, ok := byPart[p]; !ok {
					byPart[p] = s
				}
			}
			bad, good := byPart[0], byPart[1]
			stoppedAt := func(part int) (int64, *string) {
				t.Helper()
				var pos int64
				var reason *string
				err := h.pool.QueryRow(context.Background(), `SELECT position, stopped_reason FROM annals.checkpoints
					WHERE subscriber_id = $1 AND partition = $2`, sub, part).Scan(&pos, &reason)
				if errors.Is(err, pgx.ErrNoRows) {
					return -1, nil // not claimed yet
				}
				if err != nil {
					t.Fatal(err)
				}
				return pos, reason
			}

			handler, fh := h.handler(k, sub, failOn(bad, 2))
			run := h.newRunner(projection.RetryPolicy{MaxRetries: -1}, -1,
				failReg{handler, &projection.Options{OnDeadLetter: projection.Stop, Partitions: 2}})
			all := h.appendTo(bad, bad, good, bad, good)
			h.start(run)
			h.waitFor(failWait, "the stop and the other partition's events", func() bool {
				_, stopped := stoppedAt(0)
				return stopped != nil && len(h.seen(sub)) == 3
			})
			// More events for both partitions after the stop.
			all = append(all, h.appendTo(good, bad, good)...)
			want := []failEv{all[0], all[2], all[4], all[5], all[7]}
			h.waitFor(failWait, "the other partition after the stop", func() bool { return len(h.seen(sub)) == len(want) })
			h.checkApplied(sub, want)
			for _, ev := range []failEv{all[3], all[6]} {
				if n := fh.callsOf(ev.ID); n != 0 {
					t.Errorf("the stopped partition got %v %d times", ev, n)
				}
			}
			// As without partitions: the checkpoint is at the dead-lettered event.
			if pos, stopped := stoppedAt(0); pos != all[1].Pos || stopped == nil {
				t.Errorf("stopped partition: checkpoint %d, stopped %v; want %d, stopped", pos, stopped != nil, all[1].Pos)
			}
			h.waitFor(failWait, "the other partition's checkpoint", func() bool {
				pos, stopped := stoppedAt(1)
				return pos == all[7].Pos && stopped == nil
			})
		})
	}
}
