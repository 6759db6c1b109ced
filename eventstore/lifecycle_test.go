package eventstore_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/annals-dev/annals/eventstore"
)

func placed(id string) eventstore.EventData {
	return eventstore.EventData{Data: OrderPlaced{OrderID: id, Total: 1}}
}

func TestDeleteStream(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	for _, group := range []bool{true, false} {
		name := "GroupCommit"
		if !group {
			name = "AppendEvents"
		}
		t.Run("Soft"+name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, &eventstore.Config{GroupCommit: eventstore.GroupCommit{Disabled: !group}})
			if _, err := b.store.Append(ctx, "o-1", eventstore.NoStream, placed("1"), placed("1")); err != nil {
				t.Fatal(err)
			}
			res, err := b.store.DeleteStream(ctx, "o-1", eventstore.Exact(2), nil)
			if err != nil {
				t.Fatal(err)
			}
			if res.StreamVersion != 3 || len(res.Events) != 1 {
				t.Fatalf("delete result %+v, want the deletion event at version 3", res)
			}
			var de *eventstore.StreamDeletedError
			_, err = collect(t, b.store.ReadStream(ctx, "o-1", 0))
			if !errors.Is(err, eventstore.ErrStreamDeleted) || !errors.As(err, &de) || de.Version != 3 || de.Hard {
				t.Fatalf("read of a deleted stream: %v, want ErrStreamDeleted at version 3", err)
			}
			if errors.Is(err, eventstore.ErrStreamTombstoned) {
				t.Fatalf("soft delete matches ErrStreamTombstoned: %v", err)
			}
			if _, err := b.store.StreamVersion(ctx, "o-1"); !errors.Is(err, eventstore.ErrStreamDeleted) {
				t.Fatalf("StreamVersion of a deleted stream: %v", err)
			}
			// Appends that do not expect exactly the deletion's version are refused.
			for _, exp := range []eventstore.ExpectedVersion{eventstore.Any, eventstore.NoStream, eventstore.StreamExists, eventstore.Exact(2)} {
				if _, err := b.store.Append(ctx, "o-1", exp, placed("2")); !errors.Is(err, eventstore.ErrStreamDeleted) {
					t.Fatalf("append with %s to a deleted stream: %v, want ErrStreamDeleted", exp, err)
				}
			}
			// A second soft delete is refused too.
			if _, err := b.store.DeleteStream(ctx, "o-1", eventstore.Any, nil); !errors.Is(err, eventstore.ErrStreamDeleted) {
				t.Fatalf("second soft delete: %v", err)
			}
			// The events stay in the log, the deletion event included, and
			// the deletion is recorded in the metadata stream (migration
			// 0038).
			all, err := collect(t, b.store.ReadAll(ctx, 0))
			if err != nil || len(all) != 4 || all[2].Type != eventstore.StreamDeletedType || string(all[2].Data) != `{"hard":false}` ||
				all[3].StreamID != eventstore.MetadataStream("o-1") || all[3].Type != eventstore.StreamTruncatedType {
				t.Fatalf("log after delete: %v %+v", err, all)
			}
			// The record decodes into StreamTruncated, which tells it from
			// a retention change: Deleted and Version are set.
			if err := eventstore.RegisterLifecycleEvents(b.reg); err != nil {
				t.Fatal(err)
			}
			rec, err := eventstore.Decode[eventstore.StreamTruncated](b.reg, all[3])
			if err != nil || rec.Data.StreamID != "o-1" || rec.Data.Deleted != "soft" || rec.Data.Version != 3 || rec.Data.TruncateBefore != 4 {
				t.Fatalf("deletion record: %+v %v", rec.Data, err)
			}
			// Recreate: the version continues, reads start after the deletion.
			res, err = b.store.Append(ctx, "o-1", eventstore.Exact(3), placed("3"))
			if err != nil {
				t.Fatal(err)
			}
			if res.StreamVersion != 4 {
				t.Fatalf("recreated at version %d, want 4", res.StreamVersion)
			}
			evs, err := collect(t, b.store.ReadStream(ctx, "o-1", 0))
			if err != nil || len(evs) != 1 || evs[0].StreamVersion != 4 {
				t.Fatalf("read of the recreated stream: %v %+v", err, evs)
			}
			info, err := b.store.StreamInfo(ctx, "o-1")
			if err != nil || info.State != eventstore.StreamLive || info.Version != 4 || info.TruncateBefore != 4 {
				t.Fatalf("info %+v %v", info, err)
			}
		})
		t.Run("Hard"+name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, &eventstore.Config{GroupCommit: eventstore.GroupCommit{Disabled: !group}})
			if _, err := b.store.Append(ctx, "o-1", eventstore.NoStream, placed("1")); err != nil {
				t.Fatal(err)
			}
			if _, err := b.store.DeleteStream(ctx, "o-1", eventstore.Any, nil); err != nil {
				t.Fatal(err)
			}
			// A soft-deleted stream can be hard-deleted.
			res, err := b.store.DeleteStream(ctx, "o-1", eventstore.Exact(2), &eventstore.DeleteOptions{Hard: true,
				Metadata: eventstore.Metadata{CorrelationID: "gdpr-42"}})
			if err != nil || res.StreamVersion != 3 {
				t.Fatalf("hard delete: %+v %v", res, err)
			}
			for _, exp := range []eventstore.ExpectedVersion{eventstore.Any, eventstore.Exact(3), eventstore.NoStream} {
				_, err := b.store.Append(ctx, "o-1", exp, placed("2"))
				var de *eventstore.StreamDeletedError
				if !errors.Is(err, eventstore.ErrStreamTombstoned) || !errors.As(err, &de) || !de.Hard || de.Version != 3 {
					t.Fatalf("append with %s to a hard-deleted stream: %v, want ErrStreamTombstoned", exp, err)
				}
			}
			if _, err := b.store.DeleteStream(ctx, "o-1", eventstore.Any, &eventstore.DeleteOptions{Hard: true}); !errors.Is(err, eventstore.ErrStreamTombstoned) {
				t.Fatalf("hard delete of a tombstone: %v", err)
			}
			if _, err := collect(t, b.store.ReadStream(ctx, "o-1", 0)); !errors.Is(err, eventstore.ErrStreamTombstoned) {
				t.Fatalf("read of a tombstone: %v", err)
			}
			all, err := collect(t, b.store.ReadAll(ctx, res.Events[0].GlobalSequence))
			if err != nil || len(all) != 2 || all[0].Metadata.CorrelationID != "gdpr-42" || string(all[0].Data) != `{"hard":true}` ||
				all[1].StreamID != eventstore.MetadataStream("o-1") || !strings.Contains(string(all[1].Data), `"deleted" : "hard"`) {
				t.Fatalf("hard deletion event and its record: %v %+v", err, all)
			}
		})
	}

	t.Run("Refusals", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		_, err := b.store.DeleteStream(ctx, "nope", eventstore.Any, nil)
		if !errors.Is(err, eventstore.ErrStreamNotFound) || !errors.Is(err, eventstore.ErrWrongExpectedVersion) {
			t.Fatalf("delete of a missing stream: %v", err)
		}
		if _, err := b.store.Append(ctx, "o-1", eventstore.NoStream, placed("1")); err != nil {
			t.Fatal(err)
		}
		var wev *eventstore.WrongExpectedVersionError
		if _, err := b.store.DeleteStream(ctx, "o-1", eventstore.Exact(7), nil); !errors.As(err, &wev) || wev.Actual != 1 {
			t.Fatalf("delete with a wrong expected version: %v", err)
		}
		if _, err := b.store.DeleteStream(ctx, "o-1", eventstore.NoStream, nil); !errors.Is(err, eventstore.ErrInvalidEvent) {
			t.Fatalf("delete expecting no stream: %v", err)
		}
		// Reserved types cannot be appended, from Go or from SQL.
		if _, err := b.store.Append(ctx, "o-1", eventstore.Any, eventstore.EventData{Type: "$stream.deleted", Data: map[string]any{"hard": true}}); !errors.Is(err, eventstore.ErrInvalidEvent) {
			t.Fatalf("append of a reserved type: %v", err)
		}
		_, err = b.db.Pool.Exec(ctx, `SELECT * FROM annals.append_events('o-1', NULL, '[{"type":"$stream.deleted","data":{"hard":true}}]')`)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != eventstore.CodeInvalidEvent {
			t.Fatalf("append_events of a reserved type: %v", err)
		}
		_, err = b.db.Pool.Exec(ctx, `SELECT * FROM annals.append_batch(ARRAY['o-1'], ARRAY[NULL::bigint], ARRAY[1], ARRAY[1],
			ARRAY[gen_random_uuid()], ARRAY['$stream.truncated'], ARRAY['{}'], ARRAY[NULL], false)`)
		if !errors.As(err, &pgErr) || pgErr.Code != eventstore.CodeInvalidEvent {
			t.Fatalf("append_batch of a reserved type: %v", err)
		}
		// Nothing changed the stream.
		if v, err := b.store.StreamVersion(ctx, "o-1"); err != nil || v != 1 {
			t.Fatalf("version %d %v", v, err)
		}
	})

	t.Run("SQL", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		if _, err := b.store.Append(ctx, "o-1", eventstore.NoStream, placed("1")); err != nil {
			t.Fatal(err)
		}
		var ver int64
		if err := b.db.Pool.QueryRow(ctx, `SELECT stream_version FROM annals.delete_stream('o-1', 1, true)`).Scan(&ver); err != nil || ver != 2 {
			t.Fatalf("delete_stream: %d %v", ver, err)
		}
		_, err := b.db.Pool.Exec(ctx, `SELECT * FROM annals.append_events('o-1', NULL, '[{"type":"x","data":{}}]')`)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != eventstore.CodeStreamTombstoned || pgErr.Detail != `{"stream_id" : "o-1", "version" : 2, "hard" : true}` {
			t.Fatalf("append_events to a tombstone: %v (%+v)", err, pgErr)
		}
	})

	// One group holds appends to a live, a deleted and a hard-deleted
	// stream: each gets its own outcome.
	t.Run("GroupOutcomes", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		for _, s := range []string{"live", "soft", "hard"} {
			if _, err := b.store.Append(ctx, s, eventstore.NoStream, placed(s)); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := b.store.DeleteStream(ctx, "soft", eventstore.Any, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := b.store.DeleteStream(ctx, "hard", eventstore.Any, &eventstore.DeleteOptions{Hard: true}); err != nil {
			t.Fatal(err)
		}
		for round := 0; round < 20; round++ {
			var wg sync.WaitGroup
			errs := make([]error, 3)
			for i, s := range []string{"live", "soft", "hard"} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, errs[i] = b.store.Append(ctx, s, eventstore.Any, placed(s))
				}()
			}
			wg.Wait()
			if errs[0] != nil || !errors.Is(errs[1], eventstore.ErrStreamDeleted) || errors.Is(errs[1], eventstore.ErrStreamTombstoned) ||
				!errors.Is(errs[2], eventstore.ErrStreamTombstoned) {
				t.Fatalf("round %d: outcomes %v", round, errs)
			}
		}
		if v, err := b.store.StreamVersion(ctx, "live"); err != nil || v != 21 {
			t.Fatalf("live stream at %d %v, want 21", v, err)
		}
	})

	t.Run("RegistryDecodes", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		if err := eventstore.RegisterLifecycleEvents(b.reg); err != nil {
			t.Fatal(err)
		}
		if _, err := b.store.Append(ctx, "o-1", eventstore.NoStream, placed("1")); err != nil {
			t.Fatal(err)
		}
		if _, err := b.store.DeleteStream(ctx, "o-1", eventstore.Any, &eventstore.DeleteOptions{Hard: true}); err != nil {
			t.Fatal(err)
		}
		all, err := collect(t, b.store.ReadAll(ctx, 0))
		if err != nil {
			t.Fatal(err)
		}
		env, err := eventstore.Decode[eventstore.StreamDeleted](b.reg, all[1])
		if err != nil || !env.Data.Hard {
			t.Fatalf("decode: %+v %v", env, err)
		}
		// A registered StreamDeleted value still cannot be appended.
		if _, err := b.store.Append(ctx, "o-2", eventstore.Any, eventstore.EventData{Data: eventstore.StreamDeleted{}}); !errors.Is(err, eventstore.ErrInvalidEvent) {
			t.Fatalf("append of a StreamDeleted value: %v", err)
		}
	})
}

