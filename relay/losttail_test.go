package relay_test

import (
	"context"
	"fmt"
	"github.com/annals-dev/annals/annalstest"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/annals-dev/annals/checkpoint"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/migrations"
	"github.com/annals-dev/annals/relay"
)

// A stream that lost its newest messages (JetStream acknowledges before it
// writes to disk, so a crash of the server's machine, or its store restored
// from a backup, loses what it acknowledged last) is filled in again: the
// relay publishes events 1–10, its store is copied, it publishes 11–20
// (checkpoint 20), the copy is put back, 10 more events are appended, and
// the next run publishes 11–30 chained on event 10. The relay took the
// checkpoint at face value and published 21–30 on event 10: the stream
// held 1–10 and 21–30, and nothing said so.
func TestRelayRepublishesATailTheStreamLost(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	var logs annalstest.LogBuffer
	r, err := relay.New(b.db.Pool, b.nc, &relay.Config{BatchSize: 4, RetryBackoff: 20 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if t.Failed() {
			t.Logf("the relay's log:\n%s", logs.String())
		}
	}()
	appendMany(t, b.store, 10)
	if err := r.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	dir := b.ns.StoreDir()
	backup := filepath.Join(t.TempDir(), "backup")
	b.ns.Stop()
	if err := os.CopyFS(backup, os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	if err := b.ns.Up(); err != nil {
		t.Fatal(err)
	}
	appendMany(t, b.store, 10)
	if err := r.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	if cp := b.checkpoint("relay"); cp != 20 {
		t.Fatalf("checkpoint %d, want 20", cp)
	}
	// The store as it was at event 10.
	b.ns.Stop()
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.CopyFS(dir, os.DirFS(backup)); err != nil {
		t.Fatal(err)
	}
	if err := b.ns.Up(); err != nil {
		t.Fatal(err)
	}
	if n := len(b.relayed("ANNALS")); n != 10 {
		t.Fatalf("the restored stream holds %d messages, want 10", n)
	}
	appendMany(t, b.store, 10)
	if err := r.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	checkExactlyOnce(t, b.relayed("ANNALS"), b.log())
	if cp := b.checkpoint("relay"); cp != 30 {
		t.Fatalf("checkpoint %d, want 30", cp)
	}
	if l := logs.String(); !strings.Contains(l, "level=ERROR") || !strings.Contains(l, "lost") || !strings.Contains(l, "sync_interval") {
		t.Fatalf("the relay's log does not tell that the stream lost events 11–20, nor how to prevent it:\n%s", l)
	}
	// Once filled in, nothing more is said.
	before := strings.Count(logs.String(), "level=ERROR")
	appendMany(t, b.store, 2)
	if err := r.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	if after := strings.Count(logs.String(), "level=ERROR"); after != before {
		t.Fatalf("an error logged again after the stream was filled in:\n%s", logs.String())
	}
	checkExactlyOnce(t, b.relayed("ANNALS"), b.log())
}

// The way past an event too large for NATS still works: the checkpoint set
// to the event's position (as the relay's log says) above the stream's
// newest message is not taken for a lost tail, since the relay could never
// have published the event; the events after it are published, and
// nothing is logged as lost.
func TestRelayMovedPastAnEventOverMaxPayload(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	var logs annalstest.LogBuffer
	r := loggedRelay(t, b, &logs)
	appendMany(t, b.store, 3)
	if err := r.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	res, err := b.store.Append(ctx, "big", eventstore.NoStream,
		eventstore.EventData{Type: "t.big", Data: map[string]string{"s": strings.Repeat("x", 1_048_300)}})
	if err != nil {
		t.Fatal(err)
	}
	moveCheckpoint(t, b, res.Position())
	appendMany(t, b.store, 2)
	if err := r.CatchUp(ctx); err != nil {
		t.Fatalf("CatchUp past an event over max_payload: %v\n%s", err, logs.String())
	}
	log := b.log()
	checkExactlyOnce(t, b.relayed("ANNALS"), append(log[:3:3], log[4:]...))
	if l := logs.String(); strings.Contains(l, "level=ERROR") || strings.Contains(l, "level=WARN") {
		t.Fatalf("the relay logged a problem:\n%s", l)
	}
}

// An empty stream that never held a message, under a relay whose checkpoint
// is past 0 (a stream made by hand, or a store restored from before the
// relay's first publish), tells nothing of what it lacks: the relay
// publishes from its checkpoint on, as into a stream it made again, and
// says so once; a stream the relay made itself is told about once too (by
// EnsureStream), not again at the leadership's start.
func TestRelayOnAnEmptyStreamBehindItsCheckpoint(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	var logs annalstest.LogBuffer
	r := loggedRelay(t, b, &logs)
	if _, err := b.js.CreateStream(ctx, r.StreamConfig()); err != nil {
		t.Fatal(err)
	}
	appendMany(t, b.store, 5)
	cps, err := checkpoint.New("")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cps.Set(ctx, b.db.Pool, "relay", 0, 3); err != nil {
		t.Fatal(err)
	}
	if err := r.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	checkPositions(t, b.relayed("ANNALS"), 4, 5)
	if l := logs.String(); strings.Count(l, "is empty and has never held a message") != 1 || !strings.Contains(l, "checkpoint is at 3") ||
		!strings.Contains(l, "annals checkpoint set relay 0 --yes") || strings.Contains(l, "level=ERROR") {
		t.Fatalf("the relay's log does not tell once what the empty stream lacks, and how to publish it:\n%s", l)
	}
	// Made again by the relay: one warning, EnsureStream's.
	if err := b.js.DeleteStream(ctx, "ANNALS"); err != nil {
		t.Fatal(err)
	}
	appendMany(t, b.store, 2)
	if err := r.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	checkPositions(t, b.relayed("ANNALS"), 6, 7)
	if l := logs.String(); strings.Count(l, "checkpoint is at 5") != 1 || !strings.Contains(l, "created its JetStream stream") {
		t.Fatalf("the relay's log does not tell once that it made the stream again:\n%s", l)
	}
}

// loggedRelay returns a relay named "relay" of the given types (all when
// none) that claims again after 20 ms and logs into logs, shown when the
// test fails.
func loggedRelay(t *testing.T, b *bundle, logs *annalstest.LogBuffer, types ...string) *relay.Relay {
	t.Helper()
	r, err := relay.New(b.db.Pool, b.nc, &relay.Config{Types: types, RetryBackoff: 20 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the relay's log:\n%s", logs.String())
		}
	})
	return r
}

// moveCheckpoint moves the relay's checkpoint forward to pos, as an
// operator does past an event NATS refuses.
func moveCheckpoint(t *testing.T, b *bundle, pos int64) {
	t.Helper()
	cps, err := checkpoint.New("")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cps.Move(context.Background(), b.db.Pool, "relay", 0, pos); err != nil {
		t.Fatal(err)
	}
}

// checkPositions fails unless the stream holds the events at want, in
// that order.
func checkPositions(t *testing.T, msgs []jetstream.RawStreamMsg, want ...int64) {
	t.Helper()
	var got []int64
	for _, m := range msgs {
		e, err := relay.Decode(m.Header, m.Data)
		if err != nil {
			t.Fatalf("message %d: %v", m.Sequence, err)
		}
		got = append(got, e.GlobalSequence)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("the stream holds events %v, want %v", got, want)
	}
}

// snapshotStore copies the NATS server's store (the server stopped for it)
// and returns a function that puts the copy back, as a crash before
// JetStream's fsync or a restored backup leaves the store.
func snapshotStore(t *testing.T, b *bundle) (restore func()) {
	t.Helper()
	dir := b.ns.StoreDir()
	backup := filepath.Join(t.TempDir(), "backup")
	b.ns.Stop()
	if err := os.CopyFS(backup, os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	if err := b.ns.Up(); err != nil {
		t.Fatal(err)
	}
	return func() {
		t.Helper()
		b.ns.Stop()
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
		if err := os.CopyFS(dir, os.DirFS(backup)); err != nil {
			t.Fatal(err)
		}
		if err := b.ns.Up(); err != nil {
			t.Fatal(err)
		}
	}
}

// appendTypes appends one event of each type, in order, and returns their
// positions.
func appendTypes(t *testing.T, store *eventstore.Store, types ...string) []int64 {
	t.Helper()
	var out []int64
	for i, typ := range types {
		res, err := store.Append(context.Background(), fmt.Sprintf("s-%d", i%3), eventstore.Any,
			eventstore.EventData{Type: typ, Data: map[string]int{"i": i}})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, res.Position())
	}
	return out
}

// A checkpoint past the stream's newest message is no loss when the stream
// holds all it acknowledged; the reviewer's cases, which the relay took for
// a lost tail when it judged by the log (events for the stream between the
// stream's newest message and the checkpoint), each time logging an ERROR
// and moving its checkpoint back.
func TestRelayCheckpointPastTheStreamIsNoLoss(t *testing.T) {
	t.Parallel()
	// A relay of order.* reached checkpoint 7 with the stream holding
	// events 1–2 (it moves past the others); run again with payment.* too,
	// it moved back to 2 and published payment events 3–7: a back-fill of
	// some events, and a false alarm.
	t.Run("TypesAdded", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
		defer cancel()
		var logs annalstest.LogBuffer
		appendTypes(t, b.store, "order.placed", "order.placed", "payment.made", "payment.made", "payment.made", "payment.made", "payment.made")
		if err := loggedRelay(t, b, &logs, "order.*").CatchUp(ctx); err != nil {
			t.Fatal(err)
		}
		if cp := b.checkpoint("relay"); cp != 7 {
			t.Fatalf("checkpoint %d, want 7", cp)
		}
		appendTypes(t, b.store, "payment.made")
		if err := loggedRelay(t, b, &logs, "order.*", "payment.*").CatchUp(ctx); err != nil {
			t.Fatal(err)
		}
		checkPositions(t, b.relayed("ANNALS"), 1, 2, 8)
		if cp := b.checkpoint("relay"); cp != 8 {
			t.Fatalf("checkpoint %d, want 8", cp)
		}
		if l := logs.String(); strings.Contains(l, "level=ERROR") {
			t.Fatalf("the relay logged an error:\n%s", l)
		}
	})
	// An event JetStream refuses for a reason of its own (here the stream's
	// max_msg_size; a discard-new limit or a permission alike), not over
	// the connection's max_payload: the operator moves the checkpoint past
	// it, and the relay went back to it at every leadership, stuck for good.
	t.Run("OperatorMovedPastARefusedEvent", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
		defer cancel()
		var logs annalstest.LogBuffer
		r := loggedRelay(t, b, &logs)
		cfg := r.StreamConfig()
		cfg.MaxMsgSize = 4096
		if _, err := b.js.CreateStream(ctx, cfg); err != nil {
			t.Fatal(err)
		}
		appendMany(t, b.store, 3)
		if err := r.CatchUp(ctx); err != nil {
			t.Fatal(err)
		}
		res, err := b.store.Append(ctx, "big", eventstore.NoStream,
			eventstore.EventData{Type: "t.big", Data: map[string]string{"s": strings.Repeat("x", 8192)}})
		if err != nil {
			t.Fatal(err)
		}
		moveCheckpoint(t, b, res.Position())
		appendMany(t, b.store, 2)
		if err := r.CatchUp(ctx); err != nil {
			t.Fatalf("CatchUp past an event the stream refuses: %v", err)
		}
		checkPositions(t, b.relayed("ANNALS"), 1, 2, 3, 5, 6)
		if l := logs.String(); strings.Contains(l, "level=ERROR") {
			t.Fatalf("the relay logged an error:\n%s", l)
		}
	})
	// An operator's purge empties the stream and keeps its last sequence:
	// nothing acknowledged is missing, and the relay goes on from its
	// checkpoint.
	t.Run("Purged", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
		defer cancel()
		var logs annalstest.LogBuffer
		r := loggedRelay(t, b, &logs, "order.*")
		cfg := r.StreamConfig()
		cfg.DenyPurge = false
		s, err := b.js.CreateStream(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		appendTypes(t, b.store, "order.placed", "order.placed", "payment.made")
		if err := r.CatchUp(ctx); err != nil {
			t.Fatal(err)
		}
		if err := s.Purge(ctx); err != nil {
			t.Fatal(err)
		}
		appendTypes(t, b.store, "payment.made", "order.placed")
		if err := r.CatchUp(ctx); err != nil {
			t.Fatal(err)
		}
		checkPositions(t, b.relayed("ANNALS"), 5)
		if cp := b.checkpoint("relay"); cp != 5 {
			t.Fatalf("checkpoint %d, want 5", cp)
		}
		if l := logs.String(); strings.Contains(l, "level=ERROR") || strings.Contains(l, "level=WARN") {
			t.Fatalf("the relay logged a problem:\n%s", l)
		}
	})
}

