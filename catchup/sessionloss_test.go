package catchup_test

import (
	"testing"
	"time"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/catchup"
)

// A leader whose lock session ends (pg_terminate_backend; a server restart
// does the same) stands by again at once, paced only by the session's
// reconnect: it leads its partitions again long before its RetryBackoff.
// It used to wait RetryBackoff first, and balanced, its new session held a
// member slot meanwhile, so the partitions owed to it had no leader until
// the orphan rule gave them to another member (~260 ms at the defaults).
func TestLeaderStandsByAgainAtOnceWhenItsSessionEnds(t *testing.T) {
	t.Parallel()
	const n = 4
	db := annalstest.NewDB(t, nil)
	a := startInstance(t, db, "a", catchup.Config{RetryBackoff: time.Minute})
	a.run(t, n)
	waitLeads(t, db, a, n, nil, 10*time.Second)
	_, before := owners(t, db, n)
	var killed int
	if err := db.Pool.QueryRow(t.Context(), `
		SELECT count(pg_terminate_backend(pid)) FROM (SELECT DISTINCT l.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		 WHERE a.datname = current_database() AND l.locktype = 'advisory' AND l.granted AND a.application_name = 'a') s`).Scan(&killed); err != nil || killed != 1 {
		t.Fatalf("terminated %d lock sessions of a (%v), want 1", killed, err)
	}
	d := waitLeads(t, db, a, n, before, 20*time.Second)
	t.Logf("a leads its %d partitions again %v after its lock session ended (RetryBackoff 1m)", n, d)
}

// A lock session that keeps ending soon after it opened (a proxy cutting
// it, say) is not replaced at reconnect speed for ever: the first end is
// (its partitions are led again at once), the second in a row within
// seconds waits for the back-off (RetryBackoff, ±50%) first, so that the
// partitions are not claimed again and again.
func TestRepeatedSessionEndsBackOff(t *testing.T) {
	t.Parallel()
	const n = 2
	const backoff = 3 * time.Second
	db := annalstest.NewDB(t, nil)
	a := startInstance(t, db, "a", catchup.Config{RetryBackoff: backoff})
	a.run(t, n)
	waitLeads(t, db, a, n, nil, 10*time.Second)
	kill := func() {
		t.Helper()
		var killed int
		if err := db.Pool.QueryRow(t.Context(), `
			SELECT count(pg_terminate_backend(pid)) FROM (SELECT DISTINCT l.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
			 WHERE a.datname = current_database() AND l.locktype = 'advisory' AND l.granted AND a.application_name = 'a') s`).Scan(&killed); err != nil || killed != 1 {
			t.Fatalf("terminated %d lock sessions of a (%v), want 1", killed, err)
		}
	}
	_, before := owners(t, db, n)
	kill()
	first := waitLeads(t, db, a, n, before, 20*time.Second)
	_, before = owners(t, db, n)
	kill()
	second := waitLeads(t, db, a, n, before, 20*time.Second)
	t.Logf("led again %v after the first end, %v after the second (back-off %v ±50%%)", first, second, backoff)
	if second < backoff/2 {
		t.Fatalf("a's second lock session in a row to end was replaced after %v: want the back-off (at least %v)", second, backoff/2)
	}
}
