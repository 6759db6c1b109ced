package deadletter_test

import (
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/deadletter"
)

// BenchmarkList pages through 10,000 dead letters (the issue asks `annals
// dlq list` to answer in under 50 ms at that size), newest first, with and
// without filters. Each case runs beside raw/…: pgx running a query
// written for that one filter, with the same columns (SELECT * has them
// in List's order), order and limit, so the ratio is what List's general
// form (optional filters, a row beyond the page) costs.
//
// The data: 10 subscribers of 990 dead letters each, spread over 4
// partitions and 500 streams, a tenth of them open, plus a rare subscriber
// whose 100 dead letters are the oldest (a walk of the primary key, newest
// first, would pass over every other before it filled a page). LastPageBefore is the last
// page by the cursor Before, LastPage by Offset.
func BenchmarkList(b *testing.B) {
	db := annalstest.NewDB(b, nil)
	ctx := b.Context()
	_, err := db.Pool.Exec(ctx, `
		INSERT INTO annals.dead_letters
		       (subscriber_id, partition, event_id, global_sequence, stream_id, event_type, reason,
		        error, error_detail, attempts, status, first_failed_at, last_failed_at, created_at, updated_at)
		SELECT CASE WHEN g <= 100 THEN 'rare' ELSE 'sub-' || (g % 10) END, g % 4, gen_random_uuid(), g,
		       'stream-' || (g % 500), 'thing.happened', CASE WHEN g % 3 = 0 THEN 'parked' ELSE 'failed' END,
		       'handler failed: ' || g, repeat('stack frame line\n', 30), 4,
		       CASE (g / 10) % 10 WHEN 0 THEN 'open' WHEN 1 THEN 'skipped' ELSE 'resolved' END,
		       t, t, t, t
		  FROM generate_series(1, 10000) g,
		       LATERAL (SELECT now() - (10000 - g) * interval '1 second' AS t) ts;
		ANALYZE annals.dead_letters;`)
	if err != nil {
		b.Fatal(err)
	}
	store, err := deadletter.New(db.Pool, nil)
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		filter deadletter.Filter
		raw    string
		args   []any
	}{
		{"Newest", deadletter.Filter{},
			`SELECT * FROM annals.dead_letters ORDER BY id DESC LIMIT 100`, nil},
		{"Subscriber", deadletter.Filter{Subscriber: "sub-3"},
			`SELECT * FROM annals.dead_letters WHERE subscriber_id = $1 ORDER BY id DESC LIMIT 100`, []any{"sub-3"}},
		{"RareSubscriber", deadletter.Filter{Subscriber: "rare"},
			`SELECT * FROM annals.dead_letters WHERE subscriber_id = $1 ORDER BY id DESC LIMIT 100`, []any{"rare"}},
		{"OpenOfSubscriber", deadletter.Filter{Subscriber: "sub-3", Status: deadletter.StatusOpen},
			`SELECT * FROM annals.dead_letters WHERE subscriber_id = $1 AND status = 'open' ORDER BY id DESC LIMIT 100`, []any{"sub-3"}},
		{"LastPage", deadletter.Filter{Limit: 100, Offset: 9900},
			`SELECT * FROM annals.dead_letters ORDER BY id DESC LIMIT 100 OFFSET 9900`, nil},
		{"LastPageBefore", deadletter.Filter{Limit: 100, Before: 101},
			`SELECT * FROM annals.dead_letters WHERE id < 101 ORDER BY id DESC LIMIT 100`, nil},
	} {
		b.Run(c.name+"/deadletter", func(b *testing.B) {
			for b.Loop() {
				page, err := store.List(ctx, c.filter)
				if err != nil || len(page.DeadLetters) == 0 {
					b.Fatalf("List: %d rows, %v", len(page.DeadLetters), err)
				}
			}
		})
		b.Run(c.name+"/raw", func(b *testing.B) {
			for b.Loop() {
				rows, err := db.Pool.Query(ctx, c.raw, c.args...)
				if err != nil {
					b.Fatal(err)
				}
				n := 0
				var d deadletter.DeadLetter
				var reason, status string
				var first, last any
				_, err = pgx.ForEachRow(rows, []any{&d.ID, &d.Subscriber, &d.Partition, &d.EventID, &d.GlobalSequence, &d.StreamID,
					&d.EventType, &reason, &d.Error, &d.ErrorDetail, &d.Attempts, &status, &first, &last, &d.CreatedAt, &d.UpdatedAt}, func() error {
					n++
					return nil
				})
				if err != nil || n == 0 {
					b.Fatalf("raw: %d rows, %v", n, err)
				}
			}
		})
	}
}
