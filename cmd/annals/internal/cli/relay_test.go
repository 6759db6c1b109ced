package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/internal/lockkey"
	"github.com/annals-dev/annals/internal/natsserver"
	"github.com/annals-dev/annals/walsource"
)

// TestRelayNATS: annals relay nats --once publishes the log to JetStream
// (its stream created on the way) and says how far; bad flags exit 2; and
// annals status shows the running relay as a subscriber with a live leader,
// and lists its replication slot (--wal) and the WAL it retains.
func TestRelayNATS(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ns, err := natsserver.Start(t.TempDir(), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Stop)
	for _, typ := range []string{"order.placed", "order.shipped", "user.joined"} {
		if r := annals(t, db.URL, "append", "o-1", typ, `{}`); r.code != 0 {
			t.Fatalf("append: %+v", r)
		}
	}
	r := annals(t, db.URL, "relay", "nats", "--nats-url", ns.ClientURL(), "--types", "order.*", "--once", "--output", "json")
	if r.code != 0 {
		t.Fatalf("relay nats: %+v", r)
	}
	var out struct {
		Relay, Stream, Subjects string
		Position                int64
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || out.Position != 3 || out.Subjects != "annals.*.*" || out.Stream != "ANNALS" {
		t.Fatalf("relay nats output %q: %+v, %v", r.stdout, out, err)
	}
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	s, err := js.Stream(t.Context(), "ANNALS")
	if err != nil {
		t.Fatal(err)
	}
	if n := s.CachedInfo().State.Msgs; n != 2 {
		t.Fatalf("the stream holds %d messages, want 2 (order.*)", n)
	}
	if m, err := s.GetMsg(t.Context(), 2); err != nil || m.Subject != "annals.order%2Eshipped.o-1" {
		t.Fatalf("message 2: %v, %v", m, err)
	}

	// Arguments that cannot work exit 2 before the relay connects or
	// takes a lock: an empty --name does not lead (and fence) the relay
	// named "relay", whose defaults would take its place.
	epoch := func() int64 {
		var e int64
		if err := db.Pool.QueryRow(t.Context(), `SELECT epoch FROM annals.checkpoints WHERE subscriber_id = 'relay' AND partition = 0`).Scan(&e); err != nil {
			t.Fatal(err)
		}
		return e
	}
	epoch0 := epoch()
	for _, args := range [][]string{
		{"--name", ""},
		{"--name", " "},
		{"--stream", ""},
		{"--stream", "A.B"},
		{"--prefix", ""},
		{"--prefix", "a..b"},
		{"--subject", ""},
	} {
		for _, url := range []string{ns.ClientURL(), "nats://127.0.0.1:1"} {
			args := append([]string{"relay", "nats", "--once", "--nats-url", url}, args...)
			// Bounded: a relay that went ahead might wait for its lock.
			if r := annalsWithin(t, 20*time.Second, db.URL, args...); r.code != 2 || !strings.Contains(r.stderr, args[5]) {
				t.Errorf("%q: exit %d, want 2 naming %s (%s)", args, r.code, args[5], r.stderr)
			}
		}
	}
	if r := annalsWithin(t, 20*time.Second, db.URL, "relay", "nats", "--once", "--nats-url", ""); r.code != 2 {
		t.Errorf("--nats-url '': exit %d, want 2 (%s)", r.code, r.stderr)
	}
	if e := epoch(); e != epoch0 {
		t.Fatalf("bad arguments moved the relay's epoch from %d to %d", epoch0, e)
	}
	for _, args := range [][]string{
		{"relay", "nats", "--types", "a**b["},
		{"relay", "nats", "--prefix", "a.*", "--nats-url", ns.ClientURL()},
		{"relay", "nats", "--subject", "{prefix}.{oops}", "--nats-url", ns.ClientURL()},
		{"relay", "nats", "--batch-size", "-1"},
		{"relay", "nats", "--replicas", "-1"},
		{"relay"},
	} {
		if r := annals(t, db.URL, args...); r.code != 2 {
			t.Errorf("%v: exit %d, want 2 (%s)", args, r.code, r.stderr)
		}
	}

	// A window longer than the stream keeps messages: refused up front,
	// naming both flags, not by the server after connecting (exit 1).
	if r := annalsWithin(t, 20*time.Second, db.URL, "relay", "nats", "--once", "--nats-url", ns.ClientURL(), "--stream", "SHORT", "--max-age", "1m"); r.code != 2 ||
		!strings.Contains(r.stderr, "--max-age") || !strings.Contains(r.stderr, "--duplicates") {
		t.Errorf("--max-age 1m with the default --duplicates: exit %d, want 2 naming both flags (%s)", r.code, r.stderr)
	}
	if r := annalsWithin(t, 20*time.Second, db.URL, "relay", "nats", "--once", "--nats-url", ns.ClientURL(), "--stream", "SHORT", "--prefix", "short", "--name", "short", "--max-age", "1m", "--duplicates", "1m"); r.code != 0 {
		t.Errorf("--max-age 1m --duplicates 1m: exit %d (%s)", r.code, r.stderr)
	}

	// --wal with a role that may not stream from a slot (it has the
	// owner's privileges but not REPLICATION, which is not inherited): a
	// running relay ends with a clear error once its WAL source stops on
	// 42501 (relay.ErrNoReplication), not 42501 retried for ever. (--once
	// never streams from the slot, so it is not checked.)
	noRepl := "norepl_" + strings.TrimPrefix(db.Name, "annalstest_")
	if _, err := db.Pool.Exec(t.Context(), "CREATE ROLE "+noRepl+" LOGIN NOREPLICATION IN ROLE "+"current_user"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := db.Pool.Exec(context.Background(), "DROP ROLE "+noRepl); err != nil {
			t.Error(err)
		}
	})
	if _, err := walsource.EnsurePublication(t.Context(), db.Pool, ""); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(noRepl)
	if r := annalsWithin(t, 90*time.Second, u.String(), "relay", "nats", "--nats-url", ns.ClientURL(), "--name", "norepl", "--stream", "NOREPL", "--prefix", "n", "--wal"); r.code != 1 ||
		!strings.Contains(r.stderr, "REPLICATION") {
		t.Errorf("--wal as a role without REPLICATION: exit %d, want 1 saying REPLICATION (%s)", r.code, r.stderr)
	}

	// --wal: the relay's slot appears in annals status.
	slot := walsource.SlotName(db.Name, "annals", "walrelay", 0)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := walsource.DropSlot(ctx, db.Pool, slot); err != nil {
			t.Error(err)
		}
	})
	// Made up front, with minutes to spare: creating a logical slot waits
	// for every transaction running in the cluster (other packages' tests
	// hold some open for seconds in make test). The relay uses it as found.
	mctx, mcancel := context.WithTimeout(context.Background(), 3*time.Minute)
	if _, err := walsource.EnsureSlot(mctx, db.Pool, slot); err != nil {
		t.Fatal(err)
	}
	mcancel()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan result, 1)
	go func() {
		var rr result
		rr.code = run(ctx, []string{"relay", "nats", "--nats-url", ns.ClientURL(), "--name", "walrelay", "--stream", "WAL", "--prefix", "w", "--wal"},
			nil, &discard{}, &discard{}, func(k string) string {
				if k == "DATABASE_URL" {
					return db.URL
				}
				return ""
			})
		done <- rr
	}()
	var st StatusJSON
	annalstest.WaitFor(t, 20*time.Second, func() bool {
		r := annals(t, db.URL, "status", "--output", "json")
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &st) != nil {
			return false
		}
		// Led, caught up, and the slot made: a slot shows as active while
		// it is being created too (PostgreSQL waits for the transactions
		// running then to end), and a cancelled creation leaves no slot.
		led := false
		for _, s := range st.Subscribers {
			led = led || (s.Subscriber == "walrelay" && s.Leader != nil && s.Position == s.Head)
		}
		return led && len(st.ReplicationSlots) == 1 && st.ReplicationSlots[0].Active &&
			st.ReplicationSlots[0].ConfirmedFlushLSN != ""
	})
	if st.ReplicationSlots[0].Slot != slot {
		t.Fatalf("status lists slot %q, want %q", st.ReplicationSlots[0].Slot, slot)
	}
	cancel()
	if rr := <-done; rr.code != 0 {
		t.Fatalf("relay nats --wal exited %d", rr.code)
	}
	// The walsender of the stopped relay may take a moment to end.
	annalstest.WaitFor(t, 20*time.Second, func() bool {
		r = annals(t, db.URL, "status")
		return r.code == 0 && contains(r.stdout, slot) && contains(r.stdout, "inactive (retaining WAL)")
	})
}

