package relay_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/relay"
)

// startWithUsers runs a NATS server with JetStream and two users: "admin",
// who may do anything, and "relay", who may not publish to deny.
func startWithUsers(t *testing.T, deny ...string) *server.Server {
	t.Helper()
	ns, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: t.TempDir(),
		NoLog: true, NoSigs: true,
		Users: []*server.User{
			{Username: "admin", Password: "admin"},
			{Username: "relay", Password: "relay", Permissions: &server.Permissions{
				Publish: &server.SubjectPermission{Allow: []string{">"}, Deny: deny},
			}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("NATS server not ready within 10s")
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	return ns
}

func connectAs(t *testing.T, ns *server.Server, user string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(ns.ClientURL(), nats.UserInfo(user, user), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// A NATS user that may not publish to the relay's subjects gets no answer:
// the server drops the message and tells the connection only. The relay's
// failure says so (ErrNotPermitted, with the server's words), not only that
// no acknowledgement came, and nothing unacknowledged is checkpointed.
func TestRelayNamesAPublishTheUserMayNotMake(t *testing.T) {
	t.Parallel()
	ns := startWithUsers(t, "annals.>")
	db := annalstest.NewDB(t, nil)
	store, err := eventstore.New(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	r, err := relay.New(db.Pool, connectAs(t, ns, "relay"), &relay.Config{AckTimeout: 300 * time.Millisecond, RetryBackoff: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	appendMany(t, store, 3)
	err = r.CatchUp(ctx)
	if !errors.Is(err, relay.ErrNotPermitted) || !strings.Contains(err.Error(), `Permissions Violation for Publish to "annals.`) {
		t.Fatalf("CatchUp by a user that may not publish = %v, want ErrNotPermitted with the server's words", err)
	}
	b := &bundle{t: t, db: db, store: store}
	if cp := b.checkpoint("relay"); cp != 0 {
		t.Fatalf("checkpoint %d after no publish was acknowledged", cp)
	}

	// The same relay with a user that may publish goes on from there.
	r, err = relay.New(db.Pool, connectAs(t, ns, "admin"), &relay.Config{AckTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.CatchUp(ctx); err != nil {
		t.Fatalf("CatchUp once the user may publish: %v", err)
	}
	if cp, head := b.checkpoint("relay"), int64(len(b.log())); cp != head {
		t.Fatalf("checkpoint %d, head %d after CatchUp", cp, head)
	}
}

// Only a refusal that names one of the relay's subjects (or JetStream's
// reply inbox) is taken for the cause: the connection's last error may be
// an older refusal of something else the application published on it.
func TestPermissionViolationNamesTheSubject(t *testing.T) {
	t.Parallel()
	ns := startWithUsers(t, "annals.>", "other.>", "q.>")
	nc := connectAs(t, ns, "relay")
	if got := relay.PermissionViolation(nc, "annals.*.*"); got != nil {
		t.Fatalf("before any refusal: %v", got)
	}
	refuse := func(subject, shown string) {
		t.Helper()
		if err := nc.Publish(subject, []byte("x")); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for last := nc.LastError(); last == nil || !strings.Contains(last.Error(), shown); last = nc.LastError() {
			if time.Now().After(deadline) {
				t.Fatalf("no refusal of %s reported within 10s: %v", subject, last)
			}
			if err := nc.Flush(); err != nil {
				t.Fatal(err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	refuse("other.x", `"other.x"`)
	for filter, want := range map[string]bool{"annals.*.*": false, "other.*": true, "other.>": true, "other": false, "other.*.*": false} {
		if got := relay.PermissionViolation(nc, filter); (got != nil) != want {
			t.Errorf("refusal of other.x, filter %s: %v, want a match %v", filter, got, want)
		}
	}
	// A subject that nats-server quotes with an escape.
	refuse(`q.a"b`, `"q.a\"b"`)
	if got := relay.PermissionViolation(nc, "q.*"); got == nil {
		t.Errorf(`the refusal of q.a"b is not taken for q.*: %v`, nc.LastError())
	}
}
