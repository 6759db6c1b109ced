package projection_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/deadletter"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

// Joined is at schema version 3: v1 {"name"} → v2 {"full_name"} → v3 adds
// {"tier"}.
type Joined struct {
	FullName string `json:"full_name"`
	Tier     string `json:"tier"`
}

// upcastRegistry registers Joined and its upcasters; the 2→3 upcaster fails
// for "Bad" while broken is set.
func upcastRegistry(broken *atomic.Bool) *eventstore.Registry {
	reg := eventstore.NewRegistry()
	eventstore.MustRegister[Joined](reg, "member.joined")
	reg.MustRegisterUpcaster("member.joined", 1, func(d json.RawMessage) (json.RawMessage, error) {
		var v1 struct {
			Name string `json:"name"`
		}
		if err := json.Unmarshal(d, &v1); err != nil {
			return nil, err
		}
		return json.Marshal(map[string]string{"full_name": v1.Name})
	})
	reg.MustRegisterUpcaster("member.joined", 2, func(d json.RawMessage) (json.RawMessage, error) {
		var m map[string]any
		if err := json.Unmarshal(d, &m); err != nil {
			return nil, err
		}
		if broken.Load() && m["full_name"] == "Bad" {
			return nil, errors.New("the 2→3 upcaster is broken")
		}
		if _, ok := m["tier"]; !ok {
			m["tier"] = "basic"
		}
		return json.Marshal(m)
	})
	return reg
}

// rawProjection records each event's data and schema version as it gets them.
type rawProjection struct{}

func (rawProjection) Name() string { return "raw-proj" }
func (rawProjection) Handle(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	v, err := e.Metadata.SchemaVersion()
	if err != nil {
		return err
	}
	var j Joined
	if err := json.Unmarshal(e.Data, &j); err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `INSERT INTO seen VALUES ('raw-proj', $1, $2, $3, $4)`, e.StreamID, j.FullName, j.Tier, v)
	return err
}

// rawObserver does the same in memory.
type rawObserver struct {
	mu   sync.Mutex
	seen map[string]string
}

func (*rawObserver) Name() string { return "raw-obs" }
func (o *rawObserver) Handle(_ context.Context, e eventstore.Event) error {
	v, err := e.Metadata.SchemaVersion()
	if err != nil {
		return err
	}
	var j Joined
	if err := json.Unmarshal(e.Data, &j); err != nil {
		return err
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.seen[e.StreamID] = j.FullName + "/" + j.Tier + "/v" + string(rune('0'+v))
	return nil
}

func (o *rawObserver) get() map[string]string {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := map[string]string{}
	for k, v := range o.seen {
		out[k] = v
	}
	return out
}

// TestRunnerUpcasts: events stored at v1 reach untyped projections and
// observers, and typed projections, in their v3 shape; a failing upcaster
// is a handler failure (dead-lettered), and the re-delivered dead letter is
// upcast too.
func TestRunnerUpcasts(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db := annalstest.NewDB(t, nil)
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE seen (sub text, stream text, name text, tier text, version int, PRIMARY KEY (sub, stream))`); err != nil {
		t.Fatal(err)
	}
	var broken atomic.Bool
	reg := upcastRegistry(&broken)
	store, err := eventstore.New(db.Pool, &eventstore.Config{Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	old, err := eventstore.New(db.Pool, nil) // an old producer: v1, no version stamp
	if err != nil {
		t.Fatal(err)
	}
	if _, err := old.Append(ctx, "m-ada", eventstore.NoStream, eventstore.EventData{Type: "member.joined", Data: []byte(`{"name":"Ada"}`)}); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Append(ctx, "m-cy", eventstore.NoStream, eventstore.NewEvent(Joined{FullName: "Cy", Tier: "gold"})); err != nil {
		t.Fatal(err)
	}

	typed := projection.New("typed-proj", reg)
	projection.On(typed, func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[Joined]) error {
		v, err := e.Metadata.SchemaVersion()
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO seen VALUES ('typed-proj', $1, $2, $3, $4)`, e.StreamID, e.Data.FullName, e.Data.Tier, v)
		return err
	})
	obs := &rawObserver{seen: map[string]string{}}
	r, err := projection.NewRunner(db.Pool, &projection.Config{
		Registry:          reg,
		Retry:             &projection.RetryPolicy{MaxRetries: -1},
		LockRetryInterval: 50 * time.Millisecond,
		RetryBackoff:      20 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []any{rawProjection{}, typed, obs} {
		if err := r.Register(h, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.RunUntilCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	check := func(stream, want string) {
		t.Helper()
		for _, sub := range []string{"raw-proj", "typed-proj"} {
			var name, tier string
			var v int
			err := db.Pool.QueryRow(ctx, `SELECT name, tier, version FROM seen WHERE sub = $1 AND stream = $2`, sub, stream).Scan(&name, &tier, &v)
			if got := name + "/" + tier + "/v" + string(rune('0'+v)); err != nil || got != want {
				t.Errorf("%s saw %s as %q (%v), want %q", sub, stream, got, err, want)
			}
		}
		if got := obs.get()[stream]; got != want {
			t.Errorf("raw-obs saw %s as %q, want %q", stream, got, want)
		}
	}
	check("m-ada", "Ada/basic/v3")
	check("m-cy", "Cy/gold/v3")

	// A failing upcaster fails the attempt: the event is dead-lettered for
	// every subscriber, with the upcaster's error; nothing crashes.
	broken.Store(true)
	if _, err := old.Append(ctx, "m-bad", eventstore.NoStream, eventstore.EventData{Type: "member.joined", Data: []byte(`{"name":"Bad"}`)}); err != nil {
		t.Fatal(err)
	}
	if err := r.RunUntilCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	rows, err := db.Pool.Query(ctx, `SELECT subscriber_id, error FROM annals.dead_letters WHERE stream_id = 'm-bad' ORDER BY subscriber_id`)
	if err != nil {
		t.Fatal(err)
	}
	var subs []string
	for rows.Next() {
		var sub, msg string
		if err := rows.Scan(&sub, &msg); err != nil {
			t.Fatal(err)
		}
		subs = append(subs, sub)
		if !strings.Contains(msg, "broken") || !strings.Contains(msg, "upcast") {
			t.Errorf("%s: dead letter error %q does not say the upcast failed", sub, msg)
		}
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	if strings.Join(subs, ",") != "raw-obs,raw-proj,typed-proj" {
		t.Fatalf("dead letters for %v, want one per subscriber", subs)
	}

	// Fixed: the re-delivered dead letters are upcast like live events.
	broken.Store(false)
	dl, err := deadletter.New(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, sub := range subs {
		if _, err := dl.RetryAll(ctx, sub); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.RunUntilCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	check("m-bad", "Bad/basic/v3")
	var open int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM annals.dead_letters WHERE status <> 'resolved'`).Scan(&open); err != nil || open != 0 {
		t.Fatalf("%d dead letters unresolved (%v)", open, err)
	}
}
