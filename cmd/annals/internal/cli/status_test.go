package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/checkpoint"
	"github.com/annals-dev/annals/internal/lockkey"
	"github.com/annals-dev/annals/walsource"
)

// sqlExec runs statements on the test database (setup the CLI cannot do:
// checkpoints and instances are the runner's to write).
func sqlExec(t *testing.T, db *annalstest.DB, sql string, args ...any) {
	t.Helper()
	if _, err := db.Pool.Exec(t.Context(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// statusJSON runs annals status --format json and decodes it.
func statusJSON(t *testing.T, url string, args ...string) StatusJSON {
	t.Helper()
	r := annals(t, url, append([]string{"status", "--output", "json"}, args...)...)
	if r.code != 0 {
		t.Fatalf("status --format json: %+v", r)
	}
	var st StatusJSON
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatalf("status JSON: %v\n%s", err, r.stdout)
	}
	return st
}

// tableLine returns the line of a table that starts with the given cells,
// its cells separated by single spaces.
func tableLine(t *testing.T, out string, cells ...string) string {
	t.Helper()
	for line := range strings.Lines(out) {
		if f := strings.Fields(line); len(f) >= len(cells) && slices.Equal(f[:len(cells)], cells) {
			return strings.Join(f, " ")
		}
	}
	t.Fatalf("no line starting with %q in:\n%s", cells, out)
	return ""
}

func TestStatus(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)

	t.Run("Empty", func(t *testing.T) {
		r := annals(t, db.URL, "status")
		if r.code != 0 || !strings.Contains(r.stdout, "No subscribers yet") || !strings.Contains(r.stdout, "No runner instances") {
			t.Fatalf("empty status: %+v", r)
		}
		r = annals(t, db.URL, "status", "--output", "json")
		if r.code != 0 || !strings.Contains(r.stdout, `"subscribers": []`) || !strings.Contains(r.stdout, `"instances": []`) {
			t.Fatalf("empty status JSON: %+v", r)
		}
	})

	// The log: positions 1-3 recorded an hour ago, 4 a hole (a rolled-back
	// append), 5-6 appended now. Head 6, but 5 events after position 0.
	sqlExec(t, db, `INSERT INTO annals.events (global_sequence, event_id, stream_id, stream_version, event_type, data, recorded_at)
		SELECT nextval('annals.events_global_sequence'), gen_random_uuid(), 'old-' || g, 1, 'old.thing', '{}', now() - interval '1 hour'
		  FROM generate_series(1, 3) g`)
	sqlExec(t, db, `SELECT nextval('annals.events_global_sequence')`)
	for _, s := range []string{"new-1", "new-2"} {
		if r := annals(t, db.URL, "append", s, "new.thing", `{}`); r.code != 0 {
			t.Fatalf("append: %+v", r)
		}
	}
	sqlExec(t, db, `INSERT INTO annals.checkpoints (subscriber_id, partition, position, epoch, owner) VALUES
		('projector', 0, 0, 3, 'inst-live'),
		('projector', 1, 6, 2, 'inst-live'),
		('mailer',    0, 3, 1, 'inst-stale')`)
	sqlExec(t, db, `INSERT INTO annals.instances (instance_id, host, pid, last_heartbeat, leads) VALUES
		('inst-live',  'host-a', 101, now(), '[{"subscriber": "projector", "partition": 0, "epoch": 3}, {"subscriber": "projector", "partition": 1, "epoch": 2}]'),
		('inst-stale', 'host-b', 202, now() - interval '5 minutes', '[{"subscriber": "mailer", "partition": 0, "epoch": 1}]')`)

	// Leaders hold their partition's advisory lock; status checks it.
	lockConn, err := db.Pool.Acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer lockConn.Release()
	lockPartition := func(sub string, part int, lock bool) {
		t.Helper()
		k1, k2 := lockkey.Pair(catchup.LockKey("annals", sub, part))
		fn := "pg_advisory_lock"
		if !lock {
			fn = "pg_advisory_unlock"
		}
		if _, err := lockConn.Exec(t.Context(), "SELECT "+fn+"($1::int4, $2::int4)", k1, k2); err != nil {
			t.Fatal(err)
		}
	}
	lockPartition("projector", 0, true)
	lockPartition("projector", 1, true)

	t.Run("Table", func(t *testing.T) {
		r := annals(t, db.URL, "status")
		if r.code != 0 {
			t.Fatalf("status: %+v", r)
		}
		if l := tableLine(t, r.stdout, "projector", "0"); l != "projector 0 - 0 6 5 1h0m0s 3 inst-live" {
			t.Errorf("projector/0: %q", l)
		}
		if l := tableLine(t, r.stdout, "projector", "1"); l != "projector 1 - 6 6 0 0s 2 inst-live" {
			t.Errorf("projector/1: %q", l)
		}
		if l := tableLine(t, r.stdout, "mailer", "0"); !strings.HasPrefix(l, "mailer 0 - 3 6 2 ") || !strings.HasSuffix(l, " 1 inst-stale (no live leader)") {
			t.Errorf("mailer/0: %q", l)
		}
		if l := tableLine(t, r.stdout, "inst-live", "host-a", "101"); !strings.Contains(l, " live ") || !strings.HasSuffix(l, "projector/0, projector/1") {
			t.Errorf("inst-live: %q", l)
		}
		// The age of the last heartbeat is shown: 5 minutes, plus the test's
		// time. It lists mailer/0, whose lock is free: it does not lead it.
		if l := tableLine(t, r.stdout, "inst-stale", "host-b", "202"); !strings.Contains(l, " stale ") || !strings.HasSuffix(l, " - (listed, not held: mailer/0)") ||
			!regexp.MustCompile(` \(5m[0-9]+s ago\) `).MatchString(l) {
			t.Errorf("inst-stale: %q", l)
		}
	})

	t.Run("JSON", func(t *testing.T) {
		st := statusJSON(t, db.URL)
		if st.Schema != "annals" || st.Head != 6 || st.StaleAfterSeconds != 30 || st.CheckedAt.IsZero() {
			t.Fatalf("status header: %+v", st)
		}
		if len(st.Subscribers) != 3 || len(st.Instances) != 2 {
			t.Fatalf("status: %+v", st)
		}
		m, p0, p1 := st.Subscribers[0], st.Subscribers[1], st.Subscribers[2] // ordered by subscriber, partition
		if p0.Subscriber != "projector" || p0.Partition != 0 || p0.Position != 0 || p0.Head != 6 ||
			p0.LagEvents != 5 || !p0.LagEventsExact || p0.Epoch != 3 ||
			p0.Leader == nil || *p0.Leader != "inst-live" || p0.LeaderEpoch == nil || *p0.LeaderEpoch != 3 {
			t.Errorf("projector/0: %+v", p0)
		}
		if p0.LagSeconds < 3600 || p0.LagSeconds > 3600+300 {
			t.Errorf("projector/0 lag %.1fs, want about an hour", p0.LagSeconds)
		}
		if p1.Partition != 1 || p1.LagEvents != 0 || !p1.LagEventsExact || p1.LagSeconds != 0 || p1.Leader == nil || *p1.Leader != "inst-live" {
			t.Errorf("projector/1: %+v", p1)
		}
		if m.Subscriber != "mailer" || m.Position != 3 || m.LagEvents != 2 || m.LagSeconds >= 600 ||
			m.Leader != nil || m.LeaderEpoch != nil || m.Owner == nil || *m.Owner != "inst-stale" {
			t.Errorf("mailer/0: %+v", m)
		}
		live, stale := st.Instances[0], st.Instances[1]
		if live.InstanceID != "inst-live" || live.Host != "host-a" || live.PID != 101 || !live.Live || live.HeartbeatAgeSeconds > 60 {
			t.Errorf("inst-live: %+v", live)
		}
		if stale.InstanceID != "inst-stale" || stale.Live || stale.HeartbeatAgeSeconds < 299 {
			t.Errorf("inst-stale: %+v", stale)
		}
		var leads []struct {
			Subscriber string `json:"subscriber"`
			Partition  int    `json:"partition"`
			Epoch      int64  `json:"epoch"`
		}
		if err := json.Unmarshal(live.Leads, &leads); err != nil || len(leads) != 2 || leads[1].Subscriber != "projector" || leads[1].Partition != 1 || leads[1].Epoch != 2 {
			t.Errorf("inst-live leads %s (%v)", live.Leads, err)
		}
	})

	t.Run("StaleAfter", func(t *testing.T) {
		// inst-stale's heartbeat is then fresh, but mailer/0's lock is
		// free: it leads nothing, and is lost.
		st := statusJSON(t, db.URL, "--stale-after", "10m")
		if m := st.Subscribers[0]; m.HeartbeatLeader == nil || *m.HeartbeatLeader != "inst-stale" || m.Leader != nil ||
			st.Instances[1].Live || st.Instances[1].State != "lost" || st.StaleAfterSeconds != 600 {
			t.Errorf("--stale-after 10m: mailer %+v, instance %+v", m, st.Instances[1])
		}
		// Nobody is live when the threshold is shorter than any heartbeat's
		// age; the locks still say who leads: the checkpoints' owner.
		st = statusJSON(t, db.URL, "--stale-after", "1ns")
		for _, s := range st.Subscribers {
			if s.HeartbeatLeader != nil {
				t.Errorf("--stale-after 1ns: %s/%d has heartbeat leader %s", s.Subscriber, s.Partition, *s.HeartbeatLeader)
			}
			if want := s.Subscriber == "projector"; (s.Leader != nil && *s.Leader == "inst-live") != want {
				t.Errorf("--stale-after 1ns: %s/%d led by %v", s.Subscriber, s.Partition, s.Leader)
			}
		}
		for _, in := range st.Instances {
			if in.Live || in.State != "stale" {
				t.Errorf("--stale-after 1ns: instance %+v", in)
			}
		}
	})

	t.Run("LeaderAtOlderEpoch", func(t *testing.T) {
		// An operator's set bumps the epoch; until the leader claims again
		// it leads at the old one, and the table says so.
		if r := annals(t, db.URL, "checkpoint", "set", "projector", "6", "--partition", "1", "--yes"); r.code != 0 {
			t.Fatalf("checkpoint set: %+v", r)
		}
		r := annals(t, db.URL, "status")
		if l := tableLine(t, r.stdout, "projector", "1"); l != "projector 1 - 6 6 0 0s 3 inst-live (at epoch 2)" {
			t.Errorf("projector/1 after set: %q", l)
		}
	})

	t.Run("LockSaysWhoLeads", func(t *testing.T) {
		// projector/1's leader was killed a moment ago: its heartbeat is
		// fresh, its lock free. A session holds mailer/0's lock with no
		// live instance listing it (a rebuild, a tail --subscriber).
		lockPartition("projector", 1, false)
		lockPartition("mailer", 0, true)
		defer lockPartition("mailer", 0, false)
		defer lockPartition("projector", 1, true)
		r := annals(t, db.URL, "status")
		if l := tableLine(t, r.stdout, "projector", "1"); !strings.HasSuffix(l, " (none: inst-live's lock is free)") {
			t.Errorf("projector/1 with its lock free: %q", l)
		}
		if l := tableLine(t, r.stdout, "mailer", "0"); !regexp.MustCompile(` inst-stale \(lock held by backend [0-9]+, no live instance\)$`).MatchString(l) {
			t.Errorf("mailer/0 with its lock held: %q", l)
		}
		st := statusJSON(t, db.URL)
		for _, s := range st.Subscribers {
			want := s.Subscriber != "projector" || s.Partition != 1
			if s.LockHeld != want || (s.LockPID != nil) != want {
				t.Errorf("%s/%d: lock_held %v, lock_pid %v; want held %v", s.Subscriber, s.Partition, s.LockHeld, s.LockPID, want)
			}
		}
	})

	t.Run("BlueGreenGenerations", func(t *testing.T) {
		// A retired generation keeps its checkpoint (for a rollback) and the
		// cut-over's stop, but nothing runs it: no STOPPED advice for it.
		sqlExec(t, db, `INSERT INTO annals.read_model_generations (projection, generation, version, schema_name, reader_schema, subscriber, state, created_by)
			VALUES ('bgm', 1, 1, 'rm_bgm_g1', 'public', 'bgm#g1', 'retired', 'test'),
			       ('bgm', 2, 2, 'rm_bgm_g2', 'public', 'bgm#g2', 'live', 'test')`)
		sqlExec(t, db, `INSERT INTO annals.checkpoints (subscriber_id, partition, position, epoch, owner, stopped_reason, stopped_at) VALUES
			('bgm#g1', 0, 2, 1, 'inst-old', 'annals: generation 1 retired by the cut-over to generation 2', now()),
			('bgm#g2', 0, 6, 1, 'inst-live', NULL, NULL)`)
		r := annals(t, db.URL, "status")
		if r.code != 0 || strings.Contains(r.stdout, "STOPPED bgm#g1") ||
			!strings.Contains(r.stdout, "bgm#g1 is generation 1 of blue/green read model bgm: retired") ||
			!strings.Contains(r.stdout, "bgm#g2 is generation 2 of blue/green read model bgm: serves the readers") {
			t.Errorf("status with blue/green generations: %+v", r)
		}
		if l := tableLine(t, r.stdout, "bgm#g1", "0"); !strings.HasSuffix(l, " (retired: none)") {
			t.Errorf("bgm#g1/0: %q", l)
		}
		st := statusJSON(t, db.URL)
		for _, s := range st.Subscribers {
			if strings.HasPrefix(s.Subscriber, "bgm#") != (s.Generation != nil) {
				t.Errorf("%s: generation %+v", s.Subscriber, s.Generation)
			}
			if s.Subscriber == "bgm#g1" && (s.Generation.ReadModel != "bgm" || s.Generation.Generation != 1 || s.Generation.State != "retired") {
				t.Errorf("bgm#g1: generation %+v", s.Generation)
			}
		}
		sqlExec(t, db, `DELETE FROM annals.checkpoints WHERE subscriber_id LIKE 'bgm#%'`)
	})

	t.Run("BadInput", func(t *testing.T) {
		for _, args := range [][]string{
			{"status", "--output", "xml"},
			{"status", "--output", "jsonl"},
			{"status", "--stale-after", "0s"},
			{"status", "--stale-after", "-1m"},
			{"status", "--stale-after", "soon"},
			{"status", "extra"},
			{"status", "--schema", "bad$schema"},
		} {
			r := annals(t, db.URL, args...)
			if r.code != 2 || r.stdout != "" || !strings.HasPrefix(r.stderr, "annals: ") || strings.Count(r.stderr, "\n") != 2 {
				t.Errorf("annals %s: %+v", strings.Join(args, " "), r)
			}
		}
		// A schema without the subscription tables is a failure, with a hint.
		r := annals(t, db.URL, "status", "--schema", "nowhere")
		if r.code != 1 || !strings.Contains(r.stderr, "annals migrate") || strings.Count(r.stderr, "\n") != 1 {
			t.Errorf("status on a missing schema: %+v", r)
		}
	})

	t.Run("QuotedSchema", func(t *testing.T) {
		const schema = `odd "Status"`
		if r := annals(t, db.URL, "migrate", "--schema", schema); r.code != 0 {
			t.Fatalf("migrate: %+v", r)
		}
		if r := annals(t, db.URL, "status", "--schema", schema); r.code != 0 || !strings.Contains(r.stdout, `no checkpoints in schema "odd \"Status\""`) {
			t.Fatalf("status: %+v", r)
		}
	})
}

// Beyond lagCountLimit events the lag is head - position, marked inexact.
func TestStatusLagBeyondCountLimit(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	sqlExec(t, db, `INSERT INTO annals.events (global_sequence, event_id, stream_id, stream_version, event_type, data)
		SELECT nextval('annals.events_global_sequence'), gen_random_uuid(), 's-' || g, 1, 't', '{}'
		  FROM generate_series(1, $1::int) g`, lagCountLimit+5)
	sqlExec(t, db, `SELECT nextval('annals.events_global_sequence')`) // a hole at the head
	if r := annals(t, db.URL, "append", "last", "t", `{}`); r.code != 0 {
		t.Fatalf("append: %+v", r)
	}
	head := int64(lagCountLimit + 7)
	sqlExec(t, db, `INSERT INTO annals.checkpoints (subscriber_id, partition, position, epoch) VALUES ('far', 0, 1, 1), ('near', 0, 6, 1), ('over', 0, 5, 1)`)
	st := statusJSON(t, db.URL)
	if st.Head != head {
		t.Fatalf("head %d, want %d", st.Head, head)
	}
	if far := st.Subscribers[0]; far.LagEventsExact || far.LagEvents != head-1 {
		t.Errorf("far: %+v", far)
	}
	// Exactly lagCountLimit events after the checkpoint (7..10005 and
	// 10007) are still counted; one more is not.
	if near := st.Subscribers[1]; !near.LagEventsExact || near.LagEvents != lagCountLimit {
		t.Errorf("near: %+v", near)
	}
	if over := st.Subscribers[2]; over.LagEventsExact || over.LagEvents != head-5 {
		t.Errorf("over: %+v", over)
	}
	r := annals(t, db.URL, "status")
	if l := tableLine(t, r.stdout, "far", "0"); !strings.Contains(l, " ~10006 ") {
		t.Errorf("far: %q", l)
	}
}

// ttyReader stands in for a terminal on stdin.
type ttyReader struct{ io.Reader }

func (ttyReader) IsTerminal() bool { return true }

// annalsIn runs the command line with stdin.
func annalsIn(t *testing.T, url string, stdin io.Reader, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	getenv := func(k string) string {
		if k == "DATABASE_URL" {
			return url
		}
		return ""
	}
	code := run(context.Background(), args, stdin, &out, &errOut, getenv)
	return result{code, out.String(), errOut.String()}
}

func TestCheckpointCommand(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	for _, s := range []string{"a", "b", "c"} {
		if r := annals(t, db.URL, "append", s, "t", `{}`); r.code != 0 {
			t.Fatalf("append: %+v", r)
		}
	}
	sqlExec(t, db, `INSERT INTO annals.checkpoints (subscriber_id, partition, position, epoch, owner) VALUES
		('orders', 0, 1, 3, 'inst-1'), ('orders', 2, 2, 1, 'inst-2')`)
	store, err := checkpoint.New("")
	if err != nil {
		t.Fatal(err)
	}
	load := func(t *testing.T, part int) checkpoint.Checkpoint {
		t.Helper()
		c, err := store.Load(t.Context(), db.Pool, "orders", part)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}

	t.Run("Get", func(t *testing.T) {
		// Without --partition, every partition: orders has 0 and 2 (it
		// printed only orders/0).
		if r := annals(t, db.URL, "checkpoint", "get", "orders"); r.code != 0 || strings.Count(r.stdout, "\n") != 2 ||
			!strings.HasPrefix(r.stdout, "orders/0: position 1, epoch 3 (owner inst-1, updated ") ||
			!strings.Contains(r.stdout, "\norders/2: position 2, epoch 1 (owner inst-2, updated ") {
			t.Errorf("get orders: %+v", r)
		}
		if r := annals(t, db.URL, "checkpoint", "get", "orders", "--partition", "0"); r.code != 0 || strings.Count(r.stdout, "\n") != 1 ||
			!strings.HasPrefix(r.stdout, "orders/0: position 1, epoch 3 ") {
			t.Errorf("get orders --partition 0: %+v", r)
		}
		r := annals(t, db.URL, "checkpoint", "get", "orders", "--output", "json")
		var all CheckpointJSON
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &all) != nil || all.Partition != 0 || all.Position != 1 ||
			len(all.Partitions) != 2 || all.Partitions[1].Partition != 2 || all.Partitions[1].Position != 2 || all.Partitions[1].Epoch != 1 ||
			all.Partitions[1].Owner == nil || *all.Partitions[1].Owner != "inst-2" || all.Partitions[1].Subscriber != "orders" {
			t.Errorf("get orders --output json: %+v", r)
		}
		r = annals(t, db.URL, "checkpoint", "get", "orders", "--partition", "2", "--output", "json")
		if r.code != 0 || strings.Contains(r.stdout, `"partitions"`) || !strings.Contains(r.stdout, `"partition": 2,`) {
			t.Errorf("get orders --partition 2 --output json: %+v", r)
		}
		if r := annals(t, db.URL, "checkpoint", "get", "orders", "--partition", "2"); r.code != 0 || !strings.HasPrefix(r.stdout, "orders/2: position 2, epoch 1 ") {
			t.Errorf("get orders --partition 2: %+v", r)
		}
		for _, args := range [][]string{{"nope"}, {"orders", "--partition", "1"}} {
			r := annals(t, db.URL, append([]string{"checkpoint", "get"}, args...)...)
			if r.code != ExitNotFound || r.stdout != "" || !strings.Contains(r.stderr, "unknown subscriber") || strings.Count(r.stderr, "\n") != 1 {
				t.Errorf("get %v: %+v", args, r)
			}
		}
	})

	// Bad input exits 2 and changes nothing; so does an unconfirmed set.
	t.Run("BadInput", func(t *testing.T) {
		for _, args := range [][]string{
			{"checkpoint", "set", "orders", "--", "-1", "--yes"},
			{"checkpoint", "set", "orders", "-1", "--yes"},
			{"checkpoint", "set", "orders", "abc", "--yes"},
			{"checkpoint", "set", "orders", "1.5", "--yes"},
			{"checkpoint", "set", "orders", "", "--yes"},
			{"checkpoint", "set", "orders", "4", "--yes"}, // beyond the head (3)
			{"checkpoint", "set", "orders", "99999999999999999999", "--yes"},
			{"checkpoint", "set", "orders", "2"}, // no --yes, stdin not a terminal
			{"checkpoint", "set", "", "1", "--yes"},
			{"checkpoint", "set", "orders", "1", "--partition", "-1", "--yes"},
			{"checkpoint", "set", "orders", "--yes"},
			{"checkpoint", "set", "orders", "1", "2", "--yes"},
			{"checkpoint", "get"},
			{"checkpoint", "get", "orders", "--partition", "x"},
			{"checkpoint", "get", "orders", "--partition", "-2"},
			{"checkpoint", "get", ""},
			{"checkpoint"},
			{"checkpoint", "bogus"},
			{"checkpoint", "get", "orders", "--output", "jsonl"},
		} {
			r := annals(t, db.URL, args...)
			if r.code != 2 || r.stdout != "" || !strings.HasPrefix(r.stderr, "annals: ") || strings.Count(r.stderr, "\n") != 2 {
				t.Errorf("annals %q: %+v", args, r)
			}
		}
		// A negative position reaches the flag parser first ("-1" as
		// shorthand flags): it says what is wrong with the position.
		for _, args := range [][]string{{"orders", "-1", "--yes"}, {"orders", "-12", "--yes"}, {"--yes", "orders", "-1"}} {
			r := annals(t, db.URL, append([]string{"checkpoint", "set"}, args...)...)
			if r.code != ExitUsage || !strings.Contains(r.stderr, "POSITION -1") || !strings.Contains(r.stderr, "must not be negative") || strings.Contains(r.stderr, "shorthand") {
				t.Errorf("checkpoint set %q: %+v", args, r)
			}
		}
		if r := annals(t, db.URL, "checkpoint", "set", "orders", "--", "-1"); r.code != ExitUsage || !strings.Contains(r.stderr, "must not be negative") ||
			strings.Contains(r.stderr, "is needed") {
			t.Errorf("checkpoint set orders -- -1: %+v", r)
		}
		if r := annals(t, db.URL, "checkpoint", "get", "orders", "-x"); r.code != ExitUsage || !strings.Contains(r.stderr, "unknown shorthand flag") {
			t.Errorf("checkpoint get orders -x: %+v", r)
		}
		if r := annals(t, db.URL, "checkpoint", "set", "orders", "4", "--yes"); !strings.Contains(r.stderr, "beyond the head of the log (3)") {
			t.Errorf("beyond head: %q", r.stderr)
		}
		if r := annals(t, db.URL, "checkpoint", "set", "orders", "2"); !strings.Contains(r.stderr, "pass --yes") ||
			!strings.Contains(r.stderr, "move orders/0 forward from 1 to 2 (events at positions 2..2 will be skipped)") {
			t.Errorf("without --yes: %q", r.stderr)
		}
		// An unknown subscriber is not found unless --create.
		if r := annals(t, db.URL, "checkpoint", "set", "nope", "1", "--yes"); r.code != ExitNotFound || !strings.Contains(r.stderr, "unknown subscriber nope/0") || !strings.Contains(r.stderr, "--create") {
			t.Errorf("set unknown: %+v", r)
		}
		if c := load(t, 0); c.Position != 1 || c.Epoch != 3 || c.Owner != "inst-1" {
			t.Errorf("bad input changed orders/0: %+v", c)
		}
		if c := load(t, 2); c.Position != 2 || c.Epoch != 1 {
			t.Errorf("bad input changed orders/2: %+v", c)
		}
		if _, err := store.Load(t.Context(), db.Pool, "nope", 0); !errors.Is(err, checkpoint.ErrNotFound) {
			t.Errorf("set without --create made a checkpoint: %v", err)
		}
	})

	t.Run("SetRoundTrip", func(t *testing.T) {
		r := annals(t, db.URL, "checkpoint", "set", "orders", "3", "--yes")
		if r.code != 0 || r.stdout != "orders/0: position 1 → 3, epoch 3 → 4\n" {
			t.Fatalf("set: %+v", r)
		}
		if r = annals(t, db.URL, "checkpoint", "get", "orders"); r.code != 0 || !strings.HasPrefix(r.stdout, "orders/0: position 3, epoch 4 (owner none, ") {
			t.Fatalf("get after set: %+v", r)
		}
		// The leader that claimed epoch 3 is fenced off.
		if err := store.Commit(t.Context(), db.Pool, "orders", 0, 3, 3); !errors.Is(err, checkpoint.ErrFenced) {
			t.Errorf("commit at the old epoch: %v", err)
		}
		// Back to the start: re-delivers everything.
		if r = annals(t, db.URL, "checkpoint", "set", "orders", "0", "--partition", "2", "--yes"); r.code != 0 || r.stdout != "orders/2: position 2 → 0, epoch 1 → 2\n" {
			t.Fatalf("set --partition 2: %+v", r)
		}
		if r = annals(t, db.URL, "checkpoint", "set", "fresh", "3", "--create", "--yes"); r.code != 0 || r.stdout != "fresh/0: created at position 3, epoch 1\n" {
			t.Fatalf("set --create: %+v", r)
		}
		// A partition the subscriber's recorded layout does not have would
		// never be led: refused.
		sqlExec(t, db, `INSERT INTO annals.subscriber_layouts (subscriber_id, partitions, partition_by) VALUES ('laid', 2, 'stream')`)
		if r = annals(t, db.URL, "checkpoint", "set", "laid", "1", "--partition", "5", "--create", "--yes"); r.code != ExitUsage || !strings.Contains(r.stderr, "runs with 2 partitions (0-1)") {
			t.Errorf("set --create of a partition outside the layout: %+v", r)
		}
		if r = annals(t, db.URL, "checkpoint", "set", "laid", "1", "--partition", "1", "--create", "--yes"); r.code != 0 {
			t.Errorf("set --create of a partition of the layout: %+v", r)
		}
	})

	t.Run("Prompt", func(t *testing.T) {
		before := load(t, 0)
		for _, answer := range []string{"n\n", "\n", "", "yes please\n"} {
			r := annalsIn(t, db.URL, ttyReader{strings.NewReader(answer)}, "checkpoint", "set", "orders", "1")
			if r.code != 1 || !strings.Contains(r.stderr, "About to move orders/0 back from 3 to 1") || !strings.Contains(r.stderr, "[y/N]") ||
				!strings.Contains(r.stderr, "not confirmed") {
				t.Errorf("answer %q: %+v", answer, r)
			}
		}
		if c := load(t, 0); c.Position != before.Position || c.Epoch != before.Epoch || !c.UpdatedAt.Equal(before.UpdatedAt) {
			t.Fatalf("declined set changed the checkpoint: %+v, was %+v", c, before)
		}
		r := annalsIn(t, db.URL, ttyReader{strings.NewReader("Y\n")}, "checkpoint", "set", "orders", "1")
		if r.code != 0 || r.stdout != "orders/0: position 3 → 1, epoch 4 → 5\n" {
			t.Fatalf("confirmed set: %+v", r)
		}
	})
}

