package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/internal/lockkey"
)

// A named tail is an observer that stores its position in the checkpoint
// of its name. Given the name of a projection, a saga or a relay, it would
// take that subscriber's checkpoint over whenever it leads, and the
// projection would then skip, silently, every event the tail printed (a
// read model missing rows for good). So tail refuses a name that the
// database shows to belong to one, changing nothing.
func TestTailRefusesAHandlersSubscriberName(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	for _, stream := range []string{"book-1", "book-2", "book-3"} {
		if r := annals(t, db.URL, "append", stream, "book.borrowed", `{"n":1}`); r.code != 0 {
			t.Fatalf("append: %+v", r)
		}
	}
	// tail with a deadline: a followed tail that was not refused runs
	// until it, exits 0 and fails the test instead of hanging it.
	tail := func(args ...string) result {
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
	for _, stmt := range []string{
		`INSERT INTO annals.read_model_setups (projection, version, applied_by) VALUES ('loans', 1, 'test')`,
		`INSERT INTO annals.saga_states (saga, correlation_id, state, version, completed) VALUES ('overdue', 'b1', '{}', 1, false)`,
		`INSERT INTO annals.relay_acks (subscriber_id, partition, stream, stream_created_ns, stream_sequence, position)
			VALUES ('relay-nats', 0, 'annals', 1, 1, 1)`,
		`INSERT INTO annals.checkpoints (subscriber_id, partition, position) VALUES ('loans', 0, 1), ('overdue', 0, 1), ('relay-nats', 0, 1)`,
	} {
		if _, err := db.Pool.Exec(t.Context(), stmt); err != nil {
			t.Fatal(err)
		}
	}
	for name, kind := range map[string]string{"loans": "projection", "overdue": "saga", "relay-nats": "relay"} {
		for _, follow := range []bool{false, true} {
			args := []string{"--subscriber", name, "--output", "jsonl"}
			if follow {
				args = append(args, "--follow")
			}
			r := tail(args...)
			if r.code != ExitUsage || !strings.Contains(r.stderr, kind) || !strings.Contains(r.stderr, "choose") || r.stdout != "" {
				t.Errorf("tail --subscriber %s (follow %v): want exit %d naming a %s: %+v", name, follow, ExitUsage, kind, r)
			}
			var pos int64
			if err := db.Pool.QueryRow(t.Context(), `SELECT position FROM annals.checkpoints WHERE subscriber_id = $1`, name).Scan(&pos); err != nil || pos != 1 {
				t.Errorf("%s's checkpoint after a refused tail: %d, %v; want 1", name, pos, err)
			}
		}
	}
	// A name of its own still works, and resumes as before.
	if r := tail("--subscriber", "tail-loans", "--output", "jsonl"); r.code != 0 || strings.Count(r.stdout, "\n") != 3 {
		t.Fatalf("tail --subscriber tail-loans: %+v", r)
	}
}

// tail --subscriber without --follow while another session holds the
// subscriber's lock (another tail of that name following) stands by until
// it can lead: it says so after a moment, as relay --once does; it waited
// without a word, and looked hung.
func TestTailSubscriberSaysWhatItWaitsFor(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	if r := annals(t, db.URL, "append", "book-1", "book.borrowed", `{"n":1}`); r.code != 0 {
		t.Fatalf("append: %+v", r)
	}
	conn, err := pgx.Connect(t.Context(), db.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	k1, k2 := lockkey.Pair(catchup.LockKey("annals", "busy", 0))
	if _, err := conn.Exec(t.Context(), "SELECT pg_advisory_lock($1::int4, $2::int4)", k1, k2); err != nil {
		t.Fatal(err)
	}
	r := annalsWithin(t, 3*tailWaitNote, db.URL, "tail", "--subscriber", "busy")
	if !strings.Contains(r.stderr, "waiting for the subscriber's lock") {
		t.Fatalf("tail --subscriber behind another's lock: exit %d, stderr %q; want a note on what it waits for", r.code, r.stderr)
	}
	// Unblocked, it prints and exits without a note.
	if _, err := conn.Exec(t.Context(), "SELECT pg_advisory_unlock($1::int4, $2::int4)", k1, k2); err != nil {
		t.Fatal(err)
	}
	if r := annalsWithin(t, 20*time.Second, db.URL, "tail", "--subscriber", "busy", "--output", "jsonl"); r.code != 0 || r.stderr != "" || !strings.Contains(r.stdout, "book-1") {
		t.Fatalf("tail --subscriber with the lock free: %+v", r)
	}
}
