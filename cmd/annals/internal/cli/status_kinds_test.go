package cli

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/projection"
)

// annals status --output json gives each subscriber partition the kind the
// runner recorded for its name (null: unknown), and reads a schema before
// migration 0044 (no kind column) as before, every kind null.
func TestStatusShowsSubscriberKinds(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	if r := annals(t, db.URL, "append", "book-1", "book.borrowed", `{"n":1}`); r.code != 0 {
		t.Fatalf("append: %+v", r)
	}
	runner, err := projection.NewRunner(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := runner.Register(kindsObserver{"mailer"}, nil); err != nil {
		t.Fatal(err)
	}
	if err := runner.RunUntilCaughtUp(t.Context()); err != nil {
		t.Fatal(err)
	}
	// A subscriber an older runner ran: no kind recorded.
	if _, err := db.Pool.Exec(t.Context(), `INSERT INTO annals.checkpoints (subscriber_id, partition, position) VALUES ('old', 0, 1)`); err != nil {
		t.Fatal(err)
	}
	kinds := func() map[string]*string {
		t.Helper()
		r := annals(t, db.URL, "status", "--output", "json")
		var st StatusJSON
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &st) != nil {
			t.Fatalf("status: %+v", r)
		}
		got := map[string]*string{}
		for _, s := range st.Subscribers {
			got[s.Subscriber] = s.Kind
		}
		return got
	}
	got := kinds()
	if k := got["mailer"]; k == nil || *k != "observer" {
		t.Errorf("mailer's kind: %v; want observer", k)
	}
	// The text has a KIND column: the kind, or - when unknown.
	text := annals(t, db.URL, "status")
	if text.code != 0 {
		t.Fatalf("status: %+v", text)
	}
	kindCol := map[string]string{}
	for _, line := range strings.Split(text.stdout, "\n") {
		if f := strings.Fields(line); len(f) >= 3 && (f[0] == "SUBSCRIBER" || f[0] == "mailer" || f[0] == "old") {
			kindCol[f[0]] = f[2]
		}
	}
	if kindCol["SUBSCRIBER"] != "KIND" || kindCol["mailer"] != "observer" || kindCol["old"] != "-" {
		t.Errorf("status text's third column: %v; want KIND, observer for mailer, - for old:\n%s", kindCol, text.stdout)
	}
	if k, ok := got["old"]; !ok || k != nil {
		t.Errorf("old's kind: %v (listed %v); want null", k, ok)
	}
	if _, err := db.Pool.Exec(t.Context(), `ALTER TABLE annals.subscriber_layouts DROP COLUMN kind`); err != nil {
		t.Fatal(err)
	}
	got = kinds()
	if k, ok := got["mailer"]; !ok || k != nil {
		t.Errorf("mailer's kind on a schema without kinds: %v (listed %v); want null", k, ok)
	}
}
