package relay_test

import (
	"context"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/migrations"
	"github.com/annals-dev/annals/relay"
)

// Relays of two logs (two databases, or two schemas of one) with the
// default name, pointed at one stream: the second is refused. It passed the
// name check, took the other log's newest position as published, and
// skipped its own events at or below it, silently.
func TestRelaysOfTwoLogsOnOneStream(t *testing.T) {
	t.Parallel()
	b := setup(t) // database A, with 3 events
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	appendMany(t, b.store, 3)
	a, err := relay.New(b.db.Pool, b.nc, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	s, err := b.js.Stream(ctx, "ANNALS")
	if err != nil {
		t.Fatal(err)
	}
	if md := s.CachedInfo().Config.Metadata; md[relay.MetadataRelay] != "relay" || !strings.Contains(md[relay.MetadataOrigin], "/"+b.db.Name+"/annals") {
		t.Fatalf("the stream's metadata %v does not name the relay and its origin", md)
	}
	msgs := b.relayed("ANNALS")
	origin := msgs[0].Header.Get(relay.HeaderOrigin)
	if !strings.HasSuffix(origin, "/"+b.db.Name+"/annals") || strings.HasPrefix(origin, "0/") {
		t.Fatalf("Annals-Origin %q", origin)
	}

	// Database B, with more events than A: the position check alone would
	// pass.
	dbB := annalstest.NewDB(t, nil)
	storeB, err := eventstore.New(dbB.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	appendMany(t, storeB, 5)
	// A schema of A's database, with fewer events.
	if _, err := migrations.Up(ctx, b.db.Pool, &migrations.Config{Schema: "second"}); err != nil {
		t.Fatal(err)
	}
	storeS, err := eventstore.New(b.db.Pool, &eventstore.Config{Schema: "second"})
	if err != nil {
		t.Fatal(err)
	}
	appendMany(t, storeS, 2)
	for _, c := range []struct {
		what string
		db   *annalstest.DB
		cfg  relay.Config
	}{
		{"another database", dbB, relay.Config{}},
		{"another schema", b.db, relay.Config{Schema: "second"}},
	} {
		r, err := relay.New(c.db.Pool, b.nc, &c.cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.CatchUp(ctx); !errors.Is(err, relay.ErrStreamMismatch) {
			t.Errorf("a relay of %s on the stream: %v, want ErrStreamMismatch", c.what, err)
		}
	}
	checkExactlyOnce(t, b.relayed("ANNALS"), b.log())

	// An empty stream made by A's relay is refused by its metadata.
	empty, err := relay.New(b.db.Pool, b.nc, &relay.Config{Stream: "EMPTY", Prefix: "e"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := empty.EnsureStream(ctx); err != nil {
		t.Fatal(err)
	}
	other, err := relay.New(dbB.Pool, b.nc, &relay.Config{Stream: "EMPTY", Prefix: "e"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.EnsureStream(ctx); !errors.Is(err, relay.ErrStreamMismatch) || !strings.Contains(err.Error(), "adopt") {
		t.Fatalf("B's relay on an empty stream A's relay made: %v, want ErrStreamMismatch", err)
	}
	// Unless B adopts it (this database took over A's log): then it is
	// B's, and stays B's without adopting again.
	adopt, err := relay.New(dbB.Pool, b.nc, &relay.Config{Stream: "EMPTY", Prefix: "e", AdoptStream: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := adopt.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := other.EnsureStream(ctx); err != nil {
		t.Fatalf("B's relay on the stream it adopted: %v", err)
	}
	if _, err := empty.EnsureStream(ctx); !errors.Is(err, relay.ErrStreamMismatch) {
		t.Fatalf("A's relay on the stream B adopted: %v, want ErrStreamMismatch", err)
	}
}

// Messages published by relays older than Annals-Origin carry none: the
// relay takes such a newest message as its own when its position is within
// the log's head (with a warning), and refuses it when it is above (another
// log's).
func TestRelayOnAStreamOfAnOlderRelay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	appendMany(t, b.store, 5)
	log := b.log()
	// An older relay published events 1 to 3, as it did: no origin, no
	// metadata on the stream.
	var logs annalstest.LogBuffer
	r, err := relay.New(b.db.Pool, b.nc, &relay.Config{Stream: "OLD", Prefix: "old", Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.js.CreateStream(ctx, r.StreamConfig()); err != nil {
		t.Fatal(err)
	}
	publishOld := func(stream string, events []eventstore.Event) {
		t.Helper()
		prev := ""
		for _, e := range events {
			m, err := relay.Message("relay", strings.ToLower(stream)+"."+relay.EscapeToken(e.Type)+"."+relay.EscapeToken(e.StreamID), e)
			if err != nil {
				t.Fatal(err)
			}
			opts := []jetstream.PublishOpt{jetstream.WithMsgID(e.ID.String())}
			if prev != "" {
				opts = append(opts, jetstream.WithExpectLastMsgID(prev))
			}
			if _, err := b.js.PublishMsg(ctx, m, opts...); err != nil {
				t.Fatal(err)
			}
			prev = e.ID.String()
		}
	}
	publishOld("OLD", log[:3])
	if err := r.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	checkExactlyOnce(t, b.relayed("OLD"), log)
	// Its event ID is that of this log's event at its position: no doubt,
	// no warning.
	if strings.Contains(logs.String(), "not marked as this log's") {
		t.Fatalf("a warning about a message whose event this log holds:\n%s", logs.String())
	}

	// Another log's messages, positions 1 to 5, on a stream of a relay
	// whose log has 2 events: refused.
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
	publishOld("FOREIGN", log)
	if err := r2.CatchUp(ctx); !errors.Is(err, relay.ErrStreamMismatch) || !strings.Contains(err.Error(), "past this log's head (2)") {
		t.Fatalf("a relay on a stream of another log's older relay: %v, want ErrStreamMismatch", err)
	}
	// Once that log has grown past the newest message's position, the
	// event ID tells: refused still. The position check alone passed, and
	// the relay skipped its own events 1 to 5.
	appendMany(t, store2, 4)
	if err := r2.CatchUp(ctx); !errors.Is(err, relay.ErrStreamMismatch) || !strings.Contains(err.Error(), "this log's event there is") {
		t.Fatalf("a relay whose log is longer, on a stream of another log's older relay: %v, want ErrStreamMismatch", err)
	}
}

// The newest message's event ID is checked against this log's event at
// its position, whatever its origin says: a database that lost its newest
// events (an asynchronous failover) and appended others at their positions
// refuses a stream holding the lost ones. Where this log holds no event at
// that position (scavenged by retention), the origin alone tells: a message
// without one is taken as this log's, with a warning.
func TestRelayChecksTheNewestMessagesEvent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	appendMany(t, b.store, 3)
	var logs annalstest.LogBuffer
	r, err := relay.New(b.db.Pool, b.nc, &relay.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	s, err := r.EnsureStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	log := b.log()
	publish := func(e eventstore.Event, origin string) {
		t.Helper()
		m, err := relay.Message("relay", "annals."+relay.EscapeToken(e.Type)+"."+relay.EscapeToken(e.StreamID), e)
		if err != nil {
			t.Fatal(err)
		}
		if origin != "" {
			m.Header.Set(relay.HeaderOrigin, origin)
		}
		if _, err := b.js.PublishMsg(ctx, m, jetstream.WithMsgID(e.ID.String())); err != nil {
			t.Fatal(err)
		}
	}
	// Event 2 as published before a failover lost it: same position and
	// origin, another event.
	lost := log[1]
	lost.ID = uuid.New()
	origin := ""
	if err := b.db.Pool.QueryRow(ctx, `SELECT (SELECT system_identifier::text FROM pg_control_system()) || '/' || current_database() || '/annals'`).Scan(&origin); err != nil {
		t.Fatal(err)
	}
	publish(lost, origin)
	if err := r.CatchUp(ctx); !errors.Is(err, relay.ErrStreamMismatch) || !strings.Contains(err.Error(), "this log's event there is "+log[1].ID.String()) {
		t.Fatalf("a stream whose newest message is not this log's event at its position: %v, want ErrStreamMismatch", err)
	}

	// A position this log holds no event at (here a gap in the sequence;
	// retention scavenges alike): the origin decides.
	if _, err := b.db.Pool.Exec(ctx, `SELECT setval('annals.events_global_sequence', 10)`); err != nil {
		t.Fatal(err)
	}
	appendMany(t, b.store, 1) // position 11
	gone := log[0]
	gone.ID, gone.GlobalSequence = uuid.New(), 7
	publish(gone, "")
	if err := r.CatchUp(ctx); err != nil {
		t.Fatalf("a stream whose newest message has no origin, at a position without an event: %v", err)
	}
	if !strings.Contains(logs.String(), "not marked as this log's") {
		t.Fatalf("no warning about the message without an origin:\n%s", logs.String())
	}
	if info, err := s.Info(ctx); err != nil || info.State.Msgs != 3 {
		t.Fatalf("the stream: %v, %v; want the two messages and event 11", info, err)
	}
}

// A role that may not run pg_control_system reads the origin's cluster as
// "0", which matches any cluster of the same database and schema: the
// relay moved to such a role, and back, goes on with the stream. It was
// refused as another log's.
func TestRelayOriginWithoutTheClusterMatches(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	appendMany(t, b.store, 3)
	full, err := relay.New(b.db.Pool, b.nc, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := full.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := b.db.Pool.Exec(ctx, `REVOKE EXECUTE ON FUNCTION pg_catalog.pg_control_system() FROM PUBLIC`); err != nil {
		t.Fatal(err)
	}
	pool := runnerPool(t, b)
	lesser, err := relay.New(pool, b.nc, nil)
	if err != nil {
		t.Fatal(err)
	}
	appendMany(t, b.store, 2)
	if err := lesser.CatchUp(ctx); err != nil {
		t.Fatalf("the relay on a role without pg_control_system: %v", err)
	}
	msgs := b.relayed("ANNALS")
	if o := msgs[len(msgs)-1].Header.Get(relay.HeaderOrigin); !strings.HasPrefix(o, "0/") {
		t.Fatalf("Annals-Origin %q, want the cluster part 0", o)
	}
	appendMany(t, b.store, 1)
	if err := full.CatchUp(ctx); err != nil {
		t.Fatalf("the relay back on its first role: %v", err)
	}
	checkExactlyOnce(t, b.relayed("ANNALS"), b.log())
}

// runnerPool returns a pool on b's database as a new role with the rights
// of a runner (annals grant runner), and no membership in the owner.
func runnerPool(t *testing.T, b *bundle) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	role := "runner_" + strings.TrimPrefix(b.db.Name, "annalstest_")
	if _, err := b.db.Pool.Exec(ctx, "CREATE ROLE "+pgx.Identifier{role}.Sanitize()+" LOGIN"); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Grant(ctx, b.db.Pool, role, migrations.Runner, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // after the pool below is closed
		for _, q := range []string{"DROP OWNED BY ", "DROP ROLE "} {
			if _, err := b.db.Pool.Exec(context.Background(), q+pgx.Identifier{role}.Sanitize()); err != nil {
				t.Error(err)
			}
		}
	})
	u, err := url.Parse(b.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	pool, err := pgxpool.New(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Relays of two logs (two databases, the default name and stream) on a
// stream made beforehand, empty and without the relay's metadata: both find
// it empty, and only one gets in; the other's first publish is refused, and
// the relay then refuses the stream (ErrStreamMismatch). Both got in: the
// first message into an empty stream was sent with no expectation, and the
// stream held both logs' events.
func TestTwoRelaysOnAnEmptyStreamMadeBeforehand(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	dbB := annalstest.NewDB(t, nil)
	storeB, err := eventstore.New(dbB.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	appendMany(t, b.store, 5)
	appendMany(t, storeB, 5)
	var logs annalstest.LogBuffer
	cfg := &relay.Config{RetryBackoff: 20 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	defer func() {
		if t.Failed() {
			t.Logf("the relays' log:\n%s", logs.String())
		}
	}()
	var relays [2]*relay.Relay
	// Both leaderships read the empty stream before either publishes.
	var started sync.WaitGroup
	started.Add(2)
	for i, pool := range []*pgxpool.Pool{b.db.Pool, dbB.Pool} {
		if relays[i], err = relay.New(pool, b.nc, cfg); err != nil {
			t.Fatal(err)
		}
		var once sync.Once
		relay.SetOnStarted(relays[i], func() { once.Do(func() { started.Done(); started.Wait() }) })
	}
	sc := relays[0].StreamConfig()
	if _, err := b.js.CreateStream(ctx, sc); err != nil {
		t.Fatal(err)
	}
	type result struct {
		i   int
		err error
	}
	results := make(chan result, 2)
	var cancels [2]context.CancelFunc
	for i, r := range relays {
		rctx, cancel := context.WithCancel(ctx)
		cancels[i] = cancel
		defer cancel()
		go func() { results <- result{i, r.CatchUp(rctx)} }()
	}
	// The loser's run ends (its checkpoint short of its head) or is ended
	// once the winner's has.
	winner := -1
	var errs [2]error
	for range 2 {
		r := <-results
		errs[r.i] = r.err
		if r.err == nil {
			winner = r.i
			cancels[1-r.i]()
		}
	}
	if winner < 0 || errs[1-winner] == nil {
		t.Fatalf("the relays' runs: %v; want one to publish its log and the other not", errs)
	}
	loser := 1 - winner
	msgs := b.relayed("ANNALS")
	origin := msgs[0].Header.Get(relay.HeaderOrigin)
	for _, m := range msgs {
		if o := m.Header.Get(relay.HeaderOrigin); o != origin {
			t.Fatalf("the stream holds events of %s and of %s", origin, o)
		}
	}
	want := b.log()
	if winner == 1 {
		want = nil
		for e, err := range storeB.ReadAll(ctx, 0) {
			if err != nil {
				t.Fatal(err)
			}
			want = append(want, e)
		}
	}
	checkExactlyOnce(t, msgs, want)
	if err := relays[loser].CatchUp(ctx); !errors.Is(err, relay.ErrStreamMismatch) {
		t.Fatalf("the other relay on the stream: %v, want ErrStreamMismatch", err)
	}
}
