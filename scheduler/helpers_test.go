package scheduler

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/locktrace"
)

// t0 is the fake clocks' start: a whole second, like cron ticks.
var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// newScheduler returns a Scheduler on a pool of its own (its own
// connections, as another process would have).
func newScheduler(t *testing.T, db *annalstest.DB, cfg *Config) *Scheduler {
	t.Helper()
	return newTracedScheduler(t, db, cfg, nil)
}

// newTracedScheduler is newScheduler with tr (if not nil) tracing every
// round trip of the scheduler's pool.
func newTracedScheduler(t *testing.T, db *annalstest.DB, cfg *Config, tr *locktrace.Tracer) *Scheduler {
	t.Helper()
	pcfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.MaxConns = 4
	if tr != nil {
		pcfg.ConnConfig.Tracer = tr
	}
	pool, err := pgxpool.NewWithConfig(t.Context(), pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store, err := eventstore.New(pool, &eventstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// run runs s.Run until the test ends and checks that it returned nil.
func run(t *testing.T, s *Scheduler) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run returned %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("Run did not return after its context ended")
		}
	})
}

func ev(typ string, data any) eventstore.EventData {
	return eventstore.EventData{Type: typ, Data: data}
}

func count(t *testing.T, db *annalstest.DB, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := db.Pool.QueryRow(t.Context(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func eventsIn(t *testing.T, db *annalstest.DB, stream string) int {
	t.Helper()
	return count(t, db, `SELECT count(*) FROM annals.events WHERE stream_id = $1`, stream)
}

func timerRows(t *testing.T, db *annalstest.DB) int {
	t.Helper()
	return count(t, db, `SELECT count(*) FROM annals.timers`)
}

func fireDue(t *testing.T, s *Scheduler) int {
	t.Helper()
	n, err := s.FireDue(t.Context())
	if err != nil {
		t.Fatalf("FireDue: %v", err)
	}
	return n
}

func mustJSON(t *testing.T, v any) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