// annalsWithin is annals, cancelled after d.
func annalsWithin(t *testing.T, d time.Duration, url string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var out, errOut bytes.Buffer
	code := run(ctx, args, strings.NewReader(""), &out, &errOut, func(k string) string {
		if k == "DATABASE_URL" {
			return url
		}
		return ""
	})
	return result{code, out.String(), errOut.String()}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

func contains(s, sub string) bool { return strings.Contains(s, sub) }

// The secrets of --nats-url (a password, a token; of each URL of a list)
// are not printed: a failed connection said "relay: connect to
// nats://user:s3cret@127.0.0.1:1: …". Nor is a piece of one: the list was
// split on commas before redacting, so a password holding "," was printed
// up to it, and a token holding ":" was read as user:password and printed
// up to it.
func TestRelayNATSRedactsTheURL(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	for _, c := range []struct{ url, want string }{
		{"nats://user:s3cret@127.0.0.1:1", "nats://xxxxx@127.0.0.1:1"},
		{"nats://t0kens3cret@127.0.0.1:1", "nats://xxxxx@127.0.0.1:1"},
		{"nats://a:pw-s3cret@127.0.0.1:1,nats://t0kens3cret@127.0.0.1:2", "nats://xxxxx@127.0.0.1:1,nats://xxxxx@127.0.0.1:2"},
		{"nats://s3cret:t0ken@127.0.0.1:1", "nats://xxxxx@127.0.0.1:1"},
		// Parse errors, which quote the URL, or a piece of the password.
		{"nats://user:s3cret@[::1:4222", "nats://xxxxx@[::1:4222"},
		{"nats://user:p%40s3cret/x@127.0.0.1:1", "nats://xxxxx@127.0.0.1:1"},
		{"nats://user:s3cret,s3cret2@127.0.0.1:1", "nats://xxxxx@127.0.0.1:1"},
		{"nats://user:1,s3cret@127.0.0.1:1,nats://127.0.0.1:2", "nats://xxxxx@127.0.0.1:1,nats://127.0.0.1:2"},
	} {
		r := annalsWithin(t, 20*time.Second, db.URL, "relay", "nats", "--once", "--nats-url", c.url)
		if r.code != 1 || strings.Contains(strings.ToLower(r.stderr+r.stdout), "s3cret") || !strings.Contains(r.stderr, c.want) {
			t.Errorf("--nats-url %s: exit %d, want 1 naming %s and no secret:\n%s%s", c.url, r.code, c.want, r.stdout, r.stderr)
		}
	}
	for in, want := range map[string]string{
		"nats://127.0.0.1:4222":                        "nats://127.0.0.1:4222",
		"nats://user:pw@h:1,nats://tok@h:2,nats://h:3": "nats://xxxxx@h:1,nats://xxxxx@h:2,nats://h:3",
		"user:p@ss@h": "xxxxx@h",
		"tls://:pw@h": "tls://xxxxx@h",
		// Without a scheme, a URL after a comma may be a password's rest:
		// redacted with the user information before it.
		"nats://h:1, tok@h:2":                "nats://xxxxx@h:2",
		"nats://u:pa,ss@h:1":                 "nats://xxxxx@h:1",
		"nats://u:pa,ss@h:1, nats://v:w@h:2": "nats://xxxxx@h:1, nats://xxxxx@h:2",
		"nats://tok:en@h:1":                  "nats://xxxxx@h:1",
		" nats://u:p@ss,w0rd@h:1,tls://h:2":  " nats://xxxxx@h:1,tls://h:2",
		"u:pa,ss@h:1":                        "xxxxx@h:1",
		"nats://h:1,nats://h:2":              "nats://h:1,nats://h:2",
	} {
		if got := redactNATSURLs(in); got != want {
			t.Errorf("redactNATSURLs(%q) = %q, want %q", in, got, want)
		}
	}
	// The NATS client splits the list on commas itself, and its errors
	// quote the pieces.
	for _, c := range []struct{ text, urls string }{
		{`parse "nats://u:pa": invalid port ":pa" after host`, "nats://u:pa,ss@h:1"},
		{`nats: authorization violation for tok:en`, "nats://tok:en@h:1"},
		{`dial "ss@h:1": refused`, "nats://u:pa,ss@h:1"},
	} {
		got := redactNATSSecrets(c.text, c.urls)
		for _, secret := range []string{"pa", "ss", "tok", "en"} {
			if strings.Contains(c.urls, secret) && strings.Contains(strings.ReplaceAll(got, "parse", ""), secret) {
				t.Errorf("redactNATSSecrets(%q, %q) = %q: %q left", c.text, c.urls, got, secret)
			}
		}
	}
}

// A --name with a control character other than tab exits 2 before the
// relay connects: NATS headers cannot carry it, and the relay's next run
// refused its own stream.
func TestRelayNATSRefusesAControlCharacterInTheName(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	for _, name := range []string{"a\nb", "a\rb", "a\x00b"} {
		r := annalsWithin(t, 20*time.Second, db.URL, "relay", "nats", "--once", "--nats-url", "nats://127.0.0.1:1", "--name", name)
		if r.code != 2 || !strings.Contains(r.stderr, "--name") || !strings.Contains(r.stderr, "control character") {
			t.Errorf("--name %q: exit %d, want 2 naming --name and the control character (%s)", name, r.code, r.stderr)
		}
	}
}

// TestRelayOnceSaysWhatItWaitsFor: relay --once while another session holds
// the relay's lock (a relay process of the same name leading) says, after a
// moment, what it may be waiting for; it waited without a word.
func TestRelayOnceSaysWhatItWaitsFor(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ns, err := natsserver.Start(t.TempDir(), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Stop)
	conn, err := pgx.Connect(t.Context(), db.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	k1, k2 := lockkey.Pair(catchup.LockKey("annals", "waiting-relay", 0))
	if _, err := conn.Exec(t.Context(), "SELECT pg_advisory_lock($1::int4, $2::int4)", k1, k2); err != nil {
		t.Fatal(err)
	}
	r := annalsWithin(t, 3*onceWaitNote, db.URL, "relay", "nats", "--once", "--nats-url", ns.ClientURL(), "--name", "waiting-relay")
	if r.code == 0 || !strings.Contains(r.stderr, "waiting for the relay's lock") {
		t.Fatalf("relay --once behind another's lock: exit %d, stderr %q; want a note on what it waits for", r.code, r.stderr)
	}
}
