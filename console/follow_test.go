package console_test

import (
	"bufio"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/migrations"
)

// readerFixture is a fixture whose console reads as a reader role; outage
// makes the log unreadable to that role (as a database outage would make
// it: every poll of a follow fails) until the returned function restores
// it.
func readerFixture(t *testing.T) (*fixture, func() func()) {
	t.Helper()
	var role string
	f := setup(t, &fixtureOpts{pool: func(db *annalstest.DB) *pgxpool.Pool {
		p, name := rolePool(t, db, migrations.Reader)
		role = name
		return p
	}})
	ident := pgx.Identifier{role}.Sanitize()
	outage := func() func() {
		t.Helper()
		if _, err := f.db.Pool.Exec(t.Context(), "REVOKE SELECT ON annals.events FROM "+ident); err != nil {
			t.Fatal(err)
		}
		return func() {
			t.Helper()
			if _, err := f.db.Pool.Exec(t.Context(), "GRANT SELECT ON annals.events TO "+ident); err != nil {
				t.Fatal(err)
			}
		}
	}
	return f, outage
}

// TestFollowFailureAndRecovery: while the log cannot be read a follow
// sends "failure" messages; the first poll that reads it again sends
// "recovered", and the events appended meanwhile follow.
func TestFollowFailureAndRecovery(t *testing.T) {
	t.Parallel()
	f, outage := readerFixture(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, f.srv.URL+"/events/follow?after=12", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	lines := make(chan string, 1000)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	// waitEvent reads until a message of the kind, and returns its data.
	waitEvent := func(kind string) string {
		t.Helper()
		event := ""
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("the follow ended before an %q message", kind)
				}
				if e, ok := strings.CutPrefix(l, "event: "); ok {
					event = e
				}
				if d, ok := strings.CutPrefix(l, "data: "); ok && event == kind {
					return d
				}
			case <-ctx.Done():
				t.Fatalf("no %q message", kind)
			}
		}
	}
	restore := outage()
	if d := waitEvent("failure"); !strings.Contains(d, "permission denied") {
		t.Errorf("failure message %s", d)
	}
	if _, err := f.store.Append(ctx, "order-12", eventstore.NoStream, eventstore.EventData{Type: "order.placed", Data: map[string]int{"n": 12}}); err != nil {
		t.Fatal(err)
	}
	restore()
	waitEvent("recovered")
	if d := waitEvent("append"); !strings.Contains(d, `"stream":"order-12"`) {
		t.Errorf("after the recovery: %s", d)
	}
}
