package verify_test

import (
	"context"
	"testing"

	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/verify"
)

// Since migration 0038 delete_stream records each deletion in the metadata
// stream, which the scavenger never empties: a deletion's state, version
// and truncate_before stay checkable after the scavenger removed every
// event of the stream, and a stream's version can no longer be lowered
// below what its records show.
func TestDeletionRecords(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// Positions: a-1 1, b-1 2, c-1 3, a-2 4, b-2 5, c-2 6, a-3 7, b-3 8,
	// c-3 9, a-4 10, b-4 11, c-4 12, a-5 14.
	t.Run("HardDeletionRevived", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.deleteStream(t, "b", true) // b-5 at 15, its record $$b-1 at 16
		if p := b.scavengeAll(t); p.Removed != 5 {
			t.Fatalf("scavenge: %+v", p)
		}
		base := b.baseline(t) // a new baseline right after scavenging, as documented
		// The tombstone turned into a soft deletion: state is all that is
		// left of the hard delete in streams.
		b.tamper(t, `UPDATE %s.streams SET state = 1 WHERE stream_id = 'b'`)
		wantProblems(t, b.verify(t, base), verify.Problem{Kind: verify.DeletionUnrecorded, StreamID: "b"})
		// Which lets an append recreate it.
		if _, err := b.store.Append(ctx, "b", eventstore.Exact(5), eventstore.EventData{Type: "Revived", Data: map[string]any{}}); err != nil {
			t.Fatal(err)
		}
		wantProblems(t, b.verify(t, base), verify.Problem{Kind: verify.DeletionUnrecorded, StreamID: "b"})
	})
	t.Run("SoftDeletionRevivedWithoutAppend", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.deleteStream(t, "c", false) // c-5 at 15
		b.scavengeAll(t)
		b.tamper(t, `UPDATE %s.streams SET state = 0 WHERE stream_id = 'c'`)
		wantProblems(t, b.verify(t, nil), verify.Problem{Kind: verify.DeletionUnrecorded, StreamID: "c"})
	})
	t.Run("HardDeletionMadeSoft", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.deleteStream(t, "c", true) // c-5 at 15, events kept
		b.tamper(t, `UPDATE %s.streams SET state = 1 WHERE stream_id = 'c'`)
		wantProblems(t, b.verify(t, nil), verify.Problem{Kind: verify.DeletionUnrecorded, StreamID: "c"})
	})
	t.Run("OldestEventsRemovedWithTruncateBefore", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.retention(t, "b", eventstore.RetentionChange{MaxCount: ptr(2)})
		if p := b.scavengeAll(t); p.Removed != 2 { // b-1 (2), b-2 (5)
			t.Fatalf("scavenge: %+v", p)
		}
		// a's two oldest events removed by hand and truncate_before set
		// above them, to pass as a deletion whose event the scavenger
		// removed with every older one: a scavenge run did remove events
		// below a's first, but since 0038 a deletion has its record.
		b.tamper(t, `UPDATE %s.streams SET truncate_before = 3 WHERE stream_id = 'a'`,
			`DELETE FROM %s.events WHERE global_sequence IN (1, 4)`)
		wantProblems(t, b.verify(t, nil),
			verify.Problem{Kind: verify.TruncationUnrecorded, StreamID: "a"},
			verify.Problem{Kind: verify.VersionGap, Position: 7, StreamID: "a"})
	})
	t.Run("DeletionFakedAfterScavenging", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.retention(t, "b", eventstore.RetentionChange{MaxCount: ptr(2)})
		b.scavengeAll(t)
		// Looks like a deleted stream the scavenger emptied, and a run
		// did remove events: without a record it is no deletion.
		b.tamper(t, `UPDATE %s.streams SET state = 1, version = 5, truncate_before = 6 WHERE stream_id = 'c'`,
			`DELETE FROM %s.events WHERE stream_id = 'c'`)
		wantProblems(t, b.verify(t, nil),
			verify.Problem{Kind: verify.DeletionUnrecorded, StreamID: "c"},
			verify.Problem{Kind: verify.StreamWithoutEvents, StreamID: "c"})
	})
	t.Run("VersionsReused", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.deleteStream(t, "c", false) // c-5 at 15
		if p := b.scavengeAll(t); p.Removed != 5 {
			t.Fatalf("scavenge: %+v", p)
		}
		base := b.baseline(t)
		// c's version lowered from 5 (with truncate_before, as
		// delete_stream would have set it), then recreated: its versions
		// 2 and 3 are appended a second time, with other content.
		b.tamper(t, `UPDATE %s.streams SET version = 1, truncate_before = 2 WHERE stream_id = 'c'`)
		if _, err := b.store.Append(ctx, "c", eventstore.Exact(1), eventstore.EventData{Type: "T", Data: map[string]any{"again": 2}},
			eventstore.EventData{Type: "T", Data: map[string]any{"again": 3}}); err != nil {
			t.Fatal(err)
		}
		wantProblems(t, b.verify(t, base), verify.Problem{Kind: verify.VersionLowered, StreamID: "c"})
	})
	// deletions_recorded_after() replaced to return a high position, or
	// dropped, would let every deletion without a record pass by the rules
	// for deletions older than migration 0038: a deletion record at or
	// below its value is reported, and deletions are held to their records
	// from the first record on, with the function or without it.
	for _, forge := range []struct{ name, stmt string }{
		{"DeletionsRecordedAfterRaised", `CREATE OR REPLACE FUNCTION %s.deletions_recorded_after() RETURNS bigint LANGUAGE sql IMMUTABLE RETURN 9223372036854775806`},
		{"DeletionsRecordedAfterDropped", `DROP FUNCTION %s.deletions_recorded_after()`},
	} {
		t.Run(forge.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.deleteStream(t, "b", false) // b-5 at 15, its record $$b-1 at 16
			// a made to look deleted, with a "$stream.deleted" event at
			// position 17 and the row as delete_stream sets it, but no
			// record.
			b.tamper(t, forge.stmt,
				`INSERT INTO %[1]s.events (global_sequence, event_id, stream_id, stream_version, event_type, data, recorded_at)
				 VALUES (nextval('%[1]s.events_global_sequence'), gen_random_uuid(), 'a', 6, '$stream.deleted', '{"hard":false}', clock_timestamp())`,
				`UPDATE %s.streams SET state = 1, version = 6, truncate_before = 7 WHERE stream_id = 'a'`)
			guard := verify.Problem{Kind: verify.GuardRemoved}
			if forge.name == "DeletionsRecordedAfterRaised" {
				guard.Position = 16
			}
			want := []verify.Problem{guard, {Kind: verify.DeletionUnrecorded, StreamID: "a"}}
			if forge.name == "DeletionsRecordedAfterDropped" {
				// And the function missing, as any of the schema's
				// functions (TestFunctionsReplaced); its body holds a
				// value of the database's own and is not compared.
				want = append(want, verify.Problem{Kind: verify.GuardRemoved})
			}
			wantProblems(t, b.verify(t, nil), want...)
		})
	}
	t.Run("TruncateBeforeAboveVersion", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.tamper(t, `UPDATE %s.streams SET truncate_before = 9 WHERE stream_id = 'b'`)
		// Above version + 1, where no function sets it.
		wantProblems(t, b.verify(t, nil), verify.Problem{Kind: verify.TruncationUnrecorded, StreamID: "b"})
	})
}

