package cli

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
)

type personRegistered struct {
	PersonID string `json:"person_id"`
	Name     string `json:"name" annals:"personal"`
	Visits   int    `json:"visits" annals:"personal"`
}

// personalStore is a store of db that appends personRegistered with its
// personal fields encrypted.
func personalStore(t *testing.T, db *annalstest.DB) *eventstore.Store {
	t.Helper()
	reg := eventstore.NewRegistry()
	eventstore.MustRegister[personRegistered](reg, "person.registered", eventstore.PersonalData("PersonID"))
	kek, err := eventstore.NewLocalKEK([]byte("0123456789abcdef0123456789abcdef"))
	if err != nil {
		t.Fatal(err)
	}
	store, err := eventstore.New(db.Pool, &eventstore.Config{Registry: reg, KEK: kek})
	if err != nil {
		t.Fatal(err)
	}
	return store
}

// TestForget: annals read shows personal fields encrypted (it has no KEK),
// annals forget destroys the key, and annals read and annals tail then show
// "[forgotten]".
func TestForget(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	store := personalStore(t, db)
	if _, err := store.Append(context.Background(), "person-1", eventstore.NoStream,
		eventstore.NewEvent(personRegistered{PersonID: "p-1", Name: "Ada Lovelace", Visits: 3})); err != nil {
		t.Fatal(err)
	}
	r := annals(t, db.URL, "read", "person-1", "--output", "jsonl")
	if r.code != 0 || strings.Contains(r.stdout, "Ada") || !strings.Contains(r.stdout, `$personal`) {
		t.Fatalf("read before forget: %+v", r)
	}
	if r = annals(t, db.URL, "forget", "p-1"); r.code != ExitUsage {
		t.Fatalf("forget without --yes off a terminal: %+v", r)
	}
	if r = annals(t, db.URL, "forget"); r.code != ExitUsage {
		t.Fatalf("forget without a subject: %+v", r)
	}
	r = annals(t, db.URL, "forget", "p-1", "--yes", "--output", "json")
	var res eventstore.ForgetResult
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &res) != nil || !res.HadKey || res.Subject != "p-1" {
		t.Fatalf("forget: %+v %+v", r, res)
	}
	// tail shows what read shows, through the engine and as a subscriber
	// (a new one per run: a second run would resume after the event).
	for _, format := range []string{"text", "jsonl"} {
		for _, args := range [][]string{
			{"read", "person-1"},
			{"tail"},
			{"tail", "--subscriber", "forget-tail-" + format},
		} {
			r = annals(t, db.URL, append(args, "--output", format)...)
			if r.code != 0 || !strings.Contains(r.stdout, eventstore.Forgotten) || strings.Contains(r.stdout, `$personal`) {
				t.Fatalf("%s --output %s after forget: %+v", strings.Join(args, " "), format, r)
			}
		}
	}
	if r = annals(t, db.URL, "forget", "p-1", "--yes"); r.code != 0 || !strings.Contains(r.stdout, "no data key") {
		t.Fatalf("second forget: %+v", r)
	}
}

// TestReadPrintsWhatItReadBeforeAnError: an event that cannot be read (here
// personal data whose subject's key row is gone, as after a partial
// restore: ErrKeyMissing) ends read and tail with an error, after the
// events before it, in every format. The table and the JSON array printed
// nothing of them (they are written at the end), while jsonl printed them.
func TestReadPrintsWhatItReadBeforeAnError(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	store := personalStore(t, db)
	ctx := context.Background()
	if _, err := store.Append(ctx, "person-2", eventstore.NoStream, eventstore.EventData{Type: "person.noted", Data: map[string]string{"note": "first-of-two"}},
		eventstore.NewEvent(personRegistered{PersonID: "p-2", Name: "Grace Hopper", Visits: 1})); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `DELETE FROM annals.personal_keys WHERE subject = 'p-2'`); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"read", "person-2"}, {"read"}, {"tail"}} {
		for _, format := range []string{"text", "json", "jsonl"} {
			r := annals(t, db.URL, append(args, "--output", format)...)
			what := strings.Join(args, " ") + " --output " + format
			if r.code != ExitFailure || !strings.Contains(r.stderr, "key") {
				t.Errorf("%s: %+v, want exit %d naming the missing key", what, r, ExitFailure)
			}
			if !strings.Contains(r.stdout, "first-of-two") {
				t.Errorf("%s: the event before the unreadable one is not printed: %+v", what, r)
			}
			if format == "json" {
				var events []JSONLEvent
				if err := json.Unmarshal([]byte(r.stdout), &events); err != nil || len(events) != 1 {
					t.Errorf("%s: not a JSON array of the one event read (%v): %q", what, err, r.stdout)
				}
			}
		}
	}
}
