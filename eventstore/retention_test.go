package eventstore_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals/eventstore"
)

func versions(t *testing.T, s *eventstore.Store, stream string) []int64 {
	t.Helper()
	evs, err := collect(t, s.ReadStream(context.Background(), stream, 0))
	if err != nil {
		t.Fatal(err)
	}
	out := []int64{}
	for _, e := range evs {
		out = append(out, e.StreamVersion)
	}
	return out
}

func equal(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Stream reads honour a stream's retention as soon as it is set; the log
// keeps the rows (for the scavenger) and gets a $stream.truncated event.
func TestStreamRetentionReads(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var offset atomic.Int64 // the injected clock: wall time + offset
	b := setup(t, &eventstore.Config{Clock: func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }})
	if err := eventstore.RegisterLifecycleEvents(b.reg); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"count", "age", "trunc"} {
		for i := 0; i < 5; i++ {
			if _, err := b.store.Append(ctx, s, eventstore.Any, placed(s)); err != nil {
				t.Fatal(err)
			}
		}
	}
	two, hour, three := int64(2), time.Hour, int64(3)
	info, err := b.store.SetStreamRetention(ctx, "count", eventstore.RetentionChange{MaxCount: &two})
	if err != nil || info.MaxCount != 2 || info.Version != 5 {
		t.Fatalf("set max count: %+v %v", info, err)
	}
	if v := versions(t, b.store, "count"); !equal(v, []int64{4, 5}) {
		t.Fatalf("max count 2: versions %v", v)
	}
	if _, err := b.store.SetStreamRetention(ctx, "age", eventstore.RetentionChange{MaxAge: &hour}); err != nil {
		t.Fatal(err)
	}
	if v := versions(t, b.store, "age"); len(v) != 5 {
		t.Fatalf("max age 1h, nothing old: versions %v", v)
	}
	offset.Store(int64(2 * time.Hour))
	if v := versions(t, b.store, "age"); len(v) != 0 {
		t.Fatalf("max age 1h, clock 2h on: versions %v", v)
	}
	if _, err := b.store.Append(ctx, "age", eventstore.Exact(5), placed("new")); err != nil {
		t.Fatal(err)
	}
	offset.Store(0) // the new event is "older" than the clock now: still inside 1h
	if v := versions(t, b.store, "age"); len(v) != 6 {
		t.Fatalf("max age 1h, clock back: versions %v", v)
	}
	info, err = b.store.SetStreamRetention(ctx, "trunc", eventstore.RetentionChange{TruncateBefore: &three})
	if err != nil || info.TruncateBefore != 3 {
		t.Fatalf("truncate: %+v %v", info, err)
	}
	if v := versions(t, b.store, "trunc"); !equal(v, []int64{3, 4, 5}) {
		t.Fatalf("truncate before 3: versions %v", v)
	}
	// Lower: refused (it was ignored, and recorded all the same), with the
	// current one as the limit.
	one := int64(1)
	var inv *eventstore.InvalidEventError
	if _, err = b.store.SetStreamRetention(ctx, "trunc", eventstore.RetentionChange{TruncateBefore: &one}); !errors.Is(err, eventstore.ErrInvalidEvent) ||
		!errors.As(err, &inv) || inv.Field != "truncate_before" || inv.Limit != 3 || !strings.Contains(err.Error(), "can only grow") {
		t.Fatalf("lower truncate: %v", err)
	}
	// The same again: unchanged, nothing recorded.
	for _, v := range []int64{3} {
		res, err := b.store.SetStreamRetention(ctx, "trunc", eventstore.RetentionChange{TruncateBefore: &v})
		if err != nil || !res.Unchanged || res.Position != 0 || res.TruncateBefore != 3 {
			t.Fatalf("truncate before %d again: %+v %v", v, res, err)
		}
	}
	var noAge time.Duration
	if res, err := b.store.SetStreamRetention(ctx, "trunc", eventstore.RetentionChange{MaxAge: &noAge}); err != nil || !res.Unchanged {
		t.Fatalf("max age 0 without one: %+v %v", res, err)
	}
	zero := int64(0) // clears the count limit
	if info, err = b.store.SetStreamRetention(ctx, "count", eventstore.RetentionChange{MaxCount: &zero}); err != nil || info.MaxCount != 0 {
		t.Fatalf("clear count: %+v %v", info, err)
	}
	if v := versions(t, b.store, "count"); len(v) != 5 {
		t.Fatalf("no limit: versions %v (the rows are kept until scavenged)", v)
	}
	// The changes are events of the metadata streams (one: the calls that
	// changed nothing recorded nothing).
	evs, err := collect(t, b.store.ReadStream(ctx, eventstore.MetadataStream("trunc"), 0))
	if err != nil || len(evs) != 1 {
		t.Fatalf("metadata stream: %v %+v", err, evs)
	}
	env, err := eventstore.Decode[eventstore.StreamTruncated](b.reg, evs[0])
	if err != nil || env.Data.StreamID != "trunc" || env.Data.TruncateBefore != 3 || env.Data.MaxCount != nil ||
		env.Data.Deleted != "" || env.Data.Version != 0 {
		t.Fatalf("truncated event: %+v %v", env.Data, err)
	}
	// The stream itself is untouched: same version, appends as before.
	if v, err := b.store.StreamVersion(ctx, "trunc"); err != nil || v != 5 {
		t.Fatalf("version %d %v", v, err)
	}
	// Refusals.
	if _, err := b.store.SetStreamRetention(ctx, "nope", eventstore.RetentionChange{MaxCount: &two}); !errors.Is(err, eventstore.ErrStreamNotFound) {
		t.Fatalf("missing stream: %v", err)
	}
	neg := int64(-1)
	if _, err := b.store.SetStreamRetention(ctx, "count", eventstore.RetentionChange{MaxCount: &neg}); !errors.Is(err, eventstore.ErrInvalidEvent) {
		t.Fatalf("negative count: %v", err)
	}
	// The longest age is the server's bound too: it is accepted, and a
	// longer one refused before it is sent.
	longest, over := eventstore.MaxRetentionAge, eventstore.MaxRetentionAge+time.Hour
	if info, err := b.store.SetStreamRetention(ctx, "age", eventstore.RetentionChange{MaxAge: &longest}); err != nil || info.MaxAge != longest {
		t.Fatalf("max age of %v: %+v, %v", longest, info, err)
	}
	if _, err := b.store.SetStreamRetention(ctx, "age", eventstore.RetentionChange{MaxAge: &over}); !errors.Is(err, eventstore.ErrInvalidEvent) {
		t.Fatalf("max age of %v: %v, want ErrInvalidEvent", over, err)
	}
}

