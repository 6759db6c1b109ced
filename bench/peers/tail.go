package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/google/uuid"
)

// tailResult is the correctness check of one contender: a reader follows the
// log from its start while 16 writers append single events and one unrelated
// transaction that has written a row stays open for a while.
type tailResult struct {
	Appended int64 `json:"appended"`
	// Delivered counts distinct appended events the reader was given.
	Delivered int64 `json:"delivered"`
	// Skipped counts appended events the reader was never given, after it
	// drained: for a position reader, events whose position was below one it
	// had already passed when they became visible.
	Skipped int64 `json:"skipped"`
	// Duplicates counts deliveries of an event already delivered.
	Duplicates int64 `json:"duplicates"`
	// Delays from an append returning to the reader being given its events.
	DelayP50 time.Duration `json:"delay_p50_ns"`
	DelayP99 time.Duration `json:"delay_p99_ns"`
	DelayMax time.Duration `json:"delay_max_ns"`
}

// tailCheck runs the correctness check for c, with an unrelated writing
// transaction held open for hold (none when hold is zero).
func tailCheck(ctx context.Context, cfg *config, c *contender, unrelated string, hold time.Duration) (*tailResult, error) {
	if err := c.reset(ctx); err != nil {
		return nil, err
	}
	const writers = 16
	appended := make([]map[uuid.UUID]time.Time, writers)
	for w := range appended {
		appended[w] = make(map[uuid.UUID]time.Time)
	}
	onAppend := func(w int, ids []uuid.UUID) {
		now := time.Now()
		for _, id := range ids {
			appended[w][id] = now
		}
	}

	seen := make(map[uuid.UUID]time.Time)
	var delivered, duplicates atomic.Int64
	tailCtx, stopTail := context.WithCancel(ctx)
	defer stopTail()
	tailErr := make(chan error, 1)
	go func() {
		tailErr <- c.tail(tailCtx, cfg.TailPoll, func(id uuid.UUID) {
			if _, dup := seen[id]; dup {
				duplicates.Add(1)
				return
			}
			seen[id] = time.Now()
			delivered.Add(1)
		})
	}()

	// The unrelated transaction: it writes a row (so it has a transaction
	// ID) a quarter into the run and stays open for cfg.Hold.
	var wg sync.WaitGroup
	holdErr := make(chan error, 1)
	wg.Go(func() {
		if hold <= 0 {
			holdErr <- nil
			return
		}
		if !sleep(ctx, cfg.TailDuration/4) {
			holdErr <- ctx.Err()
			return
		}
		holdErr <- holdTransaction(ctx, c, unrelated, hold)
	})
	n, _, err := appendFor(ctx, c, "tail", writers, 1, time.Now(), cfg.TailDuration, onAppend)
	wg.Wait()
	if err != nil {
		return nil, err
	}
	if err := <-holdErr; err != nil {
		return nil, err
	}

	// Drain: until every event is delivered or none arrived for cfg.Drain.
	last, lastChange := delivered.Load(), time.Now()
	for delivered.Load() < n && time.Since(lastChange) < cfg.Drain {
		select {
		case err := <-tailErr:
			return nil, errors.Wrapf(err, "%s: tailing reader", c.name)
		case <-time.After(20 * time.Millisecond):
		}
		if d := delivered.Load(); d != last {
			last, lastChange = d, time.Now()
		}
	}
	stopTail()
	if err := <-tailErr; err != nil {
		return nil, errors.Wrapf(err, "%s: tailing reader", c.name)
	}

	r := &tailResult{Appended: n, Duplicates: duplicates.Load()}
	var delays []time.Duration
	for _, m := range appended {
		for id, at := range m {
			got, ok := seen[id]
			if !ok {
				r.Skipped++
				continue
			}
			r.Delivered++
			delays = append(delays, max(got.Sub(at), 0))
		}
	}
	if len(delays) > 0 {
		slices.Sort(delays)
		r.DelayP50 = delays[len(delays)/2]
		r.DelayP99 = delays[len(delays)*99/100]
		r.DelayMax = delays[len(delays)-1]
	}
	return r, nil
}

// holdTransaction writes a row into the unrelated schema in a transaction
// that it keeps open for hold.
func holdTransaction(ctx context.Context, c *contender, schema string, hold time.Duration) error {
	tx, err := c.pool.Begin(ctx)
	if err != nil {
		return errors.Wrap(err, "begin the unrelated transaction")
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, query("UnrelatedWrite", schema)); err != nil {
		return errors.Wrap(err, "write in the unrelated transaction")
	}
	if !sleep(ctx, hold) {
		return ctx.Err()
	}
	return errors.Wrap(tx.Commit(ctx), "commit the unrelated transaction")
}

// describeTail is the one-line progress note of a finished check.
func describeTail(name string, r *tailResult) string {
	return fmt.Sprintf("%s: %d appended, %d skipped, %d duplicated, delay p50 %s p99 %s max %s",
		name, r.Appended, r.Skipped, r.Duplicates, r.DelayP50.Round(time.Microsecond), r.DelayP99.Round(time.Microsecond), r.DelayMax.Round(time.Millisecond))
}
