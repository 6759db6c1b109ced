package cli

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/migrations"
)

func TestAdvisoryLocksCommand(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"advisory-locks"}, {"advisory-locks", "lock"}, {"advisory-locks", "status", "extra"}} {
		if r := annals(t, "", args...); r.code != ExitUsage {
			t.Errorf("%v: exit %d, want 2: %s", args, r.code, r.stderr)
		}
	}
	db := annalstest.NewDB(t, nil)
	writer, writerURL := loginRole(t, db, "w")
	if r := annals(t, db.URL, "grant", "writer", writer); r.code != 0 {
		t.Fatalf("grant writer: %+v", r)
	}
	runner, _ := loginRole(t, db, "r")
	if r := annals(t, db.URL, "grant", "runner", runner); r.code != 0 {
		t.Fatalf("grant runner: %+v", r)
	}
	status := func(url string) migrations.AdvisoryLockAccess {
		t.Helper()
		r := annals(t, url, "advisory-locks", "status", "--output", "json")
		var a migrations.AdvisoryLockAccess
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &a) != nil {
			t.Fatalf("status --output json: %+v", r)
		}
		return a
	}
	if a := status(writerURL); a.Restricted || !slices.Contains(a.Runners, runner) || slices.Contains(a.Runners, writer) {
		t.Fatalf("status as the writer before: %+v", a)
	}
	if r := annals(t, writerURL, "advisory-locks", "restrict"); r.code != ExitFailure || !strings.Contains(r.stderr, "superuser") {
		t.Fatalf("restrict as the writer: %+v", r)
	}
	if r := annals(t, db.URL, "advisory-locks", "restrict", "--owner", "annals_no_such_owner"); r.code != ExitNotFound ||
		r.stderr != "annals: migrations: role \"annals_no_such_owner\", named as an owner, does not exist: create it first (CREATE ROLE \"annals_no_such_owner\" ...)\n" {
		t.Fatalf("restrict --owner of a missing role: %+v", r)
	}
	r := annals(t, db.URL, "advisory-locks", "restrict", "--owner", writer)
	if r.code != 0 || !strings.HasPrefix(r.stdout, "advisory locks may be taken by superusers and the roles granted them: ") ||
		!strings.Contains(r.stdout, runner) || !strings.Contains(r.stdout, writer) {
		t.Fatalf("restrict: %+v", r)
	}
	if a := status(writerURL); !a.Restricted || !slices.Contains(a.Roles, runner) || !slices.Contains(a.Roles, writer) {
		t.Fatalf("status as the writer after: %+v", a)
	}
	if r := annals(t, writerURL, "append", "order-1", "order.placed", `{"total": 1}`); r.code != 0 {
		t.Errorf("append as the writer once restricted: %+v", r)
	}
	if r := annals(t, db.URL, "advisory-locks", "allow", "--output", "json"); r.code != 0 || !strings.Contains(r.stdout, `"restricted": false`) {
		t.Fatalf("allow: %+v", r)
	}
}