// An event over max_payload that an operator moved the relay past, below a
// tail the stream then lost, is passed over again when the relay publishes
// that tail again: the stream held 1–3, the operator moved past 4, the
// relay published 5–6, the store was restored to 1–3. The relay moved back
// to 3 and failed on 4 at every leadership.
func TestRelayRefillPassesOverAnEventTheOperatorSkipped(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	var logs annalstest.LogBuffer
	r := loggedRelay(t, b, &logs)
	appendMany(t, b.store, 3)
	if err := r.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	restore := snapshotStore(t, b)
	res, err := b.store.Append(ctx, "big", eventstore.NoStream,
		eventstore.EventData{Type: "t.big", Data: map[string]string{"s": strings.Repeat("x", 1_048_300)}})
	if err != nil {
		t.Fatal(err)
	}
	moveCheckpoint(t, b, res.Position())
	appendMany(t, b.store, 2)
	if err := r.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	checkPositions(t, b.relayed("ANNALS"), 1, 2, 3, 5, 6)
	restore()
	checkPositions(t, b.relayed("ANNALS"), 1, 2, 3)
	appendMany(t, b.store, 2)
	if err := r.CatchUp(ctx); err != nil {
		t.Fatalf("CatchUp after the stream lost 5–6: %v", err)
	}
	checkPositions(t, b.relayed("ANNALS"), 1, 2, 3, 5, 6, 7, 8)
	if cp := b.checkpoint("relay"); cp != 8 {
		t.Fatalf("checkpoint %d, want 8", cp)
	}
	if l := logs.String(); !strings.Contains(l, "lost messages it had acknowledged") {
		t.Fatalf("the relay's log does not tell that the stream lost events 5–6:\n%s", l)
	}
}

