package verify_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/archive"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/scavenge"
	"github.com/annals-dev/annals/verify"
)

// scavengeAll runs the scavenger to the end of a run.
func (b *bundle) scavengeAll(t *testing.T) scavenge.Progress {
	t.Helper()
	sc, err := scavenge.New(b.db.Pool, &scavenge.Config{Schema: b.db.Schema, Pause: -1,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	p, err := sc.RunOnce(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// scavengeStep runs one step of batch positions of the scavenge run.
func (b *bundle) scavengeStep(t *testing.T, batch int) {
	t.Helper()
	if _, err := b.db.Pool.Exec(context.Background(),
		fmt.Sprintf(`SELECT * FROM %s.scavenge('test', NULL, $1)`, pgx.Identifier{b.db.Schema}.Sanitize()), batch); err != nil {
		t.Fatal(err)
	}
}

func (b *bundle) deleteStream(t *testing.T, id string, hard bool) {
	t.Helper()
	if _, err := b.store.DeleteStream(context.Background(), id, eventstore.Any, &eventstore.DeleteOptions{Hard: hard}); err != nil {
		t.Fatal(err)
	}
}

func (b *bundle) retention(t *testing.T, id string, change eventstore.RetentionChange) {
	t.Helper()
	if _, err := b.store.SetStreamRetention(context.Background(), id, change); err != nil {
		t.Fatal(err)
	}
}

func ptr(n int64) *int64 { return &n }

// Deletion and truncation excuse missing events only when the log records
// them: a deletion by its "$stream.deleted" event (or, once the scavenger
// removed it, by the absence of every older event and a scavenge run that
// removed events there), a truncation by its "$stream.truncated" record or
// a deletion just below it. Tampering with streams.state or
// streams.truncate_before to pass off removed rows is reported.
func TestLifecycleTampering(t *testing.T) {
	t.Parallel()
	// Positions: a-1 1, b-1 2, c-1 3, a-2 4, b-2 5, c-2 6, a-3 7, b-3 8,
	// c-3 9, a-4 10, b-4 11, c-4 12, a-5 14.
	t.Run("StateSetDirectly", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// The audit's t5: c marked deleted without a "$stream.deleted"
		// event, and its first two and its last event removed.
		b.tamper(t, `UPDATE %s.streams SET state = 1 WHERE stream_id = 'c'`,
			`DELETE FROM %s.events WHERE global_sequence IN (3, 6, 12)`)
		wantProblems(t, b.verify(t, nil),
			verify.Problem{Kind: verify.DeletionUnrecorded, StreamID: "c"},
			verify.Problem{Kind: verify.VersionGap, Position: 9, StreamID: "c"},
			verify.Problem{Kind: verify.StreamVersion, StreamID: "c"})
	})
	t.Run("StateAndTruncateBeforeSetDirectly", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// truncate_before as delete_stream would set it, but c's newest
		// event is no deletion and older ones remain.
		b.tamper(t, `UPDATE %s.streams SET state = 2, truncate_before = 5 WHERE stream_id = 'c'`,
			`DELETE FROM %s.events WHERE global_sequence IN (3, 6)`)
		wantProblems(t, b.verify(t, nil),
			verify.Problem{Kind: verify.DeletionUnrecorded, StreamID: "c"},
			verify.Problem{Kind: verify.VersionGap, Position: 9, StreamID: "c"})
	})
	t.Run("DeletionFakedAndEveryEventRemoved", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// Looks like a deleted and scavenged stream, but no scavenge run
		// ever removed an event.
		b.tamper(t, `UPDATE %s.streams SET state = 1, truncate_before = 5 WHERE stream_id = 'c'`,
			`DELETE FROM %s.events WHERE stream_id = 'c'`)
		wantProblems(t, b.verify(t, nil),
			verify.Problem{Kind: verify.DeletionUnrecorded, StreamID: "c"},
			verify.Problem{Kind: verify.StreamWithoutEvents, StreamID: "c"})
	})
	t.Run("DeletionEventRemovedOlderKept", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.deleteStream(t, "c", false) // c-5 at 15
		b.tamper(t, `DELETE FROM %s.events WHERE global_sequence = 15`)
		wantProblems(t, b.verify(t, nil),
			verify.Problem{Kind: verify.DeletionUnrecorded, StreamID: "c"},
			verify.Problem{Kind: verify.StreamVersion, StreamID: "c"})
	})
	t.Run("DeletedStreamRowsRemovedOutsideScavenge", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.deleteStream(t, "c", true)
		b.tamper(t, `DELETE FROM %s.events WHERE global_sequence IN (3, 6)`)
		wantProblems(t, b.verify(t, nil),
			verify.Problem{Kind: verify.VersionGap, Position: 9, StreamID: "c"})
	})
	t.Run("TruncateBeforeSetDirectly", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// The audit's t6.
		b.tamper(t, `UPDATE %s.streams SET truncate_before = 3 WHERE stream_id = 'a'`,
			`DELETE FROM %s.events WHERE global_sequence IN (1, 4)`)
		wantProblems(t, b.verify(t, nil),
			verify.Problem{Kind: verify.TruncationUnrecorded, StreamID: "a"},
			verify.Problem{Kind: verify.VersionGap, Position: 7, StreamID: "a"})
	})
	t.Run("TruncateBeforeSetDirectlyAfterScavenging", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.retention(t, "b", eventstore.RetentionChange{MaxCount: ptr(2)})
		if p := b.scavengeAll(t); p.Removed != 2 {
			t.Fatalf("scavenge: %+v", p)
		}
		// A scavenge run removed events below a's first, but a's version 2
		// is no "$stream.deleted" event: no deletion explains the truncation.
		b.tamper(t, `UPDATE %s.streams SET truncate_before = 3 WHERE stream_id = 'a'`,
			`DELETE FROM %s.events WHERE global_sequence = 1`)
		wantProblems(t, b.verify(t, nil),
			verify.Problem{Kind: verify.TruncationUnrecorded, StreamID: "a"},
			verify.Problem{Kind: verify.VersionGap, Position: 4, StreamID: "a"})
	})
	t.Run("TruncateBeforeAboveItsRecord", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.retention(t, "a", eventstore.RetentionChange{TruncateBefore: ptr(2)})
		b.tamper(t, `UPDATE %s.streams SET truncate_before = 4 WHERE stream_id = 'a'`)
		wantProblems(t, b.verify(t, nil),
			verify.Problem{Kind: verify.TruncationUnrecorded, StreamID: "a"})
	})
	t.Run("RecordedRetentionRowsRemovedOutsideScavenge", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.retention(t, "b", eventstore.RetentionChange{MaxCount: ptr(2)})
		b.tamper(t, `DELETE FROM %s.events WHERE global_sequence IN (2, 5)`)
		wantProblems(t, b.verify(t, nil),
			verify.Problem{Kind: verify.VersionGap, Position: 8, StreamID: "b"})
	})
	// A maximum count removes only versions up to the stream's version
	// minus the count (the smallest count in force while scavenge runs
	// removed events), never the newest: a row deleted by hand above that
	// is reported, however many events other streams lost to scavenging.
	for _, lifted := range []bool{false, true} {
		name := "CountExcusesNoMiddleVersion"
		if lifted {
			name += "Lifted"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.retention(t, "a", eventstore.RetentionChange{MaxCount: ptr(1000)})
			if lifted {
				b.retention(t, "a", eventstore.RetentionChange{MaxCount: ptr(0)})
			}
			b.deleteStream(t, "c", true)
			if p := b.scavengeAll(t); p.Removed != 5 {
				t.Fatalf("scavenge: %+v", p)
			}
			b.tamper(t, `DELETE FROM %s.events WHERE global_sequence = 7`) // a-3
			wantProblems(t, b.verify(t, nil),
				verify.Problem{Kind: verify.VersionGap, Position: 10, StreamID: "a"})
		})
	}
	t.Run("CountNeverRemovesTheNewest", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.retention(t, "a", eventstore.RetentionChange{MaxCount: ptr(1000)})
		b.retention(t, "b", eventstore.RetentionChange{MaxCount: ptr(2)})
		if p := b.scavengeAll(t); p.Removed != 2 {
			t.Fatalf("scavenge: %+v", p)
		}
		b.tamper(t, `DELETE FROM %s.events WHERE global_sequence IN (14, 11)`) // a-5, b-4
		wantProblems(t, b.verify(t, nil),
			verify.Problem{Kind: verify.StreamVersion, StreamID: "a"},
			verify.Problem{Kind: verify.StreamVersion, StreamID: "b"})
	})
	t.Run("CountExcusesOnlyUpToItsBound", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.retention(t, "b", eventstore.RetentionChange{MaxCount: ptr(2)})
		if p := b.scavengeAll(t); p.Removed != 2 {
			t.Fatalf("scavenge: %+v", p)
		}
		b.tamper(t, `DELETE FROM %s.events WHERE global_sequence = 8`) // b-3, above 4 - 2
		wantProblems(t, b.verify(t, nil),
			verify.Problem{Kind: verify.VersionGap, Position: 11, StreamID: "b"})
	})
	t.Run("CountNotInForceWhenRunsRemovedEvents", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// A count of 1, replaced by 1000 before any scavenge run: only
		// 1000 was ever in force when events were removed.
		b.retention(t, "a", eventstore.RetentionChange{MaxCount: ptr(1)})
		b.retention(t, "a", eventstore.RetentionChange{MaxCount: ptr(1000)})
		b.deleteStream(t, "c", true)
		b.scavengeAll(t)
		b.tamper(t, `DELETE FROM %s.events WHERE global_sequence = 7`) // a-3
		wantProblems(t, b.verify(t, nil),
			verify.Problem{Kind: verify.VersionGap, Position: 10, StreamID: "a"})
	})
	t.Run("CountAfterTheRuns", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// A count set after the last run that removed events excuses
		// nothing yet.
		b.deleteStream(t, "c", true)
		b.scavengeAll(t)
		b.retention(t, "a", eventstore.RetentionChange{MaxCount: ptr(1)})
		b.tamper(t, `DELETE FROM %s.events WHERE global_sequence = 7`) // a-3
		wantProblems(t, b.verify(t, nil),
			verify.Problem{Kind: verify.VersionGap, Position: 10, StreamID: "a"})
	})
	t.Run("ScavengeClockAhead", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.retention(t, "b", eventstore.RetentionChange{MaxCount: ptr(2)})
		b.scavengeAll(t)
		b.deleteStream(t, "c", true)
		b.scavengeAll(t)
		// Runs before migration 0027 took the caller's clock: one a day
		// ahead of the server removed events a maximum age keeps; one a
		// few seconds ahead (a client's clock) is let through.
		b.tamper(t, `UPDATE %s.scavenge_runs SET now_at = started_at + CASE id WHEN 1 THEN interval '1 day' ELSE interval '5 seconds' END`)
		wantProblems(t, b.verify(t, nil),
			verify.Problem{Kind: verify.ScavengeClockAhead, After: 0, Position: 15})
	})
	t.Run("MetadataStreamRetentionHidesNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// b's retention is recorded (max count 2); a superuser gives the
		// metadata stream a retention of its own (set_stream_retention
		// refuses since 0024) and changes b's: the record is still there,
		// so both are reported.
		b.retention(t, "b", eventstore.RetentionChange{MaxCount: ptr(2)})
		b.tamper(t, `UPDATE %s.streams SET max_count = 1 WHERE stream_id IN ('b', '$$b')`)
		wantProblems(t, b.verify(t, nil),
			verify.Problem{Kind: verify.RetentionUnrecorded, StreamID: "b"},
			verify.Problem{Kind: verify.RetentionUnrecorded, StreamID: "$$b"})
	})
}

