package cli

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/internal/natsserver"
)

// TestRelaySaysItStarted: annals relay nats says, when it starts, which
// NATS server, stream and subjects it relays to, and that it stands by
// while another process of its name leads: a second relay of an
// operator's trial said nothing at all while it stood by.
func TestRelaySaysItStarted(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ns, err := natsserver.Start(t.TempDir(), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Stop)
	getenv := func(k string) string {
		if k == "DATABASE_URL" {
			return db.URL
		}
		return ""
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var logs [2]annalstest.LogBuffer
	done := make(chan int, 2)
	start := func(i int) {
		go func() {
			done <- run(ctx, []string{"relay", "nats", "--nats-url", "nats://user:s3cret@" + strings.TrimPrefix(ns.ClientURL(), "nats://")},
				nil, &discard{}, &logs[i], getenv)
		}()
	}
	start(0)
	annalstest.WaitFor(t, 20*time.Second, func() bool { return strings.Contains(logs[0].String(), "leadership acquired") })
	start(1)
	const started = "annals: relay started: it publishes while it leads; it stands by while another relay process of this name leads"
	annalstest.WaitFor(t, 20*time.Second, func() bool { return strings.Contains(logs[1].String(), started) })
	out := logs[1].String()
	for _, want := range []string{"level=INFO", "relay=relay", "nats=nats://user:xxxxx@127.0.0.1:", "stream=ANNALS", "subjects=annals.*.*", "wal=false"} {
		if !strings.Contains(out, want) {
			t.Errorf("the start line lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "s3cret") || strings.Contains(out, "leadership acquired") {
		t.Errorf("the standby printed the password, or leads beside the first relay:\n%s", out)
	}
	// Stopped once it has registered and stands by (stopped sooner, it
	// exits 1: its registration cancelled).
	annalstest.WaitFor(t, 20*time.Second, func() bool {
		var st StatusJSON
		r := annals(t, db.URL, "status", "--output", "json")
		return r.code == 0 && json.Unmarshal([]byte(r.stdout), &st) == nil && len(st.Instances) == 2
	})
	cancel()
	for range 2 {
		if code := <-done; code != 0 {
			t.Fatalf("a relay exited %d:\n%s\n%s", code, logs[0].String(), logs[1].String())
		}
	}
}