// A relay that has recorded nothing of what its stream acknowledged (its
// first run of a version that records) cannot tell a lost tail from a
// checkpoint past the stream for other reasons: it does not move back, as
// before; from its next commit on it can.
func TestRelayWithoutARecordDoesNotMoveBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	var logs annalstest.LogBuffer
	r := loggedRelay(t, b, &logs)
	appendMany(t, b.store, 3)
	if err := r.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	restore := snapshotStore(t, b)
	appendMany(t, b.store, 2)
	if err := r.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := b.db.Pool.Exec(ctx, `DELETE FROM annals.relay_acks`); err != nil {
		t.Fatal(err)
	}
	restore()
	appendMany(t, b.store, 1)
	if err := r.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	checkPositions(t, b.relayed("ANNALS"), 1, 2, 3, 6)
	if l := logs.String(); strings.Contains(l, "level=ERROR") {
		t.Fatalf("the relay logged a loss it cannot tell:\n%s", l)
	}
}

// A stream that lost messages it had acknowledged and holds none now (the
// tail lost in a crash, the rest removed since: a purge here, MaxAge
// alike) keeps its last sequence, below the one the relay recorded; no
// message tells which event was at it, so the relay cannot publish the
// lost ones again (see publisher.behind), but it says so, at ERROR, with
// the lost sequences and how to publish them. It said nothing: its newest
// message gave no position, and it told only of a stream that never held
// one. A store restored from before the relay's first publish into the
// stream (empty, last sequence 0, the same stream) lost everything it
// acknowledged: an ERROR too, not the WARN of a stream that never held a
// message.
func TestRelayOnAnEmptyStreamThatLostWhatItAcknowledged(t *testing.T) {
	t.Parallel()
	check := func(t *testing.T, b *bundle, logs *annalstest.LogBuffer, r *relay.Relay, lost string, want ...int64) {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
		defer cancel()
		if err := r.CatchUp(ctx); err != nil {
			t.Fatal(err)
		}
		checkPositions(t, b.relayed("ANNALS"), want...)
		l := logs.String()
		if strings.Count(l, "level=ERROR") != 1 || !strings.Contains(l, "holds none now") || !strings.Contains(l, "sequences "+lost) ||
			!strings.Contains(l, "nats stream rm ANNALS -f") || !strings.Contains(l, "annals checkpoint set relay 0 --yes") ||
			strings.Contains(l, "has never held a message") {
			t.Fatalf("the relay's log does not tell once, at ERROR, that the stream lost sequences %s and how to publish them:\n%s", lost, l)
		}
		// Once the relay has published into the stream, nothing more is
		// said.
		appendMany(t, b.store, 1)
		if err := r.CatchUp(ctx); err != nil {
			t.Fatal(err)
		}
		checkPositions(t, b.relayed("ANNALS"), append(want, want[len(want)-1]+1)...)
		if strings.Count(logs.String(), "level=ERROR") != 1 {
			t.Fatalf("an error logged again after the relay published into the stream:\n%s", logs.String())
		}
	}
	t.Run("Purged", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
		defer cancel()
		var logs annalstest.LogBuffer
		r := loggedRelay(t, b, &logs)
		cfg := r.StreamConfig()
		cfg.DenyPurge = false
		if _, err := b.js.CreateStream(ctx, cfg); err != nil {
			t.Fatal(err)
		}
		appendMany(t, b.store, 3)
		if err := r.CatchUp(ctx); err != nil {
			t.Fatal(err)
		}
		restore := snapshotStore(t, b)
		appendMany(t, b.store, 3)
		if err := r.CatchUp(ctx); err != nil {
			t.Fatal(err)
		}
		restore()
		s, err := b.js.Stream(ctx, "ANNALS")
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Purge(ctx); err != nil {
			t.Fatal(err)
		}
		appendMany(t, b.store, 1)
		check(t, b, &logs, r, "4–6", 7)
	})
	t.Run("RestoredToEmpty", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
		defer cancel()
		var logs annalstest.LogBuffer
		r := loggedRelay(t, b, &logs)
		if _, err := r.EnsureStream(ctx); err != nil {
			t.Fatal(err)
		}
		restore := snapshotStore(t, b)
		appendMany(t, b.store, 3)
		if err := r.CatchUp(ctx); err != nil {
			t.Fatal(err)
		}
		restore()
		appendMany(t, b.store, 1)
		check(t, b, &logs, r, "1–3", 4)
	})
}

