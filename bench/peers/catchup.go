package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/errors"
)

// catchupContenders are the contenders of the catch-up workload: the raw
// reader reads the unordered contender's table (the locked one's is the same
// table, so it is left out).
var catchupContenders = []string{annalsName, rawName, watermillName}

// fillBatch is the number of events per append while filling a log.
const fillBatch = 1000

// fill resets c and appends n events to it, fillBatch per append (one new
// stream per append), from two writers, then vacuums and analyzes its table
// so that no reader pays for setting hint bits.
func fill(ctx context.Context, c *contender, n int) error {
	if err := c.reset(ctx); err != nil {
		return err
	}
	calls := (n + fillBatch - 1) / fillBatch
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for range 2 {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= calls || ctx.Err() != nil {
					return
				}
				ids := newIDs(min(fillBatch, n-i*fillBatch))
				if err := c.append(ctx, fmt.Sprintf("fill-%d", i), 0, ids); err != nil {
					errs <- errors.Wrapf(err, "%s: fill", c.name)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	table := map[string]string{annalsName: "events", rawName: "events", rawLockedName: "events", watermillName: "watermill_" + wmTopic}[c.name]
	_, err := c.pool.Exec(ctx, query("Vacuum", c.schema, table))
	return errors.Wrapf(err, "%s: vacuum", c.name)
}
