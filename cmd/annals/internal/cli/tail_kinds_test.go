package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
	"github.com/annals-dev/annals/saga"
)

// kindsObserver is an observer that handles nothing of note: no read
// model, no setup, nothing in the database but its checkpoint.
type kindsObserver struct{ name string }

func (o kindsObserver) Name() string                                   { return o.name }
func (o kindsObserver) Handle(context.Context, eventstore.Event) error { return nil }

type loanOpened struct {
	Loan string `json:"loan"`
}

// The runner records what kind each subscriber is (migration 0044), so
// tail refuses the name of a handler that left no other trace: an observer
// that has run once, a saga that has no instance yet (nothing it handles
// was appended). The heuristics of cac9fef saw neither, and the tail moved
// their checkpoints. A tail's own name is recorded as a tail's, and a
// second tail of it runs.
func TestTailRefusesARecordedKind(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	for _, stream := range []string{"book-1", "book-2", "book-3"} {
		if r := annals(t, db.URL, "append", stream, "book.borrowed", `{"n":1}`); r.code != 0 {
			t.Fatalf("append: %+v", r)
		}
	}
	reg := eventstore.NewRegistry()
	eventstore.MustRegister[loanOpened](reg, "loan.opened")
	store, err := eventstore.New(db.Pool, &eventstore.Config{Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	runner, err := projection.NewRunner(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := runner.Register(kindsObserver{"mailer"}, nil); err != nil {
		t.Fatal(err)
	}
	s := saga.New[struct{}]("loans", reg)
	saga.On(s, func(e eventstore.Envelope[loanOpened]) string { return e.Data.Loan },
		func(context.Context, *saga.Instance[struct{}], eventstore.Envelope[loanOpened]) error { return nil })
	if err := saga.Register(runner, s, &saga.Config{Store: store}); err != nil {
		t.Fatal(err)
	}
	if err := runner.RunUntilCaughtUp(t.Context()); err != nil {
		t.Fatal(err)
	}
	// An event since: a tail that led their subscribers would print it and
	// move their checkpoints past it.
	if r := annals(t, db.URL, "append", "book-4", "book.borrowed", `{"n":1}`); r.code != 0 {
		t.Fatalf("append: %+v", r)
	}
	tail := func(args ...string) result {
		// A deadline: a followed tail that was not refused runs until it,
		// exits 0 and fails the test instead of hanging it.
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		var out, errOut bytes.Buffer
		getenv := func(k string) string {
			if k == "DATABASE_URL" {
				return db.URL
			}
			return ""
		}
		code := run(ctx, append([]string{"tail"}, args...), strings.NewReader(""), &out, &errOut, getenv)
		return result{code, out.String(), errOut.String()}
	}
	position := func(name string) int64 {
		var pos int64
		if err := db.Pool.QueryRow(t.Context(), `SELECT position FROM annals.checkpoints WHERE subscriber_id = $1`, name).Scan(&pos); err != nil {
			t.Fatal(err)
		}
		return pos
	}
	for name, kind := range map[string]string{"mailer": "an observer's", "loans": "a saga's"} {
		before := position(name)
		for _, follow := range []bool{false, true} {
			args := []string{"--subscriber", name, "--output", "jsonl"}
			if follow {
				args = append(args, "--follow")
			}
			r := tail(args...)
			if r.code != ExitUsage || !strings.Contains(r.stderr, kind) || !strings.Contains(r.stderr, "choose a name of the tail's own") || r.stdout != "" {
				t.Errorf("tail --subscriber %s (follow %v): want exit %d naming %s subscriber: %+v", name, follow, ExitUsage, kind, r)
			}
			if after := position(name); after != before {
				t.Errorf("%s's checkpoint after a refused tail: %d; want %d", name, after, before)
			}
		}
	}
	// A name of the tail's own is recorded as a tail's, and runs again.
	for range 2 {
		if r := tail("--subscriber", "tail-mailer", "--output", "jsonl"); r.code != 0 {
			t.Fatalf("tail --subscriber tail-mailer: %+v", r)
		}
	}
	var kind string
	if err := db.Pool.QueryRow(t.Context(), `SELECT kind FROM annals.subscriber_layouts WHERE subscriber_id = 'tail-mailer'`).Scan(&kind); err != nil || kind != "tail" {
		t.Fatalf("kind of tail-mailer: %q, %v; want tail", kind, err)
	}
}
