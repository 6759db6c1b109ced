package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/annals-dev/annals/annalstest"
)

// startTail runs `annals tail ARGS` in the background until the test ends.
func startTail(t *testing.T, url string, args ...string) (*annalstest.LogBuffer, func() int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out, errOut := &annalstest.LogBuffer{}, &annalstest.LogBuffer{}
	done := make(chan int, 1)
	getenv := func(k string) string {
		if k == "DATABASE_URL" {
			return url
		}
		return ""
	}
	go func() {
		done <- run(ctx, append([]string{"tail"}, args...), strings.NewReader(""), out, errOut, getenv)
	}()
	stopped := false
	var code int
	stop := func() int {
		if !stopped {
			cancel()
			code = <-done
			stopped = true
		}
		return code
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			t.Logf("tail stderr: %s", errOut.String())
		}
	})
	return out, stop
}

func TestTail(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	appendEv := func(stream, typ string) {
		t.Helper()
		if r := annals(t, db.URL, "append", stream, typ, `{"n":1}`); r.code != 0 {
			t.Fatalf("append: %+v", r)
		}
	}
	appendEv("order-1", "order.placed")
	appendEv("order-1", "order.shipped")
	appendEv("pay-1", "payment.received")

	t.Run("ToHeadAndExit", func(t *testing.T) {
		r := annals(t, db.URL, "tail", "--output", "jsonl", "--from", "2")
		if r.code != 0 || strings.Count(r.stdout, "\n") != 2 || !strings.Contains(r.stdout, `"global_sequence":2`) {
			t.Fatalf("tail --from 2: %+v", r)
		}
		r = annals(t, db.URL, "tail", "--types", "order.*")
		if r.code != 0 || strings.Count(r.stdout, "\n") != 3 || strings.Contains(r.stdout, "payment") {
			t.Fatalf("tail --types order.*: %+v", r)
		}
	})

	t.Run("FollowSeesNewEventsAtOnce", func(t *testing.T) {
		out, stop := startTail(t, db.URL, "--follow", "--output", "jsonl", "--types", "*.shipped")
		annalstest.WaitFor(t, 10*time.Second, func() bool { return strings.Count(out.String(), "\n") == 1 })
		appendEv("order-2", "order.shipped")
		appendEv("order-2", "order.cancelled")
		annalstest.WaitFor(t, 10*time.Second, func() bool { return strings.Count(out.String(), "\n") == 2 })
		if code := stop(); code != 0 {
			t.Fatalf("tail --follow exited %d", code)
		}
		if strings.Contains(out.String(), "cancelled") {
			t.Fatalf("filter leaked: %s", out.String())
		}
	})

	t.Run("SubscriberSharesOnePosition", func(t *testing.T) {
		// A named tail is an observer: the second run resumes after the first.
		r := annals(t, db.URL, "tail", "--subscriber", "audit", "--output", "jsonl")
		if r.code != 0 || strings.Count(r.stdout, "\n") < 3 {
			t.Fatalf("first named tail: %+v", r)
		}
		appendEv("order-3", "order.placed")
		r = annals(t, db.URL, "tail", "--subscriber", "audit", "--output", "jsonl")
		if r.code != 0 || strings.Count(r.stdout, "\n") != 1 || !strings.Contains(r.stdout, "order-3") {
			t.Fatalf("second named tail should print only the new event: %+v", r)
		}
		// Two followers with one name: one leads, the other stands by.
		a, stopA := startTail(t, db.URL, "--follow", "--subscriber", "shared", "--output", "jsonl")
		annalstest.WaitFor(t, 10*time.Second, func() bool { return strings.Count(a.String(), "\n") >= 6 })
		b, stopB := startTail(t, db.URL, "--follow", "--subscriber", "shared", "--output", "jsonl")
		appendEv("order-4", "order.placed")
		annalstest.WaitFor(t, 10*time.Second, func() bool { return strings.Contains(a.String()+b.String(), "order-4") })
		stopA()
		stopB()
		if n := strings.Count(a.String()+b.String(), `"order-4"`); n != 1 {
			t.Fatalf("order-4 printed %d times by two tails sharing a subscriber", n)
		}
	})

	// A subscriber runs only with the partition count it has checkpoints
	// for (here from before layouts were recorded, past position 0):
	// another would skip or repeat events. Refused, nothing changed.
	t.Run("PartitionCountIsKept", func(t *testing.T) {
		for p := range 4 {
			if r := annals(t, db.URL, "checkpoint", "set", "audit-log", "1", "--create", "--yes", "--partition", fmt.Sprint(p)); r.code != 0 {
				t.Fatalf("checkpoint set: %+v", r)
			}
		}
		checkpoints := func(sub string) string {
			var s string
			if err := db.Pool.QueryRow(t.Context(), `SELECT string_agg(format('%s:%s:%s', partition, position, epoch), ',' ORDER BY partition)
				FROM annals.checkpoints WHERE subscriber_id = $1`, sub).Scan(&s); err != nil {
				t.Fatal(err)
			}
			return s
		}
		before := checkpoints("audit-log")
		for _, args := range [][]string{
			{"tail", "--subscriber", "audit-log", "--partitions", "2"},
			{"tail", "--subscriber", "audit-log"},
			{"tail", "--subscriber", "audit-log", "--partitions", "3", "--output", "jsonl"},
		} {
			r := annals(t, db.URL, args...)
			if r.code != ExitUsage || r.stdout != "" || !strings.Contains(r.stderr, "checkpoints for partitions 0-3, so it ran with 4 partitions") {
				t.Errorf("annals %q: %+v", args, r)
			}
		}
		if after := checkpoints("audit-log"); after != before {
			t.Fatalf("refused tails changed the checkpoints: %s, then %s", before, after)
		}
		if r := annals(t, db.URL, "tail", "--subscriber", "audit-log", "--partitions", "4", "--output", "jsonl"); r.code != 0 || strings.Count(r.stdout, "\n") < 3 {
			t.Errorf("tail with the subscriber's own partition count: %+v", r)
		}
		// From its first run on, the subscriber's layout is recorded: the
		// key counts too.
		if r := annals(t, db.URL, "tail", "--subscriber", "audit-log", "--partitions", "4", "--partition-by", "category"); r.code != ExitUsage ||
			!strings.Contains(r.stderr, "was run with 4 partitions by stream; asked for 4 partitions by category") {
			t.Errorf("tail --subscriber audit-log --partition-by category: %+v", r)
		}
		if after := checkpoints("audit-log"); strings.Count(after, ",") != 3 {
			t.Fatalf("checkpoints after the refused tail: %s", after)
		}
	})

	t.Run("BadInput", func(t *testing.T) {
		for _, args := range [][]string{
			{"tail", "--output", "xml"},
			{"tail", "--from", "-2"},
			{"tail", "--types", "ord*"},
			{"tail", "--types", "a..b"},
			{"tail", "--subscriber", "x", "--from", "3"},
			{"tail", "--subscriber", ""},
			{"tail", "--partitions", "4"},
			{"tail", "--subscriber", "x", "--partitions", "0"},
			{"tail", "--subscriber", "x", "--partitions", "2", "--partition-by", "tenant"},
			{"tail", "extra"},
		} {
			if r := annals(t, db.URL, args...); r.code != 2 {
				t.Errorf("annals %s: code %d, stderr %q", strings.Join(args, " "), r.code, r.stderr)
			}
		}
	})
}