// A stopped subscriber and its dead letters show in status.
func TestStatusShowsStoppedAndDeadLetters(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := context.Background()
	if r := annals(t, db.URL, "append", "s-1", "t", `{}`); r.code != 0 {
		t.Fatalf("append: %+v", r)
	}
	_, err := db.Pool.Exec(ctx, `
		INSERT INTO annals.checkpoints (subscriber_id, partition, position, epoch, stopped_reason, stopped_at)
		VALUES ('mailer', 0, 1, 1, 'event x failed: smtp down', now()), ('fine', 0, 1, 1, NULL, NULL);
		INSERT INTO annals.dead_letters (subscriber_id, partition, event_id, global_sequence, stream_id, event_type, reason, error)
		VALUES ('mailer', 0, gen_random_uuid(), 1, 's-1', 't', 'failed', 'smtp down'),
		       ('mailer', 0, gen_random_uuid(), 1, 's-1', 't', 'parked', 'parked'),
		       ('fine', 0, gen_random_uuid(), 1, 's-1', 't', 'failed', 'old')`)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `UPDATE annals.dead_letters SET status = 'resolved' WHERE subscriber_id = 'fine'`); err != nil {
		t.Fatal(err)
	}
	r := annals(t, db.URL, "status")
	if r.code != 0 || !strings.Contains(r.stdout, "STOPPED mailer/0 since ") || !strings.Contains(r.stdout, ": event x failed: smtp down") ||
		!strings.Contains(r.stdout, "mailer/0 has 2 unresolved dead letters") || strings.Contains(r.stdout, "fine/0 has") || strings.Contains(r.stdout, "STOPPED fine") {
		t.Fatalf("status:\n%s", r.stdout)
	}
	r = annals(t, db.URL, "status", "--output", "json")
	var st StatusJSON
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatal(err)
	}
	for _, s := range st.Subscribers {
		switch s.Subscriber {
		case "mailer":
			if s.StoppedReason == nil || s.StoppedAt == nil || s.DeadLetters != 2 {
				t.Fatalf("mailer: %+v", s)
			}
		case "fine":
			if s.StoppedReason != nil || s.DeadLetters != 0 {
				t.Fatalf("fine: %+v", s)
			}
		}
	}
}

