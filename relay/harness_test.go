package relay_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/natsserver"
	"github.com/annals-dev/annals/relay"
)

type bundle struct {
	t     *testing.T
	db    *annalstest.DB
	store *eventstore.Store
	ns    *natsserver.Server
	nc    *nats.Conn
	js    jetstream.JetStream
}

func setup(t *testing.T) *bundle {
	t.Helper()
	db := annalstest.NewDB(t, nil)
	store, err := eventstore.New(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	ns, err := natsserver.Start(t.TempDir(), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Stop)
	nc, err := nats.Connect(ns.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return &bundle{t: t, db: db, store: store, ns: ns, nc: nc, js: js}
}

// relayed reads every message of the stream, in stream order.
func (b *bundle) relayed(stream string) []jetstream.RawStreamMsg {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := b.js.Stream(ctx, stream)
	if err != nil {
		b.t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		b.t.Fatal(err)
	}
	var out []jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			b.t.Fatalf("message %d: %v", seq, err)
		}
		out = append(out, *m)
	}
	return out
}

func (b *bundle) log() []eventstore.Event {
	b.t.Helper()
	var out []eventstore.Event
	for e, err := range b.store.ReadAll(context.Background(), 0) {
		if err != nil {
			b.t.Fatal(err)
		}
		out = append(out, e)
	}
	return out
}

func (b *bundle) checkpoint(name string) int64 {
	b.t.Helper()
	var pos int64
	if err := b.db.Pool.QueryRow(context.Background(),
		`SELECT coalesce((SELECT position FROM annals.checkpoints WHERE subscriber_id = $1 AND partition = 0), 0)`, name).Scan(&pos); err != nil {
		b.t.Fatal(err)
	}
	return pos
}

// checkExactlyOnce fails unless the stream holds each event of want once,
// in position order (so every stream's events in version order).
func checkExactlyOnce(t *testing.T, msgs []jetstream.RawStreamMsg, want []eventstore.Event) {
	t.Helper()
	if len(msgs) != len(want) {
		t.Fatalf("the stream holds %d messages, want %d", len(msgs), len(want))
	}
	seen := map[string]bool{}
	versions := map[string]int64{}
	for i, m := range msgs {
		e, err := relay.Decode(m.Header, m.Data)
		if err != nil {
			t.Fatalf("message %d: %v", m.Sequence, err)
		}
		if seen[e.ID.String()] {
			t.Fatalf("event %s (position %d) is in the stream twice", e.ID, e.GlobalSequence)
		}
		seen[e.ID.String()] = true
		if m.Header.Get(jetstream.MsgIDHeader) != e.ID.String() {
			t.Fatalf("message %d: Nats-Msg-Id %q, event %s", m.Sequence, m.Header.Get(jetstream.MsgIDHeader), e.ID)
		}
		if w := want[i]; e.ID != w.ID || e.GlobalSequence != w.GlobalSequence {
			t.Fatalf("message %d is event %d (%s), want %d (%s): not position order", m.Sequence, e.GlobalSequence, e.ID, w.GlobalSequence, w.ID)
		} else if e.StreamID != w.StreamID || e.Type != w.Type {
			t.Fatalf("message %d decodes to stream %q, type %q; the event's are %q, %q", m.Sequence, e.StreamID, e.Type, w.StreamID, w.Type)
		}
		if e.StreamVersion != versions[e.StreamID]+1 {
			t.Fatalf("stream %q: version %d after %d", e.StreamID, e.StreamVersion, versions[e.StreamID])
		}
		versions[e.StreamID] = e.StreamVersion
	}
}

func appendMany(t *testing.T, store *eventstore.Store, n int) {
	t.Helper()
	for i := range n {
		md := eventstore.Metadata{CorrelationID: fmt.Sprintf("c-%d", i), CausationID: fmt.Sprintf("k-%d", i),
			Extra: map[string]any{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}
		_, err := store.Append(context.Background(), fmt.Sprintf("acct/%d.x", i%4), eventstore.Any,
			eventstore.EventData{Type: []string{"account.opened", "account.credited"}[i%2], Data: map[string]int{"i": i}, Metadata: md})
		if err != nil {
			t.Fatal(err)
		}
	}
}