// A stream deleted and made again under the relay's stream name, by hand
// or by a server that lost its store (here with first_seq, so that it
// neither is empty of sequences nor was made by the relay), holds none of
// the events up to the relay's checkpoint: the relay publishes from its
// checkpoint on and says so, once per stream, as when it makes the stream
// itself. It said nothing: the stream's creation time differs from the
// one recorded, which only ruled out a lost tail.
func TestRelayTellsOfAStreamMadeAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	var logs annalstest.LogBuffer
	r := loggedRelay(t, b, &logs)
	appendMany(t, b.store, 3)
	if err := r.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.js.DeleteStream(ctx, "ANNALS"); err != nil {
		t.Fatal(err)
	}
	cfg := r.StreamConfig()
	cfg.FirstSeq = 4
	if _, err := b.js.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	// Two leaderships before the relay publishes into it: told once.
	for range 2 {
		if err := r.CatchUp(ctx); err != nil {
			t.Fatal(err)
		}
	}
	appendMany(t, b.store, 2)
	if err := r.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	checkPositions(t, b.relayed("ANNALS"), 4, 5)
	if cp := b.checkpoint("relay"); cp != 5 {
		t.Fatalf("checkpoint %d, want 5", cp)
	}
	if l := logs.String(); strings.Count(l, "was made again") != 1 || !strings.Contains(l, "checkpoint is at 3") ||
		!strings.Contains(l, "annals checkpoint set relay 0 --yes") || strings.Contains(l, "level=ERROR") {
		t.Fatalf("the relay's log does not tell once that the stream was made again, and how to publish the earlier events:\n%s", l)
	}
}

