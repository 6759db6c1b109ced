package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/internal/schemaname"
)

// loginRole creates a LOGIN role with a unique name in db's cluster (dropped
// when the test ends) and returns its name and a URL that connects as it.
func loginRole(t *testing.T, db *annalstest.DB, label string) (name, roleURL string) {
	t.Helper()
	ctx := context.Background()
	var b [6]byte
	_, _ = rand.Read(b[:])
	name = "annals_cli_" + label + "_" + hex.EncodeToString(b[:])
	password := hex.EncodeToString(b[:]) + "pw"
	ident := pgx.Identifier{name}.Sanitize()
	if _, err := db.Pool.Exec(ctx, fmt.Sprintf("CREATE ROLE %s LOGIN PASSWORD %s", ident, schemaname.Literal(password))); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, s := range []string{"DROP OWNED BY " + ident, "DROP ROLE " + ident} {
			if _, err := db.Pool.Exec(ctx, s); err != nil {
				t.Errorf("%s: %v", s, err)
			}
		}
	})
	if !strings.HasPrefix(db.URL, "postgres://") && !strings.HasPrefix(db.URL, "postgresql://") {
		return name, db.URL + fmt.Sprintf(" user=%s password=%s", name, password)
	}
	u, err := url.Parse(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(name, password)
	return name, u.String()
}

func TestGrantCommand(t *testing.T) {
	t.Parallel()
	t.Run("Print", func(t *testing.T) {
		t.Parallel()
		r := annals(t, "", "grant", "writer", `app"x`, "--print", "--schema", "orders")
		if r.code != 0 || !strings.Contains(r.stdout, `GRANT EXECUTE ON FUNCTION "orders".append_events(text, bigint, jsonb) TO "app""x";`) {
			t.Fatalf("grant --print: %+v", r)
		}
		for _, line := range strings.Split(r.stdout, "\n") {
			if strings.Contains(line, "INSERT") && (strings.Contains(line, ".events") || strings.Contains(line, ".streams")) {
				t.Errorf("a writer gets INSERT on the log: %s", line)
			}
		}
	})
	t.Run("Usage", func(t *testing.T) {
		t.Parallel()
		for _, args := range [][]string{{"grant", "admin", "app"}, {"grant", "writer"}, {"grant", "writer", "app", "--schema", "a$b"}} {
			if r := annals(t, "", args...); r.code != ExitUsage {
				t.Errorf("%v: exit %d, want 2: %s", args, r.code, r.stderr)
			}
		}
		// An empty role name is the role's fault, not the kind's.
		for _, args := range [][]string{{"grant", "writer", ""}, {"grant", "writer", "", "--print"}, {"grant", "reader", "a\x00b"}} {
			if r := annals(t, "", args...); r.code != ExitUsage || !strings.HasPrefix(r.stderr, "annals: ROLE ") || strings.Contains(r.stderr, "kind") {
				t.Errorf("%q: exit %d, want 2 about ROLE: %s", args, r.code, r.stderr)
			}
		}
	})
	t.Run("RolesAtWork", func(t *testing.T) {
		t.Parallel()
		db := annalstest.NewDB(t, nil)
		if r := annals(t, db.URL, "grant", "reader", "annals_no_such_role"); r.code != ExitFailure || !strings.Contains(r.stderr, "role does not exist") {
			t.Fatalf("grant to a missing role: %+v", r)
		}
		writer, writerURL := loginRole(t, db, "w")
		reader, readerURL := loginRole(t, db, "r")
		operator, operatorURL := loginRole(t, db, "o")
		for kind, role := range map[string]string{"writer": writer, "reader": reader, "operator": operator} {
			if r := annals(t, db.URL, "grant", kind, role); r.code != 0 || !strings.Contains(r.stdout, "granted "+kind) {
				t.Fatalf("grant %s: %+v", kind, r)
			}
		}
		if r := annals(t, writerURL, "append", "order-1", "order.placed", `{"total": 1}`); r.code != 0 || !strings.Contains(r.stdout, "position 1") {
			t.Fatalf("append as the writer: %+v", r)
		}
		if r := annals(t, readerURL, "append", "order-1", "order.placed", `{"total": 1}`); r.code != ExitFailure || !strings.Contains(r.stderr, "permission denied") {
			t.Fatalf("append as the reader: %+v", r)
		}
		for _, args := range [][]string{{"read"}, {"tail"}} {
			if r := annals(t, readerURL, args...); r.code != 0 || !strings.Contains(r.stdout, "order-1") {
				t.Errorf("%v as the reader: %+v", args, r)
			}
		}
		if r := annals(t, operatorURL, "checkpoint", "set", "mailer", "1", "--create", "--yes"); r.code != 0 {
			t.Fatalf("checkpoint set as the operator: %+v", r)
		}
		for _, args := range [][]string{{"status"}, {"dlq", "list"}, {"schedule", "list"}, {"verify"}} {
			if r := annals(t, operatorURL, args...); r.code != 0 {
				t.Errorf("%v as the operator: %+v", args, r)
			}
		}
		if r := annals(t, writerURL, "checkpoint", "set", "mailer", "0", "--yes"); r.code != ExitFailure || !strings.Contains(r.stderr, "permission denied") {
			t.Errorf("checkpoint set as the writer: %+v", r)
		}
	})
}
