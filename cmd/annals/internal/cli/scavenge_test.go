package cli

import (
	"regexp"
	"strings"
	"testing"

	"github.com/annals-dev/annals/annalstest"
)

// scavenge --list shows each run's retention clock beside its start (the
// clock is never later than the start since migration 0027).
func TestScavengeListShowsTheClock(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	if r := annals(t, db.URL, "append", "s", "x", `{}`); r.code != 0 {
		t.Fatalf("append: %+v", r)
	}
	if r := annals(t, db.URL, "scavenge"); r.code != 0 {
		t.Fatalf("scavenge: %+v", r)
	}
	r := annals(t, db.URL, "scavenge", "--list", "1")
	line := regexp.MustCompile(`^run 1 by \S+ \(\S+\), started (\S+ \S+), clock (\S+ \S+), finished \S+ \S+: positions 1\.\.1, scanned to 1, 0 removed in 1 step\n$`)
	m := line.FindStringSubmatch(r.stdout)
	if r.code != 0 || m == nil || m[2] > m[1] {
		t.Fatalf("scavenge --list: %+v", r)
	}
}

// scavenge --list 0 is a usage error, as --list -1 is: it never starts a
// run (which --list without a value of at least 1 would be taken for).
func TestScavengeListZeroDoesNotRun(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	if r := annals(t, db.URL, "append", "s", "x", `{}`); r.code != 0 {
		t.Fatalf("append: %+v", r)
	}
	for _, n := range []string{"0", "-1"} {
		if r := annals(t, db.URL, "scavenge", "--list", n); r.code != ExitUsage || !strings.HasPrefix(r.stderr, "annals: --list "+n+": want how many") {
			t.Errorf("scavenge --list %s: %+v", n, r)
		}
	}
	if r := annals(t, db.URL, "scavenge", "--list", "5", "--output", "json"); r.code != 0 || r.stdout != "[]\n" {
		t.Fatalf("scavenge --list 0 ran a scavenge: %+v", r)
	}
}