// Events NATS refuses for good other than over max_payload, which an
// operator moved the relay past, below a tail the stream then lost, are
// passed over again when the relay publishes that tail again: one over the
// stream's max_msg_size (4), one whose metadata makes its headers over 64
// KiB (7). The stream held 1–3, the relay published 5–6 and 8–9, the store
// was restored to 1–3. The relay moved back to 3 and failed on 4 at every
// leadership: it passed over only max_payload, which the client refuses
// before sending; JetStream's refusals come with the acknowledgements,
// when the events after the refused one are in flight, chained on it.
func TestRefillPassesOverWhatTheStreamRefusesForGood(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	var logs annalstest.LogBuffer
	r := loggedRelay(t, b, &logs)
	cfg := r.StreamConfig()
	cfg.MaxMsgSize = 200_000
	if _, err := b.js.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	appendMany(t, b.store, 3)
	if err := r.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	restore := snapshotStore(t, b)
	for _, e := range []eventstore.EventData{
		{Type: "t.big", Data: map[string]string{"s": strings.Repeat("x", 300_000)}},
		{Type: "t.meta", Data: map[string]int{}, Metadata: eventstore.Metadata{Extra: map[string]any{"s": strings.Repeat("y", 70_000)}}},
	} {
		res, err := b.store.Append(ctx, e.Type, eventstore.NoStream, e)
		if err != nil {
			t.Fatal(err)
		}
		moveCheckpoint(t, b, res.Position())
		appendMany(t, b.store, 2)
		if err := r.CatchUp(ctx); err != nil {
			t.Fatal(err)
		}
	}
	checkPositions(t, b.relayed("ANNALS"), 1, 2, 3, 5, 6, 8, 9)
	restore()
	appendMany(t, b.store, 2)
	if err := r.CatchUp(ctx); err != nil {
		t.Fatalf("CatchUp after the stream lost 5–9: %v", err)
	}
	checkPositions(t, b.relayed("ANNALS"), 1, 2, 3, 5, 6, 8, 9, 10, 11)
	if cp := b.checkpoint("relay"); cp != 11 {
		t.Fatalf("checkpoint %d, want 11", cp)
	}
	l := logs.String()
	if !strings.Contains(l, "lost messages it had acknowledged") || !strings.Contains(l, "err_code=10054") || !strings.Contains(l, "err_code=10097") ||
		strings.Count(l, "passes over an event NATS refuses for good") != 2 {
		t.Fatalf("the relay's log does not tell that the stream lost 5–9 and that it passed over 4 and 7 again:\n%s", l)
	}
	// Past the refill, an event the stream refuses for good waits, and the
	// relay says how to move past it.
	res, err := b.store.Append(ctx, "big", eventstore.NoStream,
		eventstore.EventData{Type: "t.big", Data: map[string]string{"s": strings.Repeat("x", 300_000)}})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.CatchUp(ctx); err == nil {
		t.Fatal("CatchUp published an event over the stream's max_msg_size")
	}
	want := fmt.Sprintf("annals checkpoint set relay %d --yes", res.Position())
	if l := logs.String(); !strings.Contains(l, "max_msg_size") || !strings.Contains(l, want) {
		t.Fatalf("the relay's log does not name the stream's max_msg_size and %q:\n%s", want, l)
	}
	checkPositions(t, b.relayed("ANNALS"), 1, 2, 3, 5, 6, 8, 9, 10, 11)
}

