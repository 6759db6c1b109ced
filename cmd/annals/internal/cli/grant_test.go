package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
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
		// The cause first, then the hint.
		if r := annals(t, db.URL, "grant", "reader", "annals_no_such_role"); r.code != ExitNotFound ||
			r.stderr != "annals: role \"annals_no_such_role\" does not exist: create it first (CREATE ROLE \"annals_no_such_role\" LOGIN ...), then grant again\n" {
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

// rolePrivileges is every privilege role has in schema, beyond what a role
// granted nothing has (PUBLIC's): "schema USAGE", "table events SELECT",
// "sequence failures_id_seq USAGE", "function append_one(text, ...) EXECUTE",
// and "column personal_keys(subject) INSERT" for a privilege on a column the
// role lacks on the whole table.
func rolePrivileges(t *testing.T, db *annalstest.DB, role, none string) map[string]bool {
	t.Helper()
	const q = `
		SELECT 'schema ' || p FROM unnest(ARRAY['USAGE', 'CREATE']) p
		 WHERE has_schema_privilege($2, $1, p)
		UNION ALL
		SELECT 'table ' || c.relname || ' ' || p
		  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace,
		       unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE', 'TRUNCATE', 'REFERENCES', 'TRIGGER']) p
		 WHERE n.nspname = $1 AND c.relkind IN ('r', 'p', 'v', 'm', 'f') AND has_table_privilege($2, c.oid, p)
		UNION ALL
		SELECT 'column ' || c.relname || '(' || a.attname || ') ' || p
		  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		       JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped,
		       unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'REFERENCES']) p
		 WHERE n.nspname = $1 AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
		   AND has_column_privilege($2, c.oid, a.attnum, p) AND NOT has_table_privilege($2, c.oid, p)
		UNION ALL
		SELECT 'sequence ' || c.relname || ' ' || p
		  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace,
		       unnest(ARRAY['USAGE', 'SELECT', 'UPDATE']) p
		 WHERE n.nspname = $1 AND c.relkind = 'S' AND has_sequence_privilege($2, c.oid, p)
		UNION ALL
		SELECT 'function ' || f.proname || '(' || oidvectortypes(f.proargtypes) || ') EXECUTE'
		  FROM pg_proc f JOIN pg_namespace n ON n.oid = f.pronamespace
		 WHERE n.nspname = $1 AND has_function_privilege($2, f.oid, 'EXECUTE')`
	set := func(role string) map[string]bool {
		rows, err := db.Pool.Query(t.Context(), q, db.Schema, role)
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]bool{}
		for _, p := range got {
			m[p] = true
		}
		return m
	}
	has, public := set(role), set(none)
	for p := range public {
		delete(has, p)
	}
	return has
}

// documentedPrivileges is what docs/operations.md (Roles and privileges)
// says each kind of role gets, as rolePrivileges spells it. Keep the two in
// step: TestGrantedAsDocumented holds `annals grant` to this list exactly,
// and the docs' table to naming what each kind adds.
func documentedPrivileges() map[string][]string {
	on := func(kind string, privs []string, objects ...string) []string {
		var out []string
		for _, o := range objects {
			for _, p := range privs {
				out = append(out, kind+" "+o+" "+p)
			}
		}
		return out
	}
	sel := []string{"SELECT"}
	siu, siud, sid := []string{"SELECT", "INSERT", "UPDATE"}, []string{"SELECT", "INSERT", "UPDATE", "DELETE"}, []string{"SELECT", "INSERT", "DELETE"}
	exec := func(fns ...string) []string { return on("function", []string{"EXECUTE"}, fns...) }

	read := slices.Concat([]string{"schema USAGE"}, on("table", sel, "schema_migrations", "events", "streams", "events_archive",
		"events_all", "checkpoints", "dead_letters", "subscriber_layouts", "read_model_generations", "personal_keys"))
	observe := on("table", sel, "instances", "failures", "timers", "cron_tasks", "cron_ticks", "audit_log")
	appendRights := slices.Concat(exec(
		"append_events(text, bigint, jsonb)",
		"append_events_json(text, bigint, json)",
		"append_batch(text[], bigint[], integer[], integer[], uuid[], text[], text[], text[], boolean)",
		"append_one(text, bigint, uuid, text, text, text, boolean)",
		"delete_stream(text, bigint, boolean, jsonb)",
		"set_stream_retention(text, interval, bigint, bigint)",
		"forget_subject(text)", "inline_stream_lock(text)"),
		// Not the whole table: created_at takes its default, forgotten_at
		// stays NULL (no forged erasure records).
		on("column", []string{"INSERT"}, "personal_keys(subject)", "personal_keys(wrapped_key)"))
	reader := slices.Concat(read, observe)
	writer := slices.Concat(read, appendRights, on("table", siu, "snapshots"), exec("snapshot_lock()"))
	runner := slices.Concat(reader, appendRights,
		on("table", siu, "checkpoints", "subscriber_layouts", "relay_acks", "dead_letters", "cron_tasks", "read_model_setups", "read_model_generations"),
		on("table", siud, "instances", "failures", "timers", "saga_states"),
		on("table", sid, "cron_ticks"),
		on("sequence", []string{"USAGE"}, "failures_id_seq", "dead_letters_id_seq"),
		exec("read_model_create_schema(text, integer)", "read_model_drop_schema(text, integer)", "read_model_swap_views(text, text, text)"))
	operator := slices.Concat(runner,
		on("table", []string{"DELETE"}, "dead_letters", "cron_tasks"),
		on("table", sel, "scavenge_runs", "archive_runs"), // not snapshots: decrypted state
		on("sequence", sel, "events_global_sequence"),
		on("table", []string{"SELECT", "INSERT"}, "audit_log"),
		on("sequence", []string{"USAGE"}, "audit_log_id_seq"),
		exec("scavenge(text, timestamp with time zone, integer)", "archive(text, bigint, integer)"))
	return map[string][]string{"reader": reader, "writer": writer, "runner": runner, "operator": operator}
}

