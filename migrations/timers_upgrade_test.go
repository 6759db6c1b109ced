package migrations_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/migrations"
	"github.com/annals-dev/annals/scheduler"
)

// TestTimersUpgrade0033: a timer stored before migration 0033 (its encoded
// append in the jsonb column payload, as the scheduler then wrote it) is
// listed and fires after the upgrade, next to one stored after it (in
// payload_json). The upgrade does not rewrite the timers table: ALTER
// COLUMN payload TYPE json did, under an ACCESS EXCLUSIVE lock held until
// the whole upgrade committed, and every dispatcher, Cancel and Schedule
// waited meanwhile.
func TestTimersUpgrade0033(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	cfg := &migrations.Config{Schema: `Timers "Old"`}
	schema := pgx.Identifier{cfg.Schema}.Sanitize()
	if _, err := migrations.UpWith(ctx, db.Pool, cfg, func(ms []migrations.Migration) []migrations.Migration {
		return ms[:32] // through 0032
	}); err != nil {
		t.Fatal(err)
	}
	store, err := eventstore.New(db.Pool, &eventstore.Config{Schema: cfg.Schema})
	if err != nil {
		t.Fatal(err)
	}
	due := time.Now().Add(-time.Minute)
	old := eventstore.EventData{ID: uuid.New(), Type: "old", Data: json.RawMessage(`{"b": 1, "a": 2}`)}
	enc, err := store.Encode(ctx, "timer", eventstore.Any, old)
	if err != nil {
		t.Fatal(err)
	}
	payload, err := json.Marshal(enc) // what Schedule stored before 0033
	if err != nil {
		t.Fatal(err)
	}
	oldID := uuid.New()
	if _, err := db.Pool.Exec(ctx, `INSERT INTO `+schema+`.timers (id, due_at, stream_id, payload, owner)
		VALUES ($1, $2, $3, $4::jsonb, $5)`, oldID, due.Add(-time.Second), "timer", string(payload), "owner-old"); err != nil {
		t.Fatal(err)
	}
	filenode := func() uint32 {
		t.Helper()
		var n uint32
		if err := db.Pool.QueryRow(ctx, `SELECT pg_relation_filenode($1::regclass)::oid`, schema+".timers").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := filenode()
	if _, err := migrations.Up(ctx, db.Pool, cfg); err != nil {
		t.Fatal(err)
	}
	if after := filenode(); after != before {
		t.Errorf("the upgrade rewrote the timers table (filenode %d, then %d)", before, after)
	}

	s, err := scheduler.New(store, nil)
	if err != nil {
		t.Fatal(err)
	}
	newID, err := s.Schedule(ctx, nil, due, "timer", eventstore.EventData{Type: "new", Data: map[string]int{"n": 1}})
	if err != nil {
		t.Fatal(err)
	}
	var oldNull, newNull bool
	if err := db.Pool.QueryRow(ctx, `SELECT (SELECT payload_json IS NULL FROM `+schema+`.timers WHERE id = $1),
		(SELECT payload IS NULL FROM `+schema+`.timers WHERE id = $2)`, oldID, newID).Scan(&oldNull, &newNull); err != nil {
		t.Fatal(err)
	}
	if !oldNull || !newNull {
		t.Errorf("old timer's payload_json NULL %v, new timer's payload NULL %v; want both", oldNull, newNull)
	}
	ts, err := s.Timers(ctx, 10)
	if err != nil || len(ts) != 2 {
		t.Fatalf("Timers = %+v, %v; want the two timers", ts, err)
	}
	for _, ti := range ts {
		want := map[scheduler.TimerID]string{oldID: "old", newID: "new"}[ti.ID]
		if ti.Events != 1 || ti.EventType != want {
			t.Errorf("timer %s: %d events of type %q; want 1 of type %q", ti.ID, ti.Events, ti.EventType, want)
		}
	}

	if n, err := s.FireDue(ctx); err != nil || n != 2 {
		t.Fatalf("FireDue = %d, %v; want 2 fired", n, err)
	}
	rows, err := db.Pool.Query(ctx, `SELECT event_id, event_type FROM `+schema+`.events WHERE stream_id = 'timer' ORDER BY global_sequence`)
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		ID   uuid.UUID
		Type string
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].ID != old.ID || got[0].Type != "old" || got[1].Type != "new" {
		t.Fatalf("events appended: %+v; want the old timer's, then the new one's", got)
	}
	var left int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.timers`).Scan(&left); err != nil || left != 0 {
		t.Errorf("%d timers left after both fired (%v)", left, err)
	}
}
