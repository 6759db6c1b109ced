package advisorylock_test

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/advisorylock"
	"github.com/annals-dev/annals/internal/pgcluster"
)

// Through PgBouncer as most run it (transaction mode, no
// ignore_startup_parameters for the lock's keepalive and check settings),
// every way to open a lock session fails at connect, and the error says why
// and what to do: a direct connection or a session-mode pooler. Before,
// it was PgBouncer's bare "unsupported startup parameter", repeated in
// the runner's WARN for ever.
func TestThroughATransactionPoolerTheConnectErrorExplains(t *testing.T) {
	t.Parallel()
	b := newBundle(t)
	ctx := t.Context()
	bouncer, err := pgcluster.StartPgBouncer(ctx, b.db.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := bouncer.Stop(); err != nil {
			t.Error(err)
		}
	})
	cc, err := pgx.ParseConfig(bouncer.URL(b.cc.Database, b.cc.User))
	if err != nil {
		t.Fatal(err)
	}
	check := func(what string, err error) {
		t.Helper()
		if err == nil {
			t.Fatalf("%s through PgBouncer in transaction mode succeeded", what)
		}
		for _, want := range []string{"unsupported startup parameter", "a pooler", "session mode", "ignore_startup_parameters"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s: %q lacks %q", what, err, want)
			}
		}
	}
	_, err = advisorylock.TryAcquire(ctx, cc, "pooler:try", nil)
	check("TryAcquire", err)
	_, err = advisorylock.NewStandby(ctx, cc, nil)
	check("NewStandby", err)
}