// A refill that spans leaderships passes over what NATS refuses for good up
// to where the first found the checkpoint: the bound is kept with the
// checkpoint (relay_acks), not by the leadership that moved back. Here the
// first ends on a stream full under a discard-new limit (lowered after the
// store was restored), which is no reason to pass over anything; with the
// limit raised, the next leadership finds the stream's newest message at
// its checkpoint, nothing lost, and went on to event 6, over the stream's
// max_msg_size, which an operator had moved past: it failed on it for good.
func TestRefillGoesOnAcrossLeaderships(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	var logs annalstest.LogBuffer
	r := loggedRelay(t, b, &logs)
	cfg := r.StreamConfig()
	cfg.MaxMsgSize, cfg.Discard = 200_000, jetstream.DiscardNew
	if _, err := b.js.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	appendMany(t, b.store, 3)
	if err := r.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	restore := snapshotStore(t, b)
	appendMany(t, b.store, 2)
	if err := r.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	res, err := b.store.Append(ctx, "big", eventstore.NoStream,
		eventstore.EventData{Type: "t.big", Data: map[string]string{"s": strings.Repeat("x", 300_000)}})
	if err != nil {
		t.Fatal(err)
	}
	moveCheckpoint(t, b, res.Position())
	appendMany(t, b.store, 1)
	if err := r.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	checkPositions(t, b.relayed("ANNALS"), 1, 2, 3, 4, 5, 7)
	restore()
	setMaxMsgs := func(n int64) {
		t.Helper()
		cfg.MaxMsgs = n
		if _, err := b.js.UpdateStream(ctx, cfg); err != nil {
			t.Fatal(err)
		}
	}
	setMaxMsgs(4)
	if err := r.CatchUp(ctx); err == nil {
		t.Fatal("CatchUp published more than the stream's max_msgs")
	}
	checkPositions(t, b.relayed("ANNALS"), 1, 2, 3, 4)
	if cp := b.checkpoint("relay"); cp != 4 {
		t.Fatalf("checkpoint %d, want 4", cp)
	}
	setMaxMsgs(-1)
	if err := r.CatchUp(ctx); err != nil {
		t.Fatalf("CatchUp with the refill under way: %v", err)
	}
	checkPositions(t, b.relayed("ANNALS"), 1, 2, 3, 4, 5, 7)
	if cp := b.checkpoint("relay"); cp != 7 {
		t.Fatalf("checkpoint %d, want 7", cp)
	}
	if l := logs.String(); strings.Count(l, "passes over an event NATS refuses for good") != 1 {
		t.Fatalf("the relay's log does not tell once that it passed over event 6 again:\n%s", l)
	}
}

