package projection_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

// kindCounter counts the events it handles, as an observer (Handle without
// a transaction) or, wrapped in kindedProjection, a projection; kind, when
// set, is its SubscriberKind.
type kindCounter struct {
	name, kind string
	n          *atomic.Int64
}

func (c kindCounter) Name() string { return c.name }
func (c kindCounter) Handle(context.Context, eventstore.Event) error {
	c.n.Add(1)
	return nil
}
func (c kindCounter) SubscriberKind() string { return c.kind }

type kindedProjection struct{ kindCounter }

func (p kindedProjection) Handle(context.Context, pgx.Tx, eventstore.Event) error {
	p.n.Add(1)
	return nil
}

// appendKinded appends n events to a stream of their own through append_events.
func appendKinded(t *testing.T, db *annalstest.DB, n int) {
	t.Helper()
	store, err := eventstore.New(db.Pool, &eventstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	for range n {
		if _, err := store.Append(t.Context(), "k-1", eventstore.Any, eventstore.EventData{Type: "t", Data: json.RawMessage(`{}`)}); err != nil {
			t.Fatal(err)
		}
	}
}

// runKinded runs handler (under its SubscriberKind, or as what it is) to the
// head on db and returns how many events it handled and RunUntilCaughtUp's
// error.
func runKinded(t *testing.T, db *annalstest.DB, logger *slog.Logger, handler any) error {
	t.Helper()
	r, err := projection.NewRunner(db.Pool, &projection.Config{Schema: db.Schema, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Register(handler, nil); err != nil {
		t.Fatal(err)
	}
	return r.RunUntilCaughtUp(t.Context())
}

func kindOf(t *testing.T, db *annalstest.DB, name string) string {
	t.Helper()
	var kind *string
	q := fmt.Sprintf(`SELECT kind FROM %s WHERE subscriber_id = $1`, pgx.Identifier{db.Schema, "subscriber_layouts"}.Sanitize())
	if err := db.Pool.QueryRow(t.Context(), q, name).Scan(&kind); err != nil {
		t.Fatalf("the kind recorded for %q: %v", name, err)
	}
	if kind == nil {
		return "NULL"
	}
	return *kind
}

// The runner records each subscriber's kind at its start (migration 0044),
// so that a tail (or any other kind) can tell a handler's name from its
// own on a database where the handler ran even once, whatever traces it
// left (an observer leaves none but its checkpoint).
func TestRunnerRecordsSubscriberKinds(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	appendKinded(t, db, 2)
	var n atomic.Int64
	for _, h := range []any{
		kindCounter{name: "obs", n: &n},
		kindedProjection{kindCounter{name: "proj", n: &n}},
		kindCounter{name: "sagaish", kind: "saga", n: &n},
	} {
		if err := runKinded(t, db, nil, h); err != nil {
			t.Fatal(err)
		}
	}
	if n.Load() != 6 {
		t.Fatalf("handled %d events; want 6", n.Load())
	}
	for name, want := range map[string]string{"obs": "observer", "proj": "projection", "sagaish": "saga"} {
		if got := kindOf(t, db, name); got != want {
			t.Errorf("kind of %s: %s; want %s", name, got, want)
		}
	}
}

// A subscriber that a runner older than migration 0044 ran has a layout
// and checkpoints but no kind (NULL): the runner resumes it from its
// checkpoint, as before, and records its kind.
func TestRunnerAdoptsAnUnkindOf(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	appendKinded(t, db, 3)
	for _, stmt := range []string{
		`INSERT INTO annals.subscriber_layouts (subscriber_id, partitions, partition_by) VALUES ('old', 1, 'stream')`,
		`INSERT INTO annals.checkpoints (subscriber_id, partition, position) VALUES ('old', 0, 2)`,
	} {
		if _, err := db.Pool.Exec(t.Context(), stmt); err != nil {
			t.Fatal(err)
		}
	}
	var n atomic.Int64
	if err := runKinded(t, db, nil, kindCounter{name: "old", n: &n}); err != nil {
		t.Fatal(err)
	}
	if n.Load() != 1 {
		t.Fatalf("handled %d events; want the 1 after its checkpoint", n.Load())
	}
	if got := kindOf(t, db, "old"); got != "observer" {
		t.Fatalf("kind: %s; want observer", got)
	}
}

// The current runner on a schema migrated before 0044 (no kind column,
// the binary deployed before 'annals migrate'): it runs as before,
// recording no kind.
func TestRunnerOnASchemaWithoutKinds(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	// The schema as migration 0043 left it.
	if _, err := db.Pool.Exec(t.Context(), `ALTER TABLE annals.subscriber_layouts DROP COLUMN kind`); err != nil {
		t.Fatal(err)
	}
	appendKinded(t, db, 2)
	var n atomic.Int64
	if err := runKinded(t, db, nil, kindCounter{name: "obs", n: &n}); err != nil {
		t.Fatal(err)
	}
	if n.Load() != 2 {
		t.Fatalf("handled %d events; want 2", n.Load())
	}
}

// The kinds a runner refuses and the kinds it takes a name over from (see
// projection.SubscriberKindError):
//   - a tail under a handler's name: refused, nothing recorded;
//   - a handler under a tail's name whose checkpoint moved: refused (it
//     would start where the tail stopped), nothing set up;
//   - a handler under a tail's name whose checkpoints are at 0: taken over;
//   - a handler of another kind (an observer rewritten as a projection):
//     taken over with a warning, resuming from its checkpoint.
func TestRunnerJudgesARecordedKind(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	appendKinded(t, db, 3)
	var n atomic.Int64
	if err := runKinded(t, db, nil, kindCounter{name: "watch", n: &n}); err != nil {
		t.Fatal(err)
	}

	// A tail under the observer's name.
	err := runKinded(t, db, nil, kindCounter{name: "watch", kind: projection.KindTail, n: &n})
	var ke *projection.SubscriberKindError
	if !errors.Is(err, projection.ErrSubscriberKind) || !errors.As(err, &ke) ||
		ke.Recorded != "observer" || ke.Kind != projection.KindTail || !strings.Contains(err.Error(), "an observer's") {
		t.Fatalf("a tail under an observer's name: %v; want ErrSubscriberKind naming the observer", err)
	}
	if n.Load() != 3 || kindOf(t, db, "watch") != "observer" {
		t.Fatalf("after the refused tail: %d handled, kind %s; want 3, observer", n.Load(), kindOf(t, db, "watch"))
	}

	// The observer rewritten as a projection: the same subscriber,
	// resumed from its checkpoint.
	var logs annalstest.LogBuffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	appendKinded(t, db, 1)
	n.Store(0)
	if err := runKinded(t, db, logger, kindedProjection{kindCounter{name: "watch", n: &n}}); err != nil {
		t.Fatal(err)
	}
	if n.Load() != 1 || kindOf(t, db, "watch") != "projection" ||
		!strings.Contains(logs.String(), "recorded_kind=observer") || !strings.Contains(logs.String(), "level=WARN") {
		t.Fatalf("observer rewritten as a projection: %d handled, kind %s, logs %q; want 1, projection, a warning",
			n.Load(), kindOf(t, db, "watch"), logs.String())
	}

	// A tail that printed events, then a projection under its name.
	n.Store(0)
	if err := runKinded(t, db, nil, kindCounter{name: "peek", kind: projection.KindTail, n: &n}); err != nil {
		t.Fatal(err)
	}
	if n.Load() != 4 || kindOf(t, db, "peek") != projection.KindTail {
		t.Fatalf("tail: %d printed, kind %s", n.Load(), kindOf(t, db, "peek"))
	}
	n.Store(0)
	err = runKinded(t, db, nil, kindedProjection{kindCounter{name: "peek", n: &n}})
	if !errors.As(err, &ke) || ke.Recorded != projection.KindTail || !ke.Moved || !strings.Contains(err.Error(), "annals checkpoint set peek 0") {
		t.Fatalf("a projection under a tail's name past 0: %v; want ErrSubscriberKind", err)
	}
	if n.Load() != 0 || kindOf(t, db, "peek") != projection.KindTail {
		t.Fatalf("after the refused projection: %d handled, kind %s", n.Load(), kindOf(t, db, "peek"))
	}
	// Its checkpoint set back to 0: the projection takes the name over
	// and handles the whole log.
	if _, err := db.Pool.Exec(t.Context(), `UPDATE annals.checkpoints SET position = 0 WHERE subscriber_id = 'peek'`); err != nil {
		t.Fatal(err)
	}
	if err := runKinded(t, db, nil, kindedProjection{kindCounter{name: "peek", n: &n}}); err != nil {
		t.Fatal(err)
	}
	if n.Load() != 4 || kindOf(t, db, "peek") != "projection" {
		t.Fatalf("a projection under a reset tail's name: %d handled, kind %s; want 4, projection", n.Load(), kindOf(t, db, "peek"))
	}
}