// The triggers and unique indexes the log's guarantees rest on are checked
// in the catalog: one disabled, or switched to fire for replicas only, or a
// constraint dropped, is reported, whatever the rows show.
func TestGuardsRemoved(t *testing.T) {
	t.Parallel()
	t.Run("TriggersDisabledConstraintDropped", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.tamper(t, `ALTER TABLE %s.events DISABLE TRIGGER events_append_only`,
			`ALTER TABLE %s.events_archive DISABLE TRIGGER events_archive_guard`,
			`ALTER TABLE %s.events DROP CONSTRAINT events_stream_id_stream_version_key`)
		wantProblems(t, b.verify(t, nil),
			verify.Problem{Kind: verify.GuardRemoved}, verify.Problem{Kind: verify.GuardRemoved}, verify.Problem{Kind: verify.GuardRemoved})
	})
	t.Run("ReplicaOnlyAndNarrowed", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// The trigger fires only under session_replication_role = replica
		// (so not at all for ordinary sessions); the archive's guard is
		// recreated without DELETE; the streams key replaced by a partial
		// unique index.
		b.tamper(t, `ALTER TABLE %s.events ENABLE REPLICA TRIGGER events_append_only`,
			`DROP TRIGGER events_archive_guard ON %[1]s.events_archive`,
			`CREATE TRIGGER events_archive_guard BEFORE INSERT OR UPDATE OR TRUNCATE ON %[1]s.events_archive
			 FOR EACH STATEMENT EXECUTE FUNCTION %[1]s.events_archive_guard()`,
			`ALTER TABLE %s.streams DROP CONSTRAINT streams_pkey CASCADE`,
			`CREATE UNIQUE INDEX streams_some ON %s.streams (stream_id) WHERE state = 0`)
		wantProblems(t, b.verify(t, nil),
			verify.Problem{Kind: verify.GuardRemoved}, verify.Problem{Kind: verify.GuardRemoved}, verify.Problem{Kind: verify.GuardRemoved})
	})
}
