package migrations_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/internal/lockkey"
	"github.com/annals-dev/annals/internal/schemaname"
	"github.com/annals-dev/annals/migrations"
)

// role is a login role of one test, connected to the test's database.
type role struct {
	Name string
	URL  string
	Pool *pgxpool.Pool
}

// newRole creates a LOGIN role with a unique name (and a password, for
// servers that do not trust local connections), connects a pool as it to
// db, and removes both when the test ends. kind, if not empty, is granted.
func newRole(t *testing.T, db *annalstest.DB, kind migrations.RoleKind) *role {
	t.Helper()
	ctx := context.Background()
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := fmt.Sprintf("annals_%s_%s", kind, hex.EncodeToString(b[:]))
	password := hex.EncodeToString(b[:]) + "pw"
	ident := pgx.Identifier{name}.Sanitize()
	if _, err := db.Pool.Exec(ctx, fmt.Sprintf("CREATE ROLE %s LOGIN PASSWORD %s", ident, schemaname.Literal(password))); err != nil {
		t.Fatal(err)
	}
	r := &role{Name: name, URL: withUser(t, db.URL, name, password)}
	t.Cleanup(func() {
		if r.Pool != nil {
			r.Pool.Close()
		}
		// Its privileges live in this database only, which is dropped later.
		// Revoking them takes turns with Grant (its advisory lock):
		// concurrent changes of one object's privileges fail.
		err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			k1, k2 := lockkey.Pair(db.Schema + ":grant") // Grant's lock
			if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1, $2)", k1, k2); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "DROP OWNED BY "+ident)
			return err
		})
		if err != nil {
			t.Errorf("drop owned by %s: %v", name, err)
		}
		if _, err := db.Pool.Exec(ctx, "DROP ROLE "+ident); err != nil {
			t.Errorf("drop role %s: %v", name, err)
		}
	})
	if kind != "" {
		if err := migrations.Grant(ctx, db.Pool, name, kind, &migrations.Config{Schema: db.Schema}); err != nil {
			t.Fatalf("grant %s to %s: %v", kind, name, err)
		}
	}
	var err error
	if r.Pool, err = pgxpool.New(ctx, r.URL); err != nil {
		t.Fatal(err)
	}
	var user string
	if err := r.Pool.QueryRow(ctx, "SELECT current_user").Scan(&user); err != nil || user != name {
		t.Fatalf("connected as %q (%v), want %q", user, err, name)
	}
	return r
}

// withUser returns the connection string u with another user and password.
func withUser(t *testing.T, u, user, password string) string {
	t.Helper()
	if strings.HasPrefix(u, "postgres://") || strings.HasPrefix(u, "postgresql://") {
		pu, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		pu.User = url.UserPassword(user, password)
		return pu.String()
	}
	return strings.TrimSpace(u) + fmt.Sprintf(" user=%s password=%s", user, password)
}

// mustDeny fails t unless err is PostgreSQL's insufficient_privilege (42501).
func mustDeny(t *testing.T, what string, err error) {
	t.Helper()
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "42501" {
		t.Errorf("%s: got %v, want permission denied (SQLSTATE 42501)", what, err)
	}
}

// rel returns schema.name quoted.
func rel(db *annalstest.DB, name string) string { return pgx.Identifier{db.Schema, name}.Sanitize() }

// denyAll runs each statement as r and requires permission denied for each.
func denyAll(t *testing.T, r *role, stmts ...string) {
	t.Helper()
	for _, s := range stmts {
		_, err := r.Pool.Exec(context.Background(), s)
		mustDeny(t, r.Name+": "+s, err)
	}
}
