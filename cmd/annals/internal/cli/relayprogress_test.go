package cli

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/internal/natsserver"
)

// TestRelayStatus: annals relay nats --status says how far the relay has
// published (checkpoint, head), what the stream holds (the log position of
// its newest message) and how far each durable consumer has acknowledged,
// in text and as JSON; without a stream it says so. An operator's trial
// had no way to see a natsconsumer's progress short of the nats CLI.
func TestRelayStatus(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ns, err := natsserver.Start(t.TempDir(), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Stop)
	url := ns.ClientURL()

	// No stream yet.
	r := annals(t, db.URL, "relay", "nats", "--nats-url", url, "--status", "--output", "json")
	if r.code != 0 || !strings.Contains(r.stdout, `"stream": null`) || !strings.Contains(r.stdout, `"consumers": []`) {
		t.Fatalf("relay nats --status without a stream: %+v", r)
	}
	for range 3 {
		if r := annals(t, db.URL, "append", "o-1", "order.placed", `{}`); r.code != 0 {
			t.Fatalf("append: %+v", r)
		}
	}
	if r := annals(t, db.URL, "relay", "nats", "--nats-url", url, "--once"); r.code != 0 {
		t.Fatalf("relay nats --once: %+v", r)
	}
	if r := annals(t, db.URL, "append", "o-1", "order.placed", `{}`); r.code != 0 {
		t.Fatalf("append: %+v", r)
	}
	// A durable consumer that acknowledged the first two messages.
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	c, err := js.CreateOrUpdateConsumer(t.Context(), "ANNALS", jetstream.ConsumerConfig{Durable: "svc-b", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := c.Fetch(2, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for m := range batch.Messages() {
		if err := m.DoubleAck(t.Context()); err != nil {
			t.Fatal(err)
		}
		n++
	}
	if n != 2 {
		t.Fatalf("fetched %d messages, want 2", n)
	}

	r = annals(t, db.URL, "relay", "nats", "--nats-url", url, "--status", "--output", "json")
	if r.code != 0 {
		t.Fatalf("relay nats --status: %+v", r)
	}
	var got relayProgress
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatalf("%v: %s", err, r.stdout)
	}
	s := got.Stream
	if got.Relay != "relay" || got.Checkpoint != 3 || got.Head != 4 || got.LagEvents != 1 || s == nil ||
		s.Name != "ANNALS" || s.Messages != 3 || s.LastSeq != 3 || s.LastPosition == nil || *s.LastPosition != 3 || len(got.Consumers) != 1 {
		t.Fatalf("relay nats --status: %s", r.stdout)
	}
	if cp := got.Consumers[0]; cp.Name != "svc-b" || cp.AckFloorSeq != 2 || cp.BehindMessages != 1 || cp.DeliveredSeq != 2 ||
		cp.AckPending != 0 || cp.LastDelivery == nil {
		t.Fatalf("the consumer: %+v", cp)
	}

	r = annals(t, db.URL, "relay", "nats", "--nats-url", url, "--status")
	if r.code != 0 {
		t.Fatalf("relay nats --status: %+v", r)
	}
	for _, want := range []string{"relay relay: checkpoint 3, head of the log 4 (1 behind)",
		"stream ANNALS: 3 messages (sequences 1 to 3), newest at log position 3",
		"CONSUMER  ACKED THROUGH  BEHIND", "svc-b     2              1 "} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("the text lacks %q:\n%s", want, r.stdout)
		}
	}
	if r := annals(t, db.URL, "relay", "nats", "--nats-url", url, "--status", "--once"); r.code != 2 {
		t.Fatalf("--status --once: %+v; want exit 2", r)
	}
}
