package relay_test

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/checkpoint"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/relay"
)

// TestRelayPublishesTheLog: each event becomes one message on the escaped
// subject, with the relay's headers; the headers decode back to the event.
// A second run publishes nothing again, even from a checkpoint reset to
// zero (the relay skips what the stream holds; JetStream would drop it as a
// duplicate besides).
func TestRelayPublishesTheLog(t *testing.T) {
	t.Parallel()
	b := setup(t)
	appendMany(t, b.store, 30)
	r, err := relay.New(b.db.Pool, b.nc, &relay.Config{BatchSize: 7})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := r.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	log := b.log()
	msgs := b.relayed("ANNALS")
	checkExactlyOnce(t, msgs, log)
	m := msgs[3]
	if m.Subject != "annals.account%2Ecredited.acct%2F3%2Ex" {
		t.Fatalf("subject %q", m.Subject)
	}
	for k, want := range map[string]string{
		relay.HeaderCorrelationID: "c-3", relay.HeaderCausationID: "k-3", relay.HeaderType: "account.credited",
		relay.HeaderStreamID: "acct/3.x", relay.HeaderStreamVersion: "1", relay.HeaderPosition: "4", relay.HeaderRelay: "relay",
		relay.HeaderTraceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
	} {
		if got := m.Header.Get(k); got != want {
			t.Errorf("header %s = %q, want %q", k, got, want)
		}
	}
	e, err := relay.Decode(m.Header, m.Data)
	if err != nil {
		t.Fatal(err)
	}
	w := log[3]
	if string(e.Data) != string(w.Data) || !e.RecordedAt.Equal(w.RecordedAt) || e.Metadata.CorrelationID != "c-3" || e.Metadata.Extra["traceparent"] == nil {
		t.Fatalf("decoded %+v, want %+v", e, w)
	}
	if cp := b.checkpoint("relay"); cp != 30 {
		t.Fatalf("checkpoint %d, want 30", cp)
	}

	// Again, and from a checkpoint reset to 0: nothing new in the stream.
	cps, err := checkpoint.New("")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cps.Set(ctx, b.db.Pool, "relay", 0, 0); err != nil {
		t.Fatal(err)
	}
	appendMany(t, b.store, 5)
	if err := r.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	checkExactlyOnce(t, b.relayed("ANNALS"), b.log())
}

// TestRelayKeepsWhiteSpaceAtTheEnds: NATS drops spaces and tabs at either
// end of a header value, so a stream ID or event type that has them travels
// also as a JSON string, and decodes exactly; other values get no extra
// header.
func TestRelayKeepsWhiteSpaceAtTheEnds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, a := range [][2]string{{" acct", "account.opened"}, {"acct ", " account.opened"}, {"acct", "account.opened "}, {"a c", "t\\u00e9 \"q\""}} {
		if _, err := b.store.Append(t.Context(), a[0], eventstore.Any, eventstore.EventData{Type: a[1], Data: map[string]int{}}); err != nil {
			t.Fatal(err)
		}
	}
	r, err := relay.New(b.db.Pool, b.nc, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.CatchUp(t.Context()); err != nil {
		t.Fatal(err)
	}
	msgs := b.relayed("ANNALS")
	checkExactlyOnce(t, msgs, b.log())
	for i, m := range msgs {
		stream, typ := m.Header.Get(relay.HeaderStreamIDJSON) != "", m.Header.Get(relay.HeaderTypeJSON) != ""
		if want := [][2]bool{{true, false}, {true, true}, {false, true}, {false, false}}[i]; stream != want[0] || typ != want[1] {
			t.Errorf("message %d: JSON headers of stream and type %v, %v; want %v", i, stream, typ, want)
		}
	}
}

