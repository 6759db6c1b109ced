package console_test

import (
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/migrations"
)

// TestReaderRole: an on-call engineer given only `annals grant reader`
// sees every page (the pages read the instances, failures, timers and
// cron tables, which the reader grant covers), and can change nothing.
func TestReaderRole(t *testing.T) {
	t.Parallel()
	f := setup(t, &fixtureOpts{pool: func(db *annalstest.DB) *pgxpool.Pool {
		p, _ := rolePool(t, db, migrations.Reader)
		return p
	}})
	before := state(t, f.db)
	c := f.client(t)
	c.login("ada")
	for _, p := range []string{"/", "/streams", "/events", "/events/1", "/subscribers/mailer", "/dead-letters",
		fmt.Sprintf("/dead-letters/%d", f.dlID), "/scheduler", "/instances", "/audit"} {
		if code, body := c.get(p); code != 200 {
			t.Errorf("GET %s as a reader role: %d\n%.300s", p, code, body)
		}
	}
	if after := state(t, f.db); after != before {
		t.Errorf("a reader role changed the database:\n%s\n%s", before, after)
	}
}
