package relay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/relay"
)

// recordedRewinds reads the rewinds the relay recorded (migration 0043),
// oldest stream first.
func recordedRewinds(t *testing.T, pool *pgxpool.Pool) relay.Rewinds {
	t.Helper()
	var raw []byte
	err := pool.QueryRow(context.Background(), `SELECT rewinds FROM annals.relay_acks WHERE subscriber_id = 'relay'`).Scan(&raw)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var rs relay.Rewinds
	if err := json.Unmarshal(raw, &rs); err != nil {
		t.Fatal(err)
	}
	return rs
}

// recordedRewind reads the newest rewind the relay recorded: the stream,
// its creation time and the agreed position; at -1 when nothing is
// recorded.
func recordedRewind(t *testing.T, pool *pgxpool.Pool) (stream string, created time.Time, at int64) {
	t.Helper()
	rs := recordedRewinds(t, pool)
	if len(rs) == 0 {
		return "", time.Time{}, -1
	}
	rw := rs[len(rs)-1]
	return rw.Stream, rw.Created, rw.At
}

// TestRelayRecordsWhereARewoundLogAgrees: the log (40 events relayed) is
// rewound to 23, as a restore or an asynchronous failover leaves it. The
// relay, on a role with a runner's rights, refuses its stream (past the
// head) and records that the stream and the log last agree at 23, found by
// a binary search over the stream; once the log has grown past the
// stream's newest position, the event ID shows the rewind, and the
// position recorded stays. A relay process started after that (nothing
// kept in memory), with the stream deleted by the operator, makes the
// stream anew stamped with position 23, the old stream's name and
// creation time, and publishes the rewound log into it from position 0,
// each event once.
func TestRelayRecordsWhereARewoundLogAgrees(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	appendMany(t, b.store, 40)
	pool := runnerPool(t, b)
	r, err := relay.New(pool, b.nc, &relay.Config{RetryBackoff: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	s, err := b.js.Stream(ctx, "ANNALS")
	if err != nil {
		t.Fatal(err)
	}
	oldCreated := s.CachedInfo().Created
	if _, _, at := recordedRewind(t, b.db.Pool); at != -1 {
		t.Fatalf("a rewind recorded at %d before any", at)
	}

	annalstest.RewindLog(t, b.db.Pool, "annals", 23)
	appendMany(t, b.store, 5) // 24..28, other events
	err = r.CatchUp(ctx)
	if !errors.Is(err, relay.ErrStreamMismatch) || !strings.Contains(err.Error(), "past this log's head (28)") ||
		!strings.Contains(err.Error(), "last agree at position 23") {
		t.Fatalf("CatchUp on the rewound log: %v; want ErrStreamMismatch, past the head, saying where they agree (23)", err)
	}
	check := func(what string) {
		t.Helper()
		stream, created, at := recordedRewind(t, b.db.Pool)
		if stream != "ANNALS" || !created.Equal(oldCreated) || at != 23 {
			t.Fatalf("%s: recorded the rewind of stream %q made at %v at position %d; want ANNALS, %v, 23", what, stream, created, at, oldCreated)
		}
	}
	check("past the head")

	// Past the stream's newest position: the event ID tells.
	appendMany(t, b.store, 20) // 29..48
	r2, err := relay.New(pool, b.nc, &relay.Config{RetryBackoff: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	err = r2.CatchUp(ctx)
	if !errors.Is(err, relay.ErrStreamMismatch) || !strings.Contains(err.Error(), "this log's event there is") ||
		!strings.Contains(err.Error(), "last agree at position 23") {
		t.Fatalf("CatchUp on the rewound log grown past the stream: %v; want ErrStreamMismatch by the event ID, saying where they agree (23)", err)
	}
	check("by the event ID")

	// The operator deletes the stream and sets the checkpoint to 0; a relay
	// started after (as a new process: nothing in memory) makes the stream
	// anew, stamped.
	if err := b.js.DeleteStream(ctx, "ANNALS"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.db.Pool.Exec(ctx, `UPDATE annals.checkpoints SET position = 0 WHERE subscriber_id = 'relay'`); err != nil {
		t.Fatal(err)
	}
	r3, err := relay.New(pool, b.nc, &relay.Config{RetryBackoff: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := r3.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	s, err = b.js.Stream(ctx, "ANNALS")
	if err != nil {
		t.Fatal(err)
	}
	md := s.CachedInfo().Config.Metadata
	want := fmt.Sprintf(`[{"stream":"ANNALS","created":%q,"at":23}]`, oldCreated.UTC().Format(time.RFC3339Nano))
	if md[relay.MetadataRewinds] != want || md[relay.MetadataRelay] != "relay" {
		t.Fatalf("the stream made anew has metadata %v; want the rewind stamped: %s", md, want)
	}
	rs, ok, err := relay.RewindsOf(md)
	if err != nil || !ok || len(rs) != 1 || rs[0].At != 23 || !rs[0].Created.Equal(oldCreated) || rs[0].Stream != "ANNALS" {
		t.Fatalf("RewindsOf: %+v, %v, %v", rs, ok, err)
	}
	checkExactlyOnce(t, b.relayed("ANNALS"), b.log())
	if n := len(b.log()); n != 48 {
		t.Fatalf("the log holds %d events, want 48", n)
	}
	// The relay goes on with the new stream; the rewind stays recorded.
	appendMany(t, b.store, 2)
	if err := r3.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	checkExactlyOnce(t, b.relayed("ANNALS"), b.log())
	check("after the stream was made anew")
}

// TestRelayRewoundNoneAgrees: a stream none of whose messages is the log's
// event at its position (the log rewound to before the first of them)
// agrees nowhere: position 0 is recorded and stamped.
func TestRelayRewoundNoneAgrees(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	appendMany(t, b.store, 6)
	r, err := relay.New(b.db.Pool, b.nc, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	annalstest.RewindLog(t, b.db.Pool, "annals", 0)
	appendMany(t, b.store, 9)
	if err := r.CatchUp(ctx); !errors.Is(err, relay.ErrStreamMismatch) || !strings.Contains(err.Error(), "last agree at position 0") {
		t.Fatalf("CatchUp on a log rewound to 0: %v; want ErrStreamMismatch saying they agree at 0", err)
	}
	if _, _, at := recordedRewind(t, b.db.Pool); at != 0 {
		t.Fatalf("recorded at %d, want 0", at)
	}
	if err := b.js.DeleteStream(ctx, "ANNALS"); err != nil {
		t.Fatal(err)
	}
	s, err := r.EnsureStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rs, ok, err := relay.RewindsOf(s.CachedInfo().Config.Metadata); err != nil || !ok || len(rs) != 1 || rs[0].At != 0 {
		t.Fatalf("stamped %+v (%v, %v), want one rewind at 0", rs, ok, err)
	}
}

// TestRelayRewoundUnderAnotherOrigin: a database restored from a dump into
// another cluster has another system identifier, so its relay's stream
// names another origin; restored from before its newest events, it is
// also rewound. The stream's earlier messages are its events: the relay
// refuses the stream as before, and says (and records) that the log was
// rewound and where they agree. A stream of another log, none of whose
// messages is this log's event, is refused as another log's, nothing
// recorded. The refusal of the rewound log does not advise adopting the
// stream (it would not do), and its ERROR names the commands that publish
// the log into a stream made anew. Before, the refusal first advised
// adopting the stream, then said that adopting it would not do, and the
// ERROR named no command.
func TestRelayRewoundUnderAnotherOrigin(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	appendMany(t, b.store, 10)
	var logs annalstest.LogBuffer
	r, err := relay.New(b.db.Pool, b.nc, &relay.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.EnsureStream(ctx); err != nil {
		t.Fatal(err)
	}
	publish := func(stream string, es []eventstore.Event) {
		t.Helper()
		prefix := map[string]string{"ANNALS": "annals", "FOREIGN": "foreign"}[stream]
		for _, e := range es {
			m, err := relay.Message("relay", prefix+"."+relay.EscapeToken(e.Type)+"."+relay.EscapeToken(e.StreamID), e)
			if err != nil {
				t.Fatal(err)
			}
			m.Header.Set(relay.HeaderOrigin, "123456789/"+relay.EscapeToken(b.db.Name)+"/annals")
			if _, err := b.js.PublishMsg(ctx, m); err != nil {
				t.Fatal(err)
			}
		}
	}
	log := b.log()
	publish("ANNALS", log)
	annalstest.RewindLog(t, b.db.Pool, "annals", 4)
	appendMany(t, b.store, 3)
	err = r.CatchUp(ctx)
	if !errors.Is(err, relay.ErrStreamMismatch) || !strings.Contains(err.Error(), "published from the log at 123456789/") ||
		!strings.Contains(err.Error(), "this log is that one, rewound") || !strings.Contains(err.Error(), "last agree at position 4") {
		t.Fatalf("CatchUp on the stream of this log, rewound, under another origin: %v; want ErrStreamMismatch saying the log was rewound, agreeing up to 4", err)
	}
	if strings.Contains(err.Error(), "adopt the stream:") {
		t.Errorf("the refusal of a rewound log advises adopting the stream: %v", err)
	}
	if l := logs.String(); !strings.Contains(l, "level=ERROR") || !strings.Contains(l, "annals checkpoint set relay 0 --yes") || !strings.Contains(l, "nats stream rm ANNALS -f") {
		t.Errorf("the ERROR does not name the commands (annals checkpoint set relay 0 --yes, nats stream rm ANNALS -f):\n%s", l)
	}
	if _, _, at := recordedRewind(t, b.db.Pool); at != 4 {
		t.Fatalf("recorded at %d, want 4", at)
	}

	db2 := annalstest.NewDB(t, nil)
	store2, err := eventstore.New(db2.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	appendMany(t, store2, 2)
	r2, err := relay.New(db2.Pool, b.nc, &relay.Config{Stream: "FOREIGN", Prefix: "foreign"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.js.CreateStream(ctx, r2.StreamConfig()); err != nil {
		t.Fatal(err)
	}
	publish("FOREIGN", log)
	err = r2.CatchUp(ctx)
	if !errors.Is(err, relay.ErrStreamMismatch) || !strings.Contains(err.Error(), "published from the log at") || strings.Contains(err.Error(), "last agree") {
		t.Fatalf("CatchUp on another log's stream: %v; want ErrStreamMismatch as another log's, no rewind", err)
	}
	if _, _, at := recordedRewind(t, db2.Pool); at != -1 {
		t.Fatalf("a rewind recorded at %d for another log's stream", at)
	}
}

// TestRelayRewoundSparseStream: the binary search over a stream that holds
// only some positions (a relay of one event type: the odd positions) and
// no longer its first messages (removed by a limit) finds the last message
// that agrees: the log rewound to 22 agrees with the stream up to 21.
func TestRelayRewoundSparseStream(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	appendMany(t, b.store, 60) // account.opened at 1, 3, …, 59
	r, err := relay.New(b.db.Pool, b.nc, &relay.Config{Types: []string{"account.opened"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	s, err := b.js.Stream(ctx, "ANNALS")
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.MaxMsgs = 24 // 30 published: 1..11 removed
	if s, err = b.js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if info, err := s.Info(ctx); err != nil || info.State.FirstSeq != 7 {
		t.Fatalf("the stream after MaxMsgs: %+v, %v; want its first message at sequence 7", info, err)
	}
	annalstest.RewindLog(t, b.db.Pool, "annals", 22)
	appendMany(t, b.store, 50)
	if err := r.CatchUp(ctx); !errors.Is(err, relay.ErrStreamMismatch) || !strings.Contains(err.Error(), "last agree at position 21") {
		t.Fatalf("CatchUp on the rewound log: %v; want ErrStreamMismatch saying they agree up to 21", err)
	}
	if _, _, at := recordedRewind(t, b.db.Pool); at != 21 {
		t.Fatalf("recorded at %d, want 21", at)
	}
}

// TestRelayRecordsEveryRewind: the log rewound twice, under two streams
// (A found rewound at 10; B, made anew, found rewound at 20 after a second
// restore), on a role with a runner's rights: the relay keeps both rewinds
// (a consumer placed in A, offline through both, is judged by A's), and
// the stream made after the second is stamped with both, oldest first
// (the lowest for one stream: TestRewindsSince). Before, B's
// rewind replaced A's, and the stream made after carried B's alone.
func TestRelayRecordsEveryRewind(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	pool := runnerPool(t, b)
	created := func() time.Time {
		t.Helper()
		s, err := b.js.Stream(ctx, "ANNALS")
		if err != nil {
			t.Fatal(err)
		}
		return s.CachedInfo().Created
	}
	catchUp := func() error {
		t.Helper()
		r, err := relay.New(pool, b.nc, &relay.Config{RetryBackoff: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return r.CatchUp(ctx)
	}
	// rewind leaves the log restored at keep with n new events, and checks
	// the relay's refusal; the operator then deletes the stream and sets
	// the checkpoint to 0, and a relay makes it anew.
	rewind := func(keep int64, n int) {
		t.Helper()
		annalstest.RewindLog(t, b.db.Pool, "annals", keep)
		appendMany(t, b.store, n)
		if err := catchUp(); !errors.Is(err, relay.ErrStreamMismatch) || !strings.Contains(err.Error(), fmt.Sprintf("last agree at position %d", keep)) {
			t.Fatalf("CatchUp on the log rewound to %d: %v; want ErrStreamMismatch saying where they agree", keep, err)
		}
		if err := b.js.DeleteStream(ctx, "ANNALS"); err != nil {
			t.Fatal(err)
		}
		if _, err := b.db.Pool.Exec(ctx, `UPDATE annals.checkpoints SET position = 0 WHERE subscriber_id = 'relay'`); err != nil {
			t.Fatal(err)
		}
		if err := catchUp(); err != nil {
			t.Fatal(err)
		}
	}
	same := func(what string, got relay.Rewinds, want ...relay.Rewound) {
		t.Helper()
		ok := len(got) == len(want)
		for i := 0; ok && i < len(got); i++ {
			ok = got[i].Stream == want[i].Stream && got[i].Created.Equal(want[i].Created) && got[i].At == want[i].At
		}
		if !ok {
			t.Fatalf("%s: %+v, want %+v", what, got, want)
		}
	}

	appendMany(t, b.store, 15)
	if err := catchUp(); err != nil {
		t.Fatal(err)
	}
	a := relay.Rewound{Stream: "ANNALS", Created: created(), At: 10}
	rewind(10, 8)
	same("recorded after the first rewind", recordedRewinds(t, b.db.Pool), a)
	bw := relay.Rewound{Stream: "ANNALS", Created: created(), At: 20}
	appendMany(t, b.store, 7)
	if err := catchUp(); err != nil {
		t.Fatal(err)
	}
	rewind(20, 20)
	same("recorded after the second rewind", recordedRewinds(t, b.db.Pool), a, bw)
	s, err := b.js.Stream(ctx, "ANNALS")
	if err != nil {
		t.Fatal(err)
	}
	st, ok, err := relay.RewindsOf(s.CachedInfo().Config.Metadata)
	if err != nil || !ok {
		t.Fatalf("the stream made after the second rewind: stamp %v, %v (metadata %v)", ok, err, s.CachedInfo().Config.Metadata)
	}
	same("stamped into the stream made after the second rewind", st, a, bw)
}