// Legitimate deletion, truncation, retention, scavenging (whole and
// partial) and archiving report no problem.
func TestLifecycleLegitimate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	check := func(t *testing.T, b *bundle, when string) {
		t.Helper()
		rep := b.verify(t, nil)
		if !rep.OK() {
			for _, p := range rep.Problems {
				t.Errorf("%s: %s: %s", when, p.Kind, p.Message)
			}
		}
	}
	t.Run("DeletedSoftAndHard", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.deleteStream(t, "c", false)
		b.deleteStream(t, "b", true)
		check(t, b, "deleted")
		b.deleteStream(t, "c", true) // hard after soft
		check(t, b, "deleted again")
		if p := b.scavengeAll(t); p.Removed != 11 {
			t.Fatalf("scavenge: %+v", p)
		}
		for range 4 { // enough events for the pages verify reads
			if _, err := b.store.Append(ctx, "d", eventstore.Any, eventstore.EventData{Type: "T", Data: map[string]any{}}); err != nil {
				t.Fatal(err)
			}
		}
		check(t, b, "scavenged")
	})
	t.Run("DeletedDuringPartialRun", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.deleteStream(t, "c", false)
		b.scavengeStep(t, 7) // c-1, c-2 gone; c-3, c-4 and the deletion kept
		check(t, b, "one step")
		b.scavengeStep(t, 100)
		check(t, b, "run finished")
	})
	t.Run("RunStartedBeforeTheDeletion", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.retention(t, "b", eventstore.RetentionChange{MaxCount: ptr(3)})
		b.scavengeStep(t, 6) // the run's target is 15, the retention record
		b.deleteStream(t, "c", true)
		b.scavengeStep(t, 100) // removes c-3, c-4, not the deletion at 16
		check(t, b, "first run")
		b.scavengeAll(t)
		check(t, b, "second run")
	})
	t.Run("DeletedRecreatedAndScavenged", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.deleteStream(t, "c", false) // c-5
		if _, err := b.store.Append(ctx, "c", eventstore.Exact(5), eventstore.EventData{Type: "T", Data: map[string]any{}}); err != nil {
			t.Fatal(err)
		}
		check(t, b, "recreated")
		if p := b.scavengeAll(t); p.Removed != 5 {
			t.Fatalf("scavenge: %+v", p)
		}
		check(t, b, "scavenged")
		b.retention(t, "c", eventstore.RetentionChange{MaxCount: ptr(5)})
		check(t, b, "retention recorded after the deletion")
	})
	t.Run("TruncatedAndScavenged", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.retention(t, "a", eventstore.RetentionChange{TruncateBefore: ptr(3)})
		b.retention(t, "c", eventstore.RetentionChange{TruncateBefore: ptr(5)}) // everything
		check(t, b, "truncated")
		b.scavengeAll(t)
		check(t, b, "scavenged")
	})
	t.Run("RetentionLiftedAfterScavenging", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.retention(t, "b", eventstore.RetentionChange{MaxCount: ptr(2)})
		b.scavengeAll(t)
		// No limit now: the events it let go stay gone.
		b.retention(t, "b", eventstore.RetentionChange{MaxCount: ptr(0)})
		check(t, b, "lifted")
	})
	t.Run("MaxAgeRemovedEverything", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		age := time.Minute
		b.retention(t, "b", eventstore.RetentionChange{MaxAge: &age})
		// The scavenger's clock is the server's (migration 0027): b's
		// events are made an hour old instead.
		b.tamper(t, `UPDATE %s.events SET recorded_at = recorded_at - interval '1 hour' WHERE stream_id = 'b'`)
		if p := b.scavengeAll(t); p.Removed != 4 {
			t.Fatalf("scavenge: %+v", p)
		}
		check(t, b, "scavenged by age")
		b.retention(t, "b", eventstore.RetentionChange{MaxAge: new(time.Duration)})
		check(t, b, "age lifted")
	})
	t.Run("CountLoweredDuringARun", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.retention(t, "b", eventstore.RetentionChange{MaxCount: ptr(3)})
		b.scavengeStep(t, 6) // the run's target is 15; b-1 removed, b-2 kept
		b.retention(t, "b", eventstore.RetentionChange{MaxCount: ptr(1)})
		b.scavengeStep(t, 100) // b-3 removed: b-2 and b-4 left
		check(t, b, "first run")
		b.retention(t, "b", eventstore.RetentionChange{MaxCount: ptr(0)})
		check(t, b, "lifted")
		b.retention(t, "b", eventstore.RetentionChange{MaxCount: ptr(1)})
		b.scavengeAll(t) // b-2
		check(t, b, "second run")
	})
	t.Run("RetentionChangedLiftedAndAppended", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		appendTo := func(id string, n int) {
			for range n {
				if _, err := b.store.Append(ctx, id, eventstore.Any, eventstore.EventData{Type: "T", Data: map[string]any{}}); err != nil {
					t.Fatal(err)
				}
			}
		}
		b.retention(t, "b", eventstore.RetentionChange{MaxCount: ptr(2)})
		b.retention(t, "a", eventstore.RetentionChange{MaxCount: ptr(3)})
		if p := b.scavengeAll(t); p.Removed != 4 {
			t.Fatalf("scavenge: %+v", p)
		}
		check(t, b, "first run")
		b.retention(t, "b", eventstore.RetentionChange{MaxCount: ptr(0)})
		appendTo("b", 3) // b-5..7
		check(t, b, "lifted and appended")
		b.retention(t, "b", eventstore.RetentionChange{MaxCount: ptr(4)})
		b.retention(t, "a", eventstore.RetentionChange{MaxCount: ptr(1000)})
		appendTo("a", 2)
		if p := b.scavengeAll(t); p.Removed != 1 { // b-3
			t.Fatalf("scavenge: %+v", p)
		}
		check(t, b, "second run")
		b.retention(t, "b", eventstore.RetentionChange{MaxCount: ptr(2), TruncateBefore: ptr(6)})
		appendTo("b", 1)
		b.scavengeStep(t, 10)
		check(t, b, "third run, one step")
		b.scavengeStep(t, 100)
		b.retention(t, "b", eventstore.RetentionChange{MaxCount: ptr(0)})
		appendTo("b", 2)
		check(t, b, "third run")
	})
	t.Run("ArchivedDeletedScavenged", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		arch, err := archive.New(b.db.Pool, &archive.Config{Schema: b.db.Schema, Pause: -1})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := arch.RunOnce(ctx, 8); err != nil {
			t.Fatal(err)
		}
		b.deleteStream(t, "c", false)
		b.retention(t, "a", eventstore.RetentionChange{TruncateBefore: ptr(3)})
		check(t, b, "archived")
		b.scavengeAll(t)
		check(t, b, "scavenged")
		if _, err := arch.RunOnce(ctx, 100); err != nil {
			t.Fatal(err)
		}
		check(t, b, "archived after scavenging")
	})
	t.Run("MetadataStreamRetentionBefore0024", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.retention(t, "b", eventstore.RetentionChange{MaxCount: ptr(2)})
		// What set_stream_retention('$$b', NULL, NULL, 2) did before
		// migration 0024: $$b truncated below its version 2, recorded in
		// $$$$b.
		b.tamper(t, `UPDATE %[1]s.streams SET truncate_before = 2 WHERE stream_id = '$$b'`,
			`INSERT INTO %[1]s.streams (stream_id, version) VALUES ('$$$$b', 1)`,
			`INSERT INTO %[1]s.events (global_sequence, event_id, stream_id, stream_version, event_type, data)
			 VALUES (nextval('%[1]s.events_global_sequence'), gen_random_uuid(), '$$$$b', 1, '$stream.truncated',
			         '{"stream_id": "$$b", "truncate_before": 2, "max_age_seconds": null, "max_count": null}')`)
		b.scavengeAll(t) // b's record goes with $$b's version 1
		rep := b.verify(t, nil)
		if !rep.OK() || len(rep.Notes) != 1 {
			t.Fatalf("problems %v, notes %q; want none and a note that b's retention was not checked", kinds(rep), rep.Notes)
		}
		t.Log(rep.Notes)
	})
}