// countInline is an inline projection that counts the events it sees.
type countInline struct{ n int }

func (c *countInline) Name() string { return "count" }
func (c *countInline) Handle(context.Context, pgx.Tx, eventstore.Event) error {
	c.n++
	return nil
}

// Appends through inline projections follow the same rules for deleted
// streams as the others: Any does not recreate, the exact version does.
func TestDeleteStreamInline(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := &countInline{}
	b := setup(t, &eventstore.Config{Inline: []eventstore.InlineProjection{c}})
	if _, err := b.store.Append(ctx, "o-1", eventstore.NoStream, placed("1")); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.DeleteStream(ctx, "o-1", eventstore.Any, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Append(ctx, "o-1", eventstore.Any, placed("2")); !errors.Is(err, eventstore.ErrStreamDeleted) {
		t.Fatalf("inline append with Any to a deleted stream: %v", err)
	}
	if res, err := b.store.Append(ctx, "o-1", eventstore.Exact(2), placed("3")); err != nil || res.StreamVersion != 3 {
		t.Fatalf("inline recreate: %+v %v", res, err)
	}
	if _, err := b.store.DeleteStream(ctx, "o-1", eventstore.Any, &eventstore.DeleteOptions{Hard: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Append(ctx, "o-1", eventstore.Exact(4), placed("4")); !errors.Is(err, eventstore.ErrStreamTombstoned) {
		t.Fatalf("inline append to a tombstone: %v", err)
	}
	if c.n != 2 {
		t.Fatalf("the inline projection saw %d events, want 2 (the refused appends rolled back)", c.n)
	}
}

// Metadata streams ("$$" + a stream ID, where SetStreamRetention records
// its changes) cannot be deleted, through the client or the SQL function,
// and a refused delete changes nothing: retention changes keep landing in
// the metadata stream, which stays readable.
func TestMetadataStreamsCannotBeDeleted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil)
	if _, err := b.store.Append(ctx, "o-1", eventstore.NoStream, placed("1")); err != nil {
		t.Fatal(err)
	}
	five, seven := int64(5), int64(7)
	if _, err := b.store.SetStreamRetention(ctx, "o-1", eventstore.RetentionChange{MaxCount: &five}); err != nil {
		t.Fatal(err)
	}
	meta := eventstore.MetadataStream("o-1")
	for _, hard := range []bool{false, true} {
		_, err := b.store.DeleteStream(ctx, meta, eventstore.Any, &eventstore.DeleteOptions{Hard: hard})
		var bad *eventstore.InvalidEventError
		if !errors.As(err, &bad) || bad.Field != "stream_id" {
			t.Fatalf("DeleteStream(%q, hard %v) = %v, want an *InvalidEventError on stream_id", meta, hard, err)
		}
		_, err = b.db.Pool.Exec(ctx, `SELECT * FROM annals.delete_stream($1, NULL, $2)`, meta, hard)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "AN002" || pgErr.Detail != `{"event": 0, "field": "stream_id"}` {
			t.Fatalf("delete_stream(%q, hard %v) = %v, want AN002 on stream_id", meta, hard, err)
		}
	}
	if _, err := b.store.SetStreamRetention(ctx, "o-1", eventstore.RetentionChange{MaxCount: &seven}); err != nil {
		t.Fatal(err)
	}
	var n int
	for _, err := range b.store.ReadStream(ctx, meta, 1) {
		if err != nil {
			t.Fatalf("reading %s: %v", meta, err)
		}
		n++
	}
	if n != 2 {
		t.Fatalf("%s holds %d events, want the 2 retention changes", meta, n)
	}
}
