package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/migrations"
)

var note = strings.Repeat("x", 120)

func data(i int) map[string]any { return map[string]any{"amount": i, "currency": "EUR", "note": note} }

func measure(ctx context.Context, prefix string, writers, n int, d time.Duration, fn func(ctx context.Context, stream string, version int64) error) float64 {
	var total atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(d)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			stream := fmt.Sprintf("%s-w%d", prefix, w)
			var v int64
			for time.Now().Before(deadline) {
				if err := fn(ctx, stream, v); err != nil {
					panic(err)
				}
				v += int64(n)
				total.Add(int64(n))
			}
		}()
	}
	wg.Wait()
	return float64(total.Load()) / time.Since(start).Seconds()
}

func main() {
	ctx := context.Background()
	cfg, _ := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
	cfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		panic(err)
	}
	if _, err := migrations.Up(ctx, pool, nil); err != nil {
		panic(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS raw_events (global_sequence bigserial PRIMARY KEY, event_id uuid NOT NULL UNIQUE,
	  stream_id text NOT NULL, stream_version bigint NOT NULL, event_type text NOT NULL, data json NOT NULL, metadata json,
	  recorded_at timestamptz NOT NULL DEFAULT clock_timestamp(), UNIQUE (stream_id, stream_version))`); err != nil {
		panic(err)
	}
	const n, writers = 100, 4
	raw := func(ctx context.Context, stream string, version int64) error {
		type item struct {
			EventID uuid.UUID      `json:"event_id"`
			Type    string         `json:"type"`
			Data    map[string]any `json:"data"`
		}
		items := make([]item, n)
		for i := range items {
			id, _ := uuid.NewV7()
			items[i] = item{id, "bench.deposited", data(i)}
		}
		b, _ := json.Marshal(items)
		_, err := pool.Exec(ctx, `INSERT INTO raw_events (event_id, stream_id, stream_version, event_type, data, metadata)
SELECT (t.e->>'event_id')::uuid, $1, $2 + t.ord, t.e->>'type', (t.e->'data')::json, (t.e->'metadata')::json
  FROM jsonb_array_elements($3::jsonb) WITH ORDINALITY AS t(e, ord)`, stream, version, b)
		return err
	}
	annals := func(s *eventstore.Store) func(ctx context.Context, stream string, version int64) error {
		return func(ctx context.Context, stream string, version int64) error {
			evs := make([]eventstore.EventData, n)
			for i := range evs {
				id, _ := uuid.NewV7()
				evs[i] = eventstore.EventData{ID: id, Type: "bench.deposited", Data: data(i)}
			}
			_, err := s.Append(ctx, stream, eventstore.Exact(version), evs...)
			return err
		}
	}
	def, err := eventstore.New(pool, nil)
	if err != nil {
		panic(err)
	}
	par, err := eventstore.New(pool, &eventstore.Config{GroupCommit: eventstore.GroupCommit{MaxEvents: 100, MaxInFlight: 4, ParallelEvents: -1}})
	if err != nil {
		panic(err)
	}
	run := uuid.NewString()[:6]
	label := os.Args[1]
	for r := range 3 {
		rr := measure(ctx, fmt.Sprintf("raw-%s-%d", run, r), writers, n, 3*time.Second, raw)
		d := measure(ctx, fmt.Sprintf("def-%s-%d", run, r), writers, n, 3*time.Second, annals(def))
		p := measure(ctx, fmt.Sprintf("par-%s-%d", run, r), writers, n, 3*time.Second, annals(par))
		fmt.Printf("%s round %d: raw %.0f  default %.0f (%.2f)  parallel groups %.0f (%.2f)\n", label, r+1, rr, d, d/rr, p, p/rr)
	}
}