// TestGrantedAsDocumented grants each kind with `annals grant` and checks
// the catalog (has_table_privilege and the like) against what the docs say
// it gets: every documented privilege, and nothing more; and that the kinds
// are the supersets the docs say (runner = reader + ..., operator = runner +
// ..., writer = reader without observe + ...). A runner lacked SELECT on
// audit_log (the console's audit page: "permission denied") though the docs
// give it everything a reader has.
func TestGrantedAsDocumented(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	none, _ := loginRole(t, db, "none")
	doc := documentedPrivileges()
	got := map[string]map[string]bool{}
	for _, kind := range []string{"reader", "writer", "runner", "operator"} {
		role, _ := loginRole(t, db, kind)
		if r := annals(t, db.URL, "grant", kind, role); r.code != ExitOK {
			t.Fatalf("grant %s: %+v", kind, r)
		}
		got[kind] = rolePrivileges(t, db, role, none)
		want := map[string]bool{}
		for _, p := range doc[kind] {
			want[p] = true
		}
		for _, p := range slices.Sorted(maps.Keys(want)) {
			if !got[kind][p] {
				t.Errorf("%s: documented %s, not granted", kind, p)
			}
		}
		for _, p := range slices.Sorted(maps.Keys(got[kind])) {
			if !want[p] {
				t.Errorf("%s: granted %s, not documented", kind, p)
			}
		}
	}
	// The supersets, checked on what was granted.
	observe := func(p string) bool {
		for _, tbl := range []string{"instances", "failures", "timers", "cron_tasks", "cron_ticks", "audit_log"} {
			if p == "table "+tbl+" SELECT" {
				return true
			}
		}
		return false
	}
	for _, c := range []struct {
		sub, super string
		except     func(string) bool
	}{
		{"reader", "runner", nil},
		{"runner", "operator", nil},
		{"reader", "writer", observe},
		{"writer", "runner", func(p string) bool {
			return strings.HasPrefix(p, "table snapshots ") || p == "function snapshot_lock() EXECUTE"
		}},
	} {
		for _, p := range slices.Sorted(maps.Keys(got[c.sub])) {
			if !got[c.super][p] && (c.except == nil || !c.except(p)) {
				t.Errorf("%s has %s, %s does not: the docs make %s a superset", c.sub, p, c.super, c.super)
			}
		}
	}

	// The docs' table names, in each kind's row, what it adds to the kind
	// its row builds on (writer and runner on reader, operator on runner).
	text, err := os.ReadFile(filepath.Join("..", "..", "..", "..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	row := func(kind string) string {
		m := regexp.MustCompile("(?m)^\\| `" + kind + "` +\\|.*$").FindString(string(text))
		if m == "" {
			t.Fatalf("docs/operations.md has no table row for %s", kind)
		}
		return m
	}
	for kind, base := range map[string]string{"reader": "", "writer": "reader", "runner": "reader", "operator": "runner"} {
		r := row(kind)
		for _, p := range doc[kind] {
			if base != "" && slices.Contains(doc[base], p) {
				continue
			}
			f := strings.Fields(p)
			if f[0] == "schema" || (f[1] == "schema_migrations") {
				continue // in the table's heading
			}
			name, _, _ := strings.Cut(f[1], "(")
			if !strings.Contains(r, "`"+name+"`") && !(strings.HasPrefix(name, "append_") && strings.Contains(r, "append functions")) {
				t.Errorf("docs/operations.md: the %s row does not name `%s` (%s)", kind, name, p)
			}
		}
	}
}