// status --help lists every key of its --output json.
func TestStatusHelpListsJSONKeys(t *testing.T) {
	t.Parallel()
	r := annals(t, "", "status", "--help")
	if r.code != 0 {
		t.Fatalf("status --help: %+v", r)
	}
	for _, v := range []any{StatusJSON{}, SubscriberStatus{}, GenerationStatus{}, InstanceStatus{}, LeadStatus{}, walsource.SlotStatus{}} {
		typ := reflect.TypeOf(v)
		for i := range typ.NumField() {
			key, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
			if key != "" && key != "-" && !strings.Contains(r.stdout, `"`+key+`"`) {
				t.Errorf("status --help does not list the key %q of %s", key, typ.Name())
			}
		}
	}
}

// checkpoint set's help does not promise a rebuild: set moves the checkpoint
// alone, and a projection moved back applies the events again to its read
// model as it is. It names the command that does rebuild one.
func TestCheckpointSetHelpSaysItIsNoRebuild(t *testing.T) {
	t.Parallel()
	r := annals(t, "", "checkpoint", "set", "--help")
	if r.code != 0 || strings.Contains(r.stdout, "rebuild from the beginning") ||
		!strings.Contains(r.stdout, "does not clear a projection's read model") ||
		!strings.Contains(r.stdout, "projections rebuild") || !strings.Contains(r.stdout, "# process everything again") {
		t.Fatalf("checkpoint set --help: %+v", r)
	}
}