// TestRelayFilters: only events whose type matches the globs are relayed;
// the checkpoint still moves past the others.
func TestRelayFilters(t *testing.T) {
	t.Parallel()
	b := setup(t)
	appendMany(t, b.store, 20)
	r, err := relay.New(b.db.Pool, b.nc, &relay.Config{Name: "opened", Stream: "OPENED", Prefix: "o", Types: []string{"*.opened"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.CatchUp(t.Context()); err != nil {
		t.Fatal(err)
	}
	var want []eventstore.Event
	for _, e := range b.log() {
		if e.Type == "account.opened" {
			want = append(want, e)
		}
	}
	checkExactlyOnce(t, b.relayed("OPENED"), want)
	if cp := b.checkpoint("opened"); cp != 20 {
		t.Fatalf("checkpoint %d, want 20", cp)
	}
}

// CatchUp fails when JetStream refuses the last publishes (here a stream
// that holds at most 5 messages and discards new ones): the relay's
// checkpoint stops short of the head, and `annals relay nats --once` must
// not report success. It reported nil, as the refusal of the final batch
// surfaced only in the leadership's end, whose error the engine drops.
func TestCatchUpFailsWhenJetStreamRefuses(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	r, err := relay.New(b.db.Pool, b.nc, &relay.Config{RetryBackoff: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	sc := r.StreamConfig()
	sc.MaxMsgs, sc.Discard = 5, jetstream.DiscardNew
	if _, err := b.js.CreateStream(ctx, sc); err != nil {
		t.Fatal(err)
	}
	appendMany(t, b.store, 10)
	err = r.CatchUp(ctx)
	if err == nil || !strings.Contains(err.Error(), "did not acknowledge") {
		t.Fatalf("CatchUp into a full stream = %v, want a failure", err)
	}
	if cp, head := b.checkpoint("relay"), int64(len(b.log())); cp >= head {
		t.Fatalf("checkpoint %d, head %d: the refused events were passed over", cp, head)
	}
}

// An event that NATS refuses for its size (max_payload, 1 MiB by default,
// counts the relay's headers too, so an event within the store's own 1 MiB
// limit can exceed it) blocks the relay: every later event waits behind
// it, and retrying cannot help. The relay's log says so, with the limit and
// what the operator can do, instead of only "maximum payload exceeded".
func TestRelayNamesAnEventOverMaxPayload(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var logs annalstest.LogBuffer
	r, err := relay.New(b.db.Pool, b.nc, &relay.Config{Name: "r 3", Logger: slog.New(slog.NewTextHandler(&logs, nil)), RetryBackoff: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	res, err := b.store.Append(ctx, "big", eventstore.NoStream,
		eventstore.EventData{Type: "t.big", Data: map[string]string{"s": strings.Repeat("x", 1_048_300)}})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithTimeout(ctx, 30*time.Second)
	defer stop()
	// It gives up (retrying cannot help) well before runCtx ends.
	if err := r.CatchUp(runCtx); err == nil || !strings.Contains(err.Error(), "gave up after") || !strings.Contains(err.Error(), "did not move the checkpoint") || runCtx.Err() != nil {
		t.Fatalf("CatchUp with an event over max_payload: %v (deadline passed: %v)", err, runCtx.Err())
	}
	// The command, ready to paste: the name quoted for the shell.
	want := fmt.Sprintf("annals checkpoint set 'r 3' %d --yes", res.Position())
	if got := logs.String(); !strings.Contains(got, "max_payload") || !strings.Contains(got, want) {
		t.Fatalf("the relay's log does not name the limit and %q:\n%s", want, got)
	}
	// Each line is one record, with the error on it (not its chain and
	// stack traces), and a failed publish is not said to be a fencing.
	for _, l := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		if !strings.HasPrefix(l, "time=") {
			t.Fatalf("a log record spans lines (an error printed with its stack?):\n%s", logs.String())
		}
	}
	if got := logs.String(); strings.Contains(got, "fenced") || strings.Contains(got, ".go:") {
		t.Fatalf("a failed publish is logged as a fencing, or an error with its stack trace:\n%s", got)
	}
}

// A stream whose newest message another relay published is refused when
// the relay starts (it stood by and failed at every leadership, for ever,
// and --once never ended); a stream deleted under a running relay is made
// again, and the relay goes on publishing into it.
func TestRelayStreamOwnershipAndLoss(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	appendMany(t, b.store, 5)
	var logs annalstest.LogBuffer
	r, err := relay.New(b.db.Pool, b.nc, &relay.Config{RetryBackoff: 20 * time.Millisecond, AckTimeout: 2 * time.Second,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if t.Failed() {
			t.Logf("the relay's log:\n%s", logs.String())
		}
	}()
	if err := r.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	other, err := relay.New(b.db.Pool, b.nc, &relay.Config{Name: "other", RetryBackoff: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if err := other.CatchUp(ctx); !errors.Is(err, relay.ErrStreamMismatch) || !strings.Contains(err.Error(), `published by "relay"`) {
		t.Fatalf("a second relay on the stream: %v, want ErrStreamMismatch", err)
	}
	if d := time.Since(t0); d > 10*time.Second {
		t.Fatalf("refused after %v", d)
	}

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	// Deleted while the relay leads (not while it starts: Run makes the
	// stream first).
	annalstest.WaitFor(t, 30*time.Second, func() bool { return strings.Contains(logs.String(), "annals: leading") })
	if err := b.js.DeleteStream(ctx, "ANNALS"); err != nil {
		t.Fatal(err)
	}
	appendMany(t, b.store, 3)
	head := int64(len(b.log()))
	// The publish into the deleted stream fails (at the latest after
	// AckTimeout), the relay claims again and makes the stream again.
	annalstest.WaitFor(t, 90*time.Second, func() bool {
		s, err := b.js.Stream(ctx, "ANNALS")
		if err != nil {
			return false
		}
		info, err := s.Info(ctx)
		if err != nil || info.State.Msgs == 0 {
			return false
		}
		m, err := s.GetMsg(ctx, info.State.LastSeq)
		return err == nil && m.Header.Get(relay.HeaderPosition) == fmt.Sprint(head)
	})
	// And the log says what happened, and what the new stream lacks.
	if l := logs.String(); !strings.Contains(l, "the relay created its JetStream stream ANNALS") || !strings.Contains(l, "annals checkpoint set relay 0 --yes") {
		t.Fatalf("the relay's log does not tell of the lost stream:\n%s", l)
	}
}

// An existing stream is taken when one of its subjects covers the relay's
// by NATS wildcard rules ("annals.*.*.*" for "annals.x.*.*", "annals.*.>",
// which were refused), and
// refused when none does ("wide.>" for "orders.*.*", which was taken, and
// then every publish failed with "no response from stream").
func TestEnsureStreamChecksSubjectsByWildcards(t *testing.T) {
	t.Parallel()
	b := setup(t)
	appendMany(t, b.store, 3)
	for i, c := range []struct {
		streamSubject, prefix, template string
		ok                              bool
	}{
		{"annals.*.*.*", "", "{prefix}.x.{type}.{stream}", true},
		{"annals.*.>", "", "", true},
		{"wide.>", "wide", "orders.{type}.{stream}", false},
		{"annals.*", "", "", false},
	} {
		// A stream of its own per case: a stream made again under the name
		// of one just deleted can fail in the server ("error creating store
		// for stream") while its files are still being removed.
		stream := fmt.Sprintf("S%d", i)
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		if _, err := b.js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{c.streamSubject}, Duplicates: time.Hour}); err != nil {
			t.Fatal(err)
		}
		r, err := relay.New(b.db.Pool, b.nc, &relay.Config{Stream: stream, Prefix: c.prefix, Subject: c.template, Name: "r" + fmt.Sprint(len(c.template), c.ok)})
		if err != nil {
			t.Fatal(err)
		}
		_, err = r.EnsureStream(ctx)
		switch {
		case c.ok && err != nil:
			t.Errorf("stream on %q, relay on %q: %v", c.streamSubject, r.SubjectFilter(), err)
		case !c.ok && !errors.Is(err, relay.ErrStreamMismatch):
			t.Errorf("stream on %q, relay on %q: %v, want ErrStreamMismatch", c.streamSubject, r.SubjectFilter(), err)
		case c.ok:
			if err := r.CatchUp(ctx); err != nil {
				t.Errorf("stream on %q: %v", c.streamSubject, err)
			} else if n := len(b.relayed(stream)); n != 3 {
				t.Errorf("stream on %q holds %d messages, want 3", c.streamSubject, n)
			}
		}
		if err := b.js.DeleteStream(ctx, stream); err != nil {
			t.Fatal(err)
		}
		cancel()
	}
}

// A relay whose name starts or ends with a space (NATS trims header values)
// recognises its own messages: it was locked out of its stream, its second
// run refused as "published by "padded", not relay " padded "".
func TestRelayNameWithSpacesAtTheEnds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	appendMany(t, b.store, 3)
	r, err := relay.New(b.db.Pool, b.nc, &relay.Config{Name: " padded\t"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	if err := r.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	appendMany(t, b.store, 2)
	if err := r.CatchUp(ctx); err != nil {
		t.Fatalf("the relay's second run: %v", err)
	}
	checkExactlyOnce(t, b.relayed("ANNALS"), b.log())
	// And another relay, named as NATS would show this one's name, is
	// still refused.
	other, err := relay.New(b.db.Pool, b.nc, &relay.Config{Name: "padded"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.EnsureStream(ctx); !errors.Is(err, relay.ErrStreamMismatch) {
		t.Fatalf("relay %q on the stream of %q: %v, want ErrStreamMismatch", "padded", " padded\t", err)
	}
}

// A stream lost while the relay was down is made again when the relay
// starts (by EnsureStream, which did so silently: the warning was only at a
// leadership's start), and the log says so when the checkpoint is past 0,
// with a way to publish the earlier events that works: stop the relay,
// delete the stream, set the checkpoint to 0. (Setting the checkpoint back
// alone, the hint it gave, did nothing: the relay skips what the new
// stream's newest message shows published.)
func TestRelayStreamLostWhileDown(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	appendMany(t, b.store, 5)
	var logs annalstest.LogBuffer
	cfg := &relay.Config{Name: "it's", Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	r, err := relay.New(b.db.Pool, b.nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(logs.String(), "created its JetStream stream") {
		t.Fatalf("a warning for a relay's first stream, with its checkpoint at 0:\n%s", logs.String())
	}
	// Lost while the relay is down; events appended meanwhile.
	if err := b.js.DeleteStream(ctx, "ANNALS"); err != nil {
		t.Fatal(err)
	}
	appendMany(t, b.store, 3)
	if err := r.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(b.relayed("ANNALS")); n != 3 {
		t.Fatalf("the new stream holds %d messages, want the 3 after the checkpoint", n)
	}
	hint := `annals checkpoint set 'it'\''s' 0 --yes`
	quoted := strconv.Quote(hint) // as the text handler writes it in msg="…"
	if l := logs.String(); !strings.Contains(l, "created its JetStream stream ANNALS") || !strings.Contains(l, "checkpoint is at 5") ||
		!strings.Contains(l, "delete the stream") || !strings.Contains(l, quoted[1:len(quoted)-1]) {
		t.Fatalf("the relay's log does not tell of the lost stream, or how to publish the rest (%s):\n%s", hint, l)
	}
	// The hint: the relay stopped (CatchUp returned), delete the stream,
	// set the checkpoint to 0, start again.
	if err := b.js.DeleteStream(ctx, "ANNALS"); err != nil {
		t.Fatal(err)
	}
	cps, err := checkpoint.New("")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cps.Set(ctx, b.db.Pool, "it's", 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := r.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	checkExactlyOnce(t, b.relayed("ANNALS"), b.log())
}

// Events the stream holds already, which the relay skips, are acknowledged
// for the checkpoint: the checkpoint set back to 0 under a stream holding 3
// events, then a publish refused right after them (a full stream): the
// checkpoint moves to 3, and CatchUp's error says where it stands. The
// checkpoint stayed at 0 for ever, the skipped events never counted as
// acknowledged, and the error said "published through position 0".
func TestSkippedEventsMoveTheCheckpoint(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	r, err := relay.New(b.db.Pool, b.nc, &relay.Config{RetryBackoff: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	sc := r.StreamConfig()
	sc.MaxMsgs, sc.Discard = 3, jetstream.DiscardNew
	if _, err := b.js.CreateStream(ctx, sc); err != nil {
		t.Fatal(err)
	}
	appendMany(t, b.store, 3)
	if err := r.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	cps, err := checkpoint.New("")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cps.Set(ctx, b.db.Pool, "relay", 0, 0); err != nil {
		t.Fatal(err)
	}
	appendMany(t, b.store, 2)
	err = r.CatchUp(ctx)
	if err == nil || !strings.Contains(err.Error(), "checkpoint reached position 3, short of the head 5") {
		t.Fatalf("CatchUp into a full stream = %v, want it to say the checkpoint reached 3", err)
	}
	if cp := b.checkpoint("relay"); cp != 3 {
		t.Fatalf("checkpoint %d, want 3: the events the stream holds", cp)
	}
	checkExactlyOnce(t, b.relayed("ANNALS"), b.log()[:3])
}

// A duplicate window longer than MaxAge is refused by New, saying which
// fields, rather than by JetStream when the stream is made.
func TestNewRefusesAWindowLongerThanMaxAge(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := relay.New(b.db.Pool, b.nc, &relay.Config{MaxAge: time.Minute}); err == nil || !strings.Contains(err.Error(), "MaxAge") {
		t.Fatalf("New with MaxAge 1m and the default Duplicates: %v, want an error naming MaxAge", err)
	}
	if _, err := relay.New(b.db.Pool, b.nc, &relay.Config{MaxAge: time.Minute, Duplicates: time.Minute}); err != nil {
		t.Fatal(err)
	}
}

// The checkpoint commits only positions the relay's processor has returned
// to the engine, also for the events it skips: the checkpoint set back to 0
// under a stream holding 5 events, read in batches of 2, commits 2 first
// (the first batch), not 5. It committed the stream's newest position at
// the first batch, past the cursor, and the engine logged "a commit
// reported as failed had committed" and jumped.
func TestSkippedEventsCommitOnlyWhatWasProcessed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	var logs annalstest.LogBuffer
	var mu sync.Mutex
	var commits []int64
	r, err := relay.New(b.db.Pool, b.nc, &relay.Config{
		BatchSize: 2, CheckpointInterval: time.Nanosecond, RetryBackoff: 10 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		OnCommitted: func(pos int64) {
			mu.Lock()
			defer mu.Unlock()
			commits = append(commits, pos)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	appendMany(t, b.store, 5)
	if err := r.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	cps, err := checkpoint.New("")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cps.Set(ctx, b.db.Pool, "relay", 0, 0); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	commits = nil
	mu.Unlock()
	if err := r.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(logs.String(), "had committed") {
		t.Fatalf("the engine found a commit past its cursor:\n%s", logs.String())
	}
	mu.Lock()
	defer mu.Unlock()
	if len(commits) == 0 || commits[0] != 2 || commits[len(commits)-1] != 5 {
		t.Fatalf("commits %v, want 2 first (the first batch's end) and 5 last", commits)
	}
	checkExactlyOnce(t, b.relayed("ANNALS"), b.log())
}