// Two followers of one subscriber with --partitions share its partitions
// (2 and 2 of 4), print every event once between them, and each prints
// every stream in order; when one stops, the other prints everything.
func TestTailPartitioned(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	appendN := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			if r := annals(t, db.URL, "append", fmt.Sprintf("order-%d", i%20), "order.placed", fmt.Sprintf(`{"n":%d}`, i)); r.code != 0 {
				t.Fatalf("append: %+v", r)
			}
		}
	}
	owners := func() map[string]int {
		rows, err := db.Pool.Query(t.Context(), `SELECT coalesce(owner, '') FROM annals.checkpoints c
			WHERE subscriber_id = 'split' AND EXISTS (SELECT 1 FROM annals.instances i WHERE i.instance_id = c.owner)`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		m := map[string]int{}
		for rows.Next() {
			var o string
			if err := rows.Scan(&o); err != nil {
				t.Fatal(err)
			}
			m[o]++
		}
		return m
	}
	args := []string{"--follow", "--subscriber", "split", "--partitions", "4", "--output", "jsonl"}
	a, stopA := startTail(t, db.URL, args...)
	annalstest.WaitFor(t, 10*time.Second, func() bool { m := owners(); return len(m) == 1 && sum(m) == 4 })
	b, stopB := startTail(t, db.URL, args...)
	annalstest.WaitFor(t, 10*time.Second, func() bool {
		m := owners()
		for _, n := range m {
			if n != 2 {
				return false
			}
		}
		return len(m) == 2
	})
	appendN(0, 60)
	printed := func() int { return strings.Count(a.String()+b.String(), "\n") }
	annalstest.WaitFor(t, 20*time.Second, func() bool { return printed() >= 60 })
	if a.String() == "" || b.String() == "" {
		t.Fatalf("one tail printed nothing:\na: %s\nb: %s", a.String(), b.String())
	}
	// annals status shows the balance: each partition with its leader,
	// epoch, checkpoint and lag, and both instances with their heartbeat.
	annalstest.WaitFor(t, 10*time.Second, func() bool {
		r := annals(t, db.URL, "status", "--output", "json")
		var st StatusJSON
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &st) != nil {
			t.Fatalf("status: %+v", r)
		}
		leaders := map[string]int{}
		for _, p := range st.Subscribers {
			if p.Subscriber == "split" && p.Leader != nil && p.LeaderEpoch != nil && *p.LeaderEpoch == p.Epoch && p.LagEventsExact {
				leaders[*p.Leader]++
			}
		}
		live := 0
		for _, in := range st.Instances {
			if in.Live && !in.LastHeartbeat.IsZero() && leaders[in.InstanceID] == 2 {
				live++
			}
		}
		return len(leaders) == 2 && live == 2
	})
	if code := stopA(); code != 0 {
		t.Fatalf("tail a exited %d", code)
	}
	appendN(60, 100)
	annalstest.WaitFor(t, 20*time.Second, func() bool { return printed() >= 100 })
	if code := stopB(); code != 0 {
		t.Fatalf("tail b exited %d", code)
	}
	seen := map[int64]int{}
	for _, out := range []string{a.String(), b.String()} {
		last := map[string]int64{}
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			if line == "" {
				continue
			}
			var ev struct {
				GlobalSequence int64  `json:"global_sequence"`
				StreamID       string `json:"stream_id"`
				StreamVersion  int64  `json:"stream_version"`
			}
			if err := json.Unmarshal([]byte(line), &ev); err != nil {
				t.Fatalf("%q: %v", line, err)
			}
			seen[ev.GlobalSequence]++
			if ev.StreamVersion <= last[ev.StreamID] {
				t.Fatalf("%s v%d printed after v%d by one tail", ev.StreamID, ev.StreamVersion, last[ev.StreamID])
			}
			last[ev.StreamID] = ev.StreamVersion
		}
	}
	if len(seen) != 100 {
		t.Fatalf("%d distinct events printed, want 100", len(seen))
	}
	for pos, n := range seen {
		if n != 1 {
			// A graceful handover flushes the checkpoint: nothing is printed twice.
			t.Fatalf("event %d printed %d times", pos, n)
		}
	}
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
