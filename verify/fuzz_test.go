package verify_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/verify"
)

// TestLegitimateOperationsReportNothing runs random mixes of what annals'
// functions do to a log (appends, recreations, soft and hard deletions,
// retention and truncation changes, scavenge and archive steps of any
// size, interleaved) and verifies the log after each: none of it may be
// reported. Each seed is fixed, so a failure is reproduced by its subtest
// (its name is the seed), and prints the operations that led to it.
func TestLegitimateOperationsReportNothing(t *testing.T) {
	t.Parallel()
	for seed := range uint64(4) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			legitimateOperations(t, seed, 60)
		})
	}
}

func legitimateOperations(t *testing.T, seed uint64, steps int) {
	ctx := context.Background()
	b := setup(t)
	r := rand.New(rand.NewPCG(seed, 7))
	schema := pgx.Identifier{b.db.Schema}.Sanitize()
	var hist []string
	streams := []string{"a", "b", "c", "d", "e"}
	for step := range steps {
		id := streams[r.IntN(len(streams))]
		var op string
		switch k := r.IntN(10); {
		case k < 4:
			evs := make([]eventstore.EventData, 1+r.IntN(3))
			for i := range evs {
				evs[i] = eventstore.EventData{Type: "T", Data: map[string]any{"step": step}}
			}
			_, err := b.store.Append(ctx, id, eventstore.Any, evs...)
			var de *eventstore.StreamDeletedError
			if errors.As(err, &de) && !de.Hard && r.IntN(2) == 0 {
				_, err = b.store.Append(ctx, id, eventstore.Exact(de.Version), evs...)
				op = fmt.Sprintf("recreate %s with %d events (%v)", id, len(evs), err)
			} else {
				op = fmt.Sprintf("append %d events to %s (%v)", len(evs), id, err)
			}
		case k == 4:
			hard := r.IntN(3) == 0
			_, err := b.store.DeleteStream(ctx, id, eventstore.Any, &eventstore.DeleteOptions{Hard: hard})
			op = fmt.Sprintf("delete %s, hard %v (%v)", id, hard, err)
		case k == 5:
			var ch eventstore.RetentionChange
			switch r.IntN(4) {
			case 0:
				ch.MaxCount = ptr(int64(r.IntN(4)))
			case 1:
				ch.TruncateBefore = ptr(int64(1 + r.IntN(12)))
			case 2:
				age := time.Duration(r.IntN(2)) * time.Microsecond
				ch.MaxAge = &age
			case 3:
				ch.MaxCount, ch.TruncateBefore = ptr(int64(1+r.IntN(3))), ptr(int64(1+r.IntN(8)))
			}
			_, err := b.store.SetStreamRetention(ctx, id, ch)
			op = fmt.Sprintf("retention of %s: %s (%v)", id, describeChange(ch), err)
		case k < 8:
			batch := 1 + r.IntN(8)
			_, err := b.db.Pool.Exec(ctx, fmt.Sprintf(`SELECT * FROM %s.scavenge('fuzz', NULL, $1)`, schema), batch)
			op = fmt.Sprintf("scavenge step of %d (%v)", batch, err)
		default:
			batch, before := 1+r.IntN(8), 1+r.IntN(200)
			_, err := b.db.Pool.Exec(ctx, fmt.Sprintf(`SELECT * FROM %s.archive('fuzz', $1, $2)`, schema), before, batch)
			op = fmt.Sprintf("archive step before %d of %d (%v)", before, batch, err)
		}
		hist = append(hist, op)
		rep, err := verify.Log(ctx, b.db.Pool, &verify.Config{Schema: b.db.Schema, PageSize: 7})
		if err != nil {
			t.Fatal(err)
		}
		if !rep.OK() {
			for i, h := range hist {
				t.Logf("step %d: %s", i, h)
			}
			for _, p := range rep.Problems {
				t.Errorf("seed %d, after step %d: %s: %s", seed, step, p.Kind, p.Message)
			}
			return
		}
	}
}

func describeChange(c eventstore.RetentionChange) string {
	s := ""
	if c.MaxCount != nil {
		s += fmt.Sprintf("max count %d ", *c.MaxCount)
	}
	if c.TruncateBefore != nil {
		s += fmt.Sprintf("truncate before %d ", *c.TruncateBefore)
	}
	if c.MaxAge != nil {
		s += fmt.Sprintf("max age %v ", *c.MaxAge)
	}
	return s
}
