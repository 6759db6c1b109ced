package pgcluster

import (
	"testing"

	"github.com/jackc/pgx/v5"
)

// The port StartPgBouncer picks free can be taken before PgBouncer binds it
// (by another test's server, or an outgoing connection's local port): it
// picks another, and never hands out the listener that answers first, here
// a PostgreSQL server, as its pooler (a test of pooling would then pass
// with no pooler in between).
func TestStartPgBouncerPortTakenByAnotherServer(t *testing.T) {
	t.Parallel()
	if _, err := FindPgBouncer(); err != nil {
		t.Fatal(err)
	}
	other := startCluster(t, nil)
	picks := 0
	b, err := StartPgBouncer(t.Context(), other.URL(), &PgBouncerOptions{pickPort: func() (int, error) {
		picks++
		if picks == 1 {
			return other.Port(), nil
		}
		return freePort()
	}})
	if err != nil {
		t.Fatalf("StartPgBouncer with its first pick taken: %v", err)
	}
	t.Cleanup(func() {
		if err := b.Stop(); err != nil {
			t.Error(err)
		}
	})
	if picks != 2 {
		t.Errorf("StartPgBouncer picked a port %d times; want 2 (the taken one, then another)", picks)
	}
	if b.Port() == other.Port() {
		t.Fatalf("StartPgBouncer reports port %d, the other server's, as its pooler's", b.Port())
	}
	// PgBouncer answers there: its admin console.
	cc, err := pgx.ParseConfig(b.URL("pgbouncer", "postgres"))
	if err != nil {
		t.Fatal(err)
	}
	cc.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	conn, err := pgx.ConnectConfig(t.Context(), cc)
	if err != nil {
		t.Fatalf("PgBouncer's admin console on port %d: %v", b.Port(), err)
	}
	defer func() { _ = conn.Close(t.Context()) }()
	if _, err := conn.Exec(t.Context(), "SHOW VERSION"); err != nil {
		t.Fatalf("SHOW VERSION on port %d: %v", b.Port(), err)
	}
}