// An event the stream had stored and acknowledged (4, 8 KB under a
// max_msg_size of 200 000), lost with the tail, and refused in the refill
// because an operator lowered max_msg_size since (to 4096), is not one an
// operator moved the relay past: the refill stops at it and says, at
// ERROR, to raise the limit; raised, the refill publishes it and goes on.
// The refill passed over it, with a WARN that an operator had moved the
// relay past it: the stream, which had delivered 4, no longer held it.
func TestRefillStopsAtAnEventTheStreamHadStored(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	var logs annalstest.LogBuffer
	r := loggedRelay(t, b, &logs)
	cfg := r.StreamConfig()
	cfg.MaxMsgSize = 200_000
	if _, err := b.js.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	appendMany(t, b.store, 3)
	if err := r.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	restore := snapshotStore(t, b)
	if _, err := b.store.Append(ctx, "mid", eventstore.NoStream,
		eventstore.EventData{Type: "t.mid", Data: map[string]string{"s": strings.Repeat("x", 8192)}}); err != nil {
		t.Fatal(err)
	}
	appendMany(t, b.store, 2)
	if err := r.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	checkPositions(t, b.relayed("ANNALS"), 1, 2, 3, 4, 5, 6) // 4 stored and acknowledged
	restore()
	cfg.MaxMsgSize = 4096
	if _, err := b.js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if err := r.CatchUp(ctx); err == nil {
		t.Fatal("CatchUp passed over event 4, which the stream had stored")
	}
	checkPositions(t, b.relayed("ANNALS"), 1, 2, 3)
	if cp := b.checkpoint("relay"); cp != 3 {
		t.Fatalf("checkpoint %d, want 3", cp)
	}
	l := logs.String()
	if strings.Contains(l, "passes over") || strings.Count(l, "refuses event 4") == 0 ||
		!strings.Contains(l, "level=ERROR msg=\"annals: the relay publishes again what its JetStream stream ANNALS lost, and the stream refuses event 4") ||
		!strings.Contains(l, "Raise the limit") || !strings.Contains(l, "max_msg_size") {
		t.Fatalf("the relay's log does not tell, at ERROR, that the refill stops at event 4, which the stream had stored, until max_msg_size is raised:\n%s", l)
	}
	cfg.MaxMsgSize = 200_000
	if _, err := b.js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if err := r.CatchUp(ctx); err != nil {
		t.Fatalf("CatchUp with max_msg_size raised again: %v", err)
	}
	checkPositions(t, b.relayed("ANNALS"), 1, 2, 3, 4, 5, 6)
	if cp := b.checkpoint("relay"); cp != 6 {
		t.Fatalf("checkpoint %d, want 6", cp)
	}
}