// A replication slot being created (PostgreSQL waits for the transactions
// open when the creation began) shows as creating, not as streaming.
func TestStatusSlotBeingCreated(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	const slot = "annals_status_creating"
	open, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = open.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := open.Exec(ctx, `SELECT pg_current_xact_id()`); err != nil {
		t.Fatal(err)
	}
	created := make(chan error, 1)
	go func() {
		_, err := db.Pool.Exec(context.WithoutCancel(ctx), `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot)
		created <- err
	}()
	t.Cleanup(func() {
		_, _ = db.Pool.Exec(context.Background(), `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1 AND NOT active`, slot)
	})
	annalstest.WaitFor(t, 20*time.Second, func() bool {
		r := annals(t, db.URL, "status")
		return r.code == 0 && strings.Contains(r.stdout, slot) && strings.Contains(r.stdout, "creating (pid ")
	})
	if r := annals(t, db.URL, "status"); strings.Contains(r.stdout, "streaming (pid") {
		t.Fatalf("a slot being created shows as streaming:\n%s", r.stdout)
	}
	if err := open.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-created; err != nil {
		t.Fatal(err)
	}
	annalstest.WaitFor(t, 20*time.Second, func() bool {
		r := annals(t, db.URL, "status")
		return r.code == 0 && strings.Contains(r.stdout, slot) && strings.Contains(r.stdout, "inactive (retaining WAL)")
	})
}
