package projectioncmd

import (
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/internal/lockkey"
	"github.com/annals-dev/annals/projection"
)

// TestLeaderByTheStatusRule: list and status name a partition's leader as
// `annals status` does. After an operator's checkpoint set (no owner, a
// new epoch) the live instance whose heartbeat lists the partition leads
// while its session holds the lock (they said "unknown (pid N)"); after a
// takeover the new owner leads, not the heartbeat that still lists it;
// once the lock is free, nobody leads, whatever the heartbeat says.
func TestLeaderByTheStatusRule(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	if _, err := b.db.Pool.Exec(ctx, `
		INSERT INTO annals.checkpoints (subscriber_id, partition, position, epoch, owner) VALUES
			('balances', 0, 0, 7, NULL), ('sharded', 0, 0, 4, 'b'), ('sharded', 1, 0, 3, 'a');
		INSERT INTO annals.instances (instance_id, host, pid, last_heartbeat, leads) VALUES
			('a', 'vm', 1, now(), '[{"subscriber": "balances", "partition": 0, "epoch": 6},
			                        {"subscriber": "sharded", "partition": 0, "epoch": 3},
			                        {"subscriber": "sharded", "partition": 1, "epoch": 3}]')`); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, b.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(ctx) })
	for _, sp := range []struct {
		sub  string
		part int
	}{{"balances", 0}, {"sharded", 0}, {"sharded", 1}} {
		k1, k2 := lockkey.Pair(catchup.LockKey(b.runner.Schema(), sp.sub, sp.part))
		if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1::int4, $2::int4)", k1, k2); err != nil {
			t.Fatal(err)
		}
	}
	leaders := func() map[string]string {
		t.Helper()
		r := b.execute(t, false, "", "status", "--output", "json")
		if r.err != nil {
			t.Fatal(r.err)
		}
		var st statusOutput
		if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
			t.Fatalf("%v in %q", err, r.stdout)
		}
		out := map[string]string{}
		for _, p := range st.Partitions {
			out[p.Subscriber+"/"+strconv.Itoa(p.Partition)] = p.Leader
		}
		return out
	}
	if l := leaders(); l["balances/0"] != "a" || l["sharded/0"] != "b" || l["sharded/1"] != "a" || l["mailer/0"] != "none" {
		t.Errorf("leaders with the locks held: %v", l)
	}
	r := b.execute(t, false, "", "list")
	if r.err != nil || strings.Join(fields(lineOf(t, r.stdout, "sharded")), " ") != "sharded projection - 2 0 0 0 b,a" {
		t.Errorf("list: %v\n%s", r.err, r.stdout)
	}

	// kill -9 of the process holding the locks: its heartbeat stays fresh.
	var ok bool
	if err := b.db.Pool.QueryRow(ctx, "SELECT pg_terminate_backend($1::int, 10000)", conn.PgConn().PID()).Scan(&ok); err != nil || !ok {
		t.Fatalf("terminate the lock session: %v %v", ok, err)
	}
	if l := leaders(); l["balances/0"] != "none" || l["sharded/0"] != "none" || l["sharded/1"] != "none" {
		t.Errorf("leaders with the locks free: %v", l)
	}
}

// TestStaleAfterFollowsTheHeartbeat: an instance whose heartbeat is 45 s
// old, holding the lock of a partition its heartbeat lists, is stale at
// the default of three heartbeats of a runner beating every 10 s (its
// leader unknown by the heartbeat), and leads with --stale-after 1m or
// under a runner beating every 20 s (they judged it by a fixed 30 s, so a
// service that beats less often saw its leaders as unknown).
func TestStaleAfterFollowsTheHeartbeat(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	if _, err := b.db.Pool.Exec(ctx, `
		INSERT INTO annals.checkpoints (subscriber_id, partition, position, epoch, owner) VALUES ('balances', 0, 0, 7, NULL);
		INSERT INTO annals.instances (instance_id, host, pid, last_heartbeat, leads) VALUES
			('a', 'vm', 1, now() - interval '45 seconds', '[{"subscriber": "balances", "partition": 0, "epoch": 6}]')`); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, b.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(ctx) })
	k1, k2 := lockkey.Pair(catchup.LockKey(b.runner.Schema(), "balances", 0))
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1::int4, $2::int4)", k1, k2); err != nil {
		t.Fatal(err)
	}
	leader := func(b *bundle, args ...string) string {
		t.Helper()
		r := b.execute(t, false, "", append([]string{"status", "balances", "--output", "json"}, args...)...)
		if r.err != nil {
			t.Fatal(r.err)
		}
		var st statusOutput
		if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || len(st.Partitions) != 1 {
			t.Fatalf("%v in %q", err, r.stdout)
		}
		return st.Partitions[0].Leader
	}
	unknown := "unknown (pid " + strconv.Itoa(int(conn.PgConn().PID())) + ")"
	if l := leader(b); l != unknown {
		t.Errorf("at the default (3 heartbeats of 10 s): leader %q, want %q", l, unknown)
	}
	if l := leader(b, "--stale-after", "1m"); l != "a" {
		t.Errorf("with --stale-after 1m: leader %q, want a", l)
	}
	r := b.execute(t, false, "", "list", "--stale-after", "1m")
	if r.err != nil || fields(lineOf(t, r.stdout, "balances"))[7] != "a" {
		t.Errorf("list --stale-after 1m: %v\n%s", r.err, r.stdout)
	}
	if r := b.execute(t, false, "", "status", "--stale-after", "-1s"); !errors.Is(r.err, ErrUsage) {
		t.Errorf("--stale-after -1s: %v, want ErrUsage", r.err)
	}
	slow, err := projection.NewRunner(b.db.Pool, &projection.Config{InstanceID: "inst-slow", HeartbeatInterval: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := slow.Register(counting{"balances"}, nil); err != nil {
		t.Fatal(err)
	}
	if l := leader(&bundle{db: b.db, store: b.store, runner: slow}); l != "a" {
		t.Errorf("under a runner beating every 20 s: leader %q, want a", l)
	}
}

// sagaLike is a projection that says it is a saga, as package saga's
// adapter does.
type sagaLike struct{ counting }

func (sagaLike) SubscriberKind() string { return "saga" }

// TestSagaIsListedAndNeverRebuilt: a saga shows as one in list, and rebuild
// refuses it as a saga (projection.ErrSaga), even when its handler could
// reset: its effects are in the log. It showed as "projection (no reset)"
// and rebuild advised implementing a Resetter, against docs/sagas.md.
func TestSagaIsListedAndNeverRebuilt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if err := b.runner.Register(sagaLike{counting{"deadline"}}, nil); err != nil {
		t.Fatal(err)
	}
	r := b.execute(t, false, "", "list")
	if r.err != nil || fields(lineOf(t, r.stdout, "deadline"))[1] != "saga" {
		t.Errorf("list: %v\n%s", r.err, r.stdout)
	}
	r = b.execute(t, false, "", "rebuild", "deadline", "--yes")
	if !errors.Is(r.err, projection.ErrSaga) || !errors.Is(r.err, ErrUsage) {
		t.Errorf("rebuild of a saga: %v; want ErrSaga, a usage error", r.err)
	}
	if err := b.runner.Rebuild(t.Context(), "deadline", nil); !errors.Is(err, projection.ErrSaga) {
		t.Errorf("Runner.Rebuild of a saga: %v; want ErrSaga", err)
	}
}