// A refill checks what NATS refuses for good before it sends (the stream's
// max_msg_size, headers over 64 KiB): the events an operator had moved the
// relay past (4, over max_msg_size; 7, its metadata over 64 KiB of
// headers) are never sent, so no message is chained on one the stream
// refuses (on a replicated stream, its successors were then refused as
// "in process" duplicates until the duplicate window passed). A core NATS
// subscription on the stream's subjects sees every publish: 5, 6 and 8
// once each, and neither 4 nor 7. The refill sent 4 and 7, learnt of the
// refusal with the acknowledgements, and sent 5, 6 and 8 twice.
func TestRefillDoesNotSendWhatTheStreamRefusesForGood(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	var logs annalstest.LogBuffer
	r := loggedRelay(t, b, &logs)
	cfg := r.StreamConfig()
	cfg.MaxMsgSize = 200_000
	if _, err := b.js.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	appendMany(t, b.store, 3)
	if err := r.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	restore := snapshotStore(t, b)
	var skipped []int64
	for i, e := range []eventstore.EventData{
		{Type: "t.big", Data: map[string]string{"s": strings.Repeat("x", 300_000)}},
		{Type: "t.meta", Data: map[string]int{}, Metadata: eventstore.Metadata{Extra: map[string]any{"s": strings.Repeat("y", 70_000)}}},
	} {
		res, err := b.store.Append(ctx, e.Type, eventstore.NoStream, e)
		if err != nil {
			t.Fatal(err)
		}
		skipped = append(skipped, res.Position())
		moveCheckpoint(t, b, res.Position())
		appendMany(t, b.store, 2-i)
		if err := r.CatchUp(ctx); err != nil {
			t.Fatal(err)
		}
	}
	checkPositions(t, b.relayed("ANNALS"), 1, 2, 3, 5, 6, 8)
	restore()
	nc, err := nats.Connect(b.ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	sent := make(chan *nats.Msg, 64)
	if _, err := nc.ChanSubscribe(r.SubjectFilter(), sent); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := r.CatchUp(ctx); err != nil {
		t.Fatalf("CatchUp after the stream lost 5–8: %v", err)
	}
	checkPositions(t, b.relayed("ANNALS"), 1, 2, 3, 5, 6, 8)
	// In order from the relay's one connection: once 8 is in, every
	// publish before it is.
	var got []int64
	for len(got) == 0 || got[len(got)-1] != 8 {
		select {
		case m := <-sent:
			pos, err := strconv.ParseInt(m.Header.Get(relay.HeaderPosition), 10, 64)
			if err != nil {
				t.Fatalf("a message without a position: %v", err)
			}
			got = append(got, pos)
		case <-ctx.Done():
			t.Fatalf("the subscription saw %v, not event 8", got)
		}
	}
	if !slices.Equal(got, []int64{5, 6, 8}) {
		t.Fatalf("the refill sent events %v, want 5, 6 and 8 once each (the events passed over, %v, never)", got, skipped)
	}
	if l := logs.String(); strings.Count(l, "passes over an event NATS refuses for good") != 2 {
		t.Fatalf("the relay's log does not tell once each that it passed over 4 and 7:\n%s", l)
	}
}

// A relay of this version on a schema migrated through 0036 (deployed
// before `annals migrate`; relay_acks as 0036 left it, without 0037's
// columns) fails at each leadership on relay_acks' new columns: the error
// is marked migrations.ErrNotMigrated and says to run annals migrate. It
// was a bare 42703 (column "refill_to" does not exist).
func TestRelayOnASchemaBefore0037(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	if _, err := b.db.Pool.Exec(ctx, `ALTER TABLE annals.relay_acks DROP COLUMN refill_to, DROP COLUMN refill_seq`); err != nil {
		t.Fatal(err)
	}
	appendMany(t, b.store, 2)
	r, err := relay.New(b.db.Pool, b.nc, &relay.Config{RetryBackoff: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	err = r.CatchUp(ctx)
	if !errors.Is(err, migrations.ErrNotMigrated) || !strings.Contains(err.Error(), "annals migrate") {
		t.Fatalf("CatchUp on a schema migrated through 0036: %v; want migrations.ErrNotMigrated, saying to run annals migrate", err)
	}
}
