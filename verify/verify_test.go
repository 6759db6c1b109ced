package verify_test

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/verify"
)

// bundle is a database with a small log: streams a, b, c appended in turn,
// four events each, positions 1..12, and a hole at position 13 (a rolled
// back append) before a last event at 14 (a-5).
type bundle struct {
	db    *annalstest.DB
	store *eventstore.Store
}

func setup(t *testing.T) *bundle {
	t.Helper()
	ctx := context.Background()
	db := annalstest.NewDB(t, &annalstest.Options{Schema: `Verify "V"`})
	store, err := eventstore.New(db.Pool, &eventstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		for _, s := range []string{"a", "b", "c"} {
			if _, err := store.Append(ctx, s, eventstore.Any, eventstore.EventData{Type: "T", Data: map[string]any{"s": s, "i": i}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.AppendTx(ctx, tx, "a", eventstore.Any, eventstore.EventData{Type: "RolledBack", Data: map[string]any{}}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if res, err := store.Append(ctx, "a", eventstore.Exact(4), eventstore.EventData{Type: "T", Data: map[string]any{"last": true}}); err != nil || res.Events[0].GlobalSequence != 14 {
		t.Fatalf("last append: %+v, %v", res, err)
	}
	return &bundle{db: db, store: store}
}

// tamper runs statements as the superuser with the append-only trigger
// switched off for the transaction.
func (b *bundle) tamper(t *testing.T, stmts ...string) {
	t.Helper()
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL session_replication_role = replica"); err != nil {
			return err
		}
		for _, s := range stmts {
			s = fmt.Sprintf(s, pgx.Identifier{b.db.Schema}.Sanitize())
			if _, err := tx.Exec(ctx, s); err != nil {
				return errors.Wrap(err, s)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func (b *bundle) verify(t *testing.T, base *verify.Baseline) *verify.Report {
	t.Helper()
	var (
		pages  int
		phases []verify.Phase
		last   verify.Progress
	)
	rep, err := verify.Log(context.Background(), b.db.Pool, &verify.Config{
		Schema: b.db.Schema, PageSize: 4, Interval: 3, Baseline: base,
		Progress: func(p verify.Progress) {
			if p.Phase == verify.PhaseEvents && p.Position > 0 {
				pages++
			}
			if len(phases) == 0 || phases[len(phases)-1] != p.Phase {
				phases = append(phases, p.Phase)
			}
			last = p
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if pages < 3 {
		t.Errorf("progress reported %d pages, want at least 3 of 4 events", pages)
	}
	if want := []verify.Phase{verify.PhaseRecords, verify.PhaseEvents, verify.PhaseStreams}; !slices.Equal(phases, want) {
		t.Errorf("progress went through phases %v, want %v", phases, want)
	}
	var rows int64
	if err := b.db.Pool.QueryRow(context.Background(), fmt.Sprintf("SELECT count(*) FROM %s.streams", pgx.Identifier{b.db.Schema}.Sanitize())).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if last.StreamRows != rows || last.Streams != rep.Streams || last.Events != rep.Events || last.Head != rep.Head {
		t.Errorf("last progress %+v: want %d stream rows, %d streams, %d events, head %d", last, rows, rep.Streams, rep.Events, rep.Head)
	}
	return rep
}

func kinds(rep *verify.Report) []verify.Kind {
	var out []verify.Kind
	for _, p := range rep.Problems {
		out = append(out, p.Kind)
	}
	return out
}

// wantProblems fails t unless rep has exactly the problems want (kind and
// position or stream), in any order.
func wantProblems(t *testing.T, rep *verify.Report, want ...verify.Problem) {
	t.Helper()
	if rep.ProblemCount != len(want) || len(rep.Problems) != len(want) {
		t.Errorf("%d problems (%v), want %d:", rep.ProblemCount, kinds(rep), len(want))
	}
	for _, w := range want {
		if !slices.ContainsFunc(rep.Problems, func(p verify.Problem) bool {
			return p.Kind == w.Kind && p.Position == w.Position && p.After == w.After && p.StreamID == w.StreamID
		}) {
			t.Errorf("missing problem %+v", w)
		}
	}
	for _, p := range rep.Problems {
		t.Logf("reported: %s: %s", p.Kind, p.Message)
	}
}

// baseline takes a baseline of the clean log and round-trips it through
// its file format.
func (b *bundle) baseline(t *testing.T) *verify.Baseline {
	t.Helper()
	rep := b.verify(t, nil)
	if !rep.OK() {
		t.Fatalf("the clean log has problems: %+v", rep.Problems)
	}
	var buf bytes.Buffer
	if err := rep.Baseline.Write(&buf); err != nil {
		t.Fatal(err)
	}
	base, err := verify.ReadBaseline(&buf)
	if err != nil {
		t.Fatal(err)
	}
	return base
}

func TestCleanLog(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rep := b.verify(t, nil)
	if !rep.OK() || rep.Events != 13 || rep.Streams != 3 || rep.Head != 14 || rep.Sequence == nil || *rep.Sequence != 14 {
		t.Fatalf("report %+v", rep)
	}
	base := b.baseline(t)
	// Checkpoints every 3 events: positions 3, 6, 9, 12 and the head.
	var at []int64
	for _, cp := range base.Checkpoints {
		at = append(at, cp.Position)
	}
	if !slices.Equal(at, []int64{3, 6, 9, 12, 14}) || base.Head != 14 || base.Events != 13 || base.Digest != rep.Digest {
		t.Fatalf("baseline checkpoints at %v, head %d, events %d", at, base.Head, base.Events)
	}

	// More appends: still clean against the baseline, and the new
	// baseline keeps the old ranges and continues after them.
	for i := range 4 {
		if _, err := b.store.Append(context.Background(), "d", eventstore.Any, eventstore.EventData{Type: "T", Data: map[string]int{"i": i}}); err != nil {
			t.Fatal(err)
		}
	}
	rep = b.verify(t, base)
	if !rep.OK() || rep.BaselineHead != 14 {
		t.Fatalf("after appends: %+v", rep.Problems)
	}
	at = at[:0]
	for _, cp := range rep.Baseline.Checkpoints {
		at = append(at, cp.Position)
	}
	if !slices.Equal(at, []int64{3, 6, 9, 12, 14, 17, 18}) {
		t.Fatalf("new baseline checkpoints at %v", at)
	}
	if rep.Baseline.Checkpoints[4].Running != base.Checkpoints[4].Running {
		t.Error("the running digest through the old head changed")
	}

	if _, err := verify.ReadBaseline(bytes.NewReader([]byte(`{"format":"other"}`))); !errors.Is(err, verify.ErrBadBaseline) {
		t.Errorf("bad baseline: %v", err)
	}
	other := *base
	other.Schema = "other"
	if _, err := verify.Log(context.Background(), b.db.Pool, &verify.Config{Schema: b.db.Schema, Baseline: &other}); !errors.Is(err, verify.ErrBadBaseline) {
		t.Errorf("baseline of another schema: %v", err)
	}
}

func TestTampering(t *testing.T) {
	t.Parallel()
	// Positions: a-1 1, b-1 2, c-1 3, a-2 4, b-2 5, c-2 6, a-3 7, b-3 8,
	// c-3 9, a-4 10, b-4 11, c-4 12, a-5 14.
	t.Run("DataChanged", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		base := b.baseline(t)
		b.tamper(t, `UPDATE %s.events SET data = '{"s": "b", "i": 666}' WHERE global_sequence = 5`)
		// Nothing but the baseline can tell.
		if rep := b.verify(t, nil); !rep.OK() {
			t.Errorf("without a baseline: %v", kinds(rep))
		}
		rep := b.verify(t, base)
		wantProblems(t, rep, verify.Problem{Kind: verify.Changed, After: 3, Position: 6})
	})
	t.Run("MetadataAndTimeChanged", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		base := b.baseline(t)
		b.tamper(t, `UPDATE %s.events SET metadata = '{"who": "me"}' WHERE global_sequence = 1`,
			`UPDATE %s.events SET recorded_at = recorded_at + interval '1 microsecond' WHERE global_sequence = 14`)
		wantProblems(t, b.verify(t, base),
			verify.Problem{Kind: verify.Changed, After: 0, Position: 3},
			verify.Problem{Kind: verify.Changed, After: 12, Position: 14})
	})
	t.Run("RowDeleted", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		base := b.baseline(t)
		// ALTER TABLE ... DISABLE TRIGGER, the other way around the trigger.
		b.tamper(t, `ALTER TABLE %s.events DISABLE TRIGGER events_append_only`,
			`DELETE FROM %s.events WHERE global_sequence = 5`,
			`ALTER TABLE %s.events ENABLE TRIGGER events_append_only`)
		wantProblems(t, b.verify(t, base),
			verify.Problem{Kind: verify.VersionGap, Position: 8, StreamID: "b"},
			verify.Problem{Kind: verify.Changed, After: 3, Position: 6})
	})
	t.Run("TailDeleted", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		base := b.baseline(t)
		b.tamper(t, `DELETE FROM %s.events WHERE global_sequence = 14`)
		wantProblems(t, b.verify(t, base),
			verify.Problem{Kind: verify.StreamVersion, StreamID: "a"},
			verify.Problem{Kind: verify.Changed, After: 12, Position: 14})
	})
	t.Run("InsertedOutOfOrder", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		base := b.baseline(t)
		// Into the hole at 13: stream c's version 6, before a-5 at 14,
		// without touching streams.
		b.tamper(t, `INSERT INTO %s.events (global_sequence, event_id, stream_id, stream_version, event_type, data)
		             VALUES (13, gen_random_uuid(), 'c', 6, 'Forged', '{}')`)
		wantProblems(t, b.verify(t, base),
			verify.Problem{Kind: verify.VersionGap, Position: 13, StreamID: "c"},
			verify.Problem{Kind: verify.StreamVersion, StreamID: "c"},
			verify.Problem{Kind: verify.Changed, After: 12, Position: 14})
	})
	t.Run("VersionsSwapped", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// b-2 and b-3 trade versions: each position still holds one row.
		b.tamper(t, `UPDATE %s.events SET stream_version = stream_version + 100 WHERE stream_id = 'b' AND stream_version IN (2, 3)`,
			`UPDATE %s.events SET stream_version = CASE stream_version WHEN 102 THEN 3 ELSE 2 END WHERE stream_id = 'b' AND stream_version > 100`)
		wantProblems(t, b.verify(t, nil),
			verify.Problem{Kind: verify.VersionGap, Position: 5, StreamID: "b"},
			verify.Problem{Kind: verify.OutOfOrder, Position: 8, StreamID: "b"})
	})
	t.Run("ForgedPosition", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.tamper(t, `INSERT INTO %s.events (global_sequence, event_id, stream_id, stream_version, event_type, data)
		             VALUES (999999, gen_random_uuid(), 'forged', 1, 'Forged', '{}')`)
		wantProblems(t, b.verify(t, nil),
			verify.Problem{Kind: verify.BeyondSequence, Position: 999999, StreamID: "forged"},
			verify.Problem{Kind: verify.StreamRowMissing, StreamID: "forged"})
	})
	t.Run("DuplicateVersion", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.tamper(t, `ALTER TABLE %s.events DROP CONSTRAINT events_stream_id_stream_version_key`,
			`INSERT INTO %s.events (global_sequence, event_id, stream_id, stream_version, event_type, data)
			 VALUES (13, gen_random_uuid(), 'c', 4, 'Forged', '{}')`)
		wantProblems(t, b.verify(t, nil),
			verify.Problem{Kind: verify.GuardRemoved},
			verify.Problem{Kind: verify.DuplicateVersion, Position: 13, StreamID: "c"})
	})
	t.Run("StreamsRowChanged", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.tamper(t, `UPDATE %s.streams SET version = 9 WHERE stream_id = 'b'`,
			`INSERT INTO %s.streams (stream_id, version) VALUES ('ghost', 1)`)
		wantProblems(t, b.verify(t, nil),
			verify.Problem{Kind: verify.StreamVersion, StreamID: "b"},
			verify.Problem{Kind: verify.StreamWithoutEvents, StreamID: "ghost"})
	})
}