// A stream with the longest ID an append takes takes a retention too, and
// its record goes to a metadata stream 2 bytes longer than the limit
// (migration 0041: before, the function refused it, naming 514 bytes).
func TestRetentionOfTheLongestStreamID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, nil)
	for _, n := range []int{eventstore.MaxStreamIDBytes - 1, eventstore.MaxStreamIDBytes} {
		stream := strings.Repeat("r", n)
		for i := 0; i < 3; i++ {
			if _, err := b.store.Append(ctx, stream, eventstore.Any, placed(stream)); err != nil {
				t.Fatal(err)
			}
		}
		two := int64(2)
		res, err := b.store.SetStreamRetention(ctx, stream, eventstore.RetentionChange{TruncateBefore: &two})
		if err != nil {
			t.Fatalf("%d-byte stream ID: %v", n, err)
		}
		if res.Unchanged || res.Position == 0 || res.TruncateBefore != 2 {
			t.Fatalf("%d-byte stream ID: %+v", n, res)
		}
		if got := versions(t, b.store, stream); !equal(got, []int64{2, 3}) {
			t.Fatalf("%d-byte stream ID: versions %v after truncate_before 2", n, got)
		}
		var meta string
		if err := b.db.Pool.QueryRow(ctx, `SELECT stream_id FROM annals.events WHERE global_sequence = $1`, res.Position).Scan(&meta); err != nil {
			t.Fatal(err)
		}
		if meta != eventstore.MetadataStream(stream) {
			t.Fatalf("%d-byte stream ID: the record went to a stream of %d bytes, not its metadata stream", n, len(meta))
		}
	}
	// One byte more is refused before it is sent, with the append's limit.
	over := strings.Repeat("r", eventstore.MaxStreamIDBytes+1)
	two := int64(2)
	_, err := b.store.SetStreamRetention(ctx, over, eventstore.RetentionChange{TruncateBefore: &two})
	var inv *eventstore.InvalidEventError
	if !errors.As(err, &inv) || inv.Field != "stream_id" || inv.Limit != eventstore.MaxStreamIDBytes {
		t.Fatalf("a %d-byte stream ID: %v (%+v)", len(over), err, inv)
	}
}
