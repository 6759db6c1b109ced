package migrations_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/migrations"
)

// TestGrantUpgrade0029: roles granted by an `annals grant` older than 0029
// (operators with SELECT on snapshots, which hold aggregates' decrypted
// state; writers, runners and operators with INSERT on the whole of
// personal_keys, which let them plant backdated erasure records) hold,
// after 0029, exactly what `annals grant` gives a new role of their kinds.
// A role that is operator and writer keeps reading snapshots (it loads
// aggregates), and a role granted SELECT on snapshots by hand, not an
// operator, is left alone.
func TestGrantUpgrade0029(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	cfg := &migrations.Config{Schema: `Grants "Old"`}
	schema := pgx.Identifier{cfg.Schema}.Sanitize()
	if _, err := migrations.UpWith(ctx, db.Pool, cfg, func(ms []migrations.Migration) []migrations.Migration {
		return ms[:28] // through 0028
	}); err != nil {
		t.Fatal(err)
	}
	exec := func(stmts ...string) {
		t.Helper()
		for _, s := range stmts {
			if _, err := db.Pool.Exec(ctx, s); err != nil {
				t.Fatalf("%s: %v", s, err)
			}
		}
	}
	// What `annals grant` ran before 0029: today's statements, but INSERT
	// on the whole keys table, and SELECT on snapshots for operators.
	oldGrant := func(r *role, kinds ...migrations.RoleKind) {
		t.Helper()
		for _, k := range kinds {
			stmts, err := migrations.GrantSQL(r.Name, k, cfg)
			if err != nil {
				t.Fatal(err)
			}
			// Functions and tables added after 0028: their migrations
			// grant them to the roles that may do what they serve (0034,
			// 0035, 0036).
			stmts = slices.DeleteFunc(stmts, func(s string) bool {
				return strings.Contains(s, ".inline_stream_lock(") || strings.Contains(s, ".snapshot_lock(") ||
					strings.Contains(s, ".append_events_json(") || strings.Contains(s, ".relay_acks ")
			})
			replaced := false
			for i, s := range stmts {
				if o := strings.Replace(s, "GRANT INSERT (subject, wrapped_key) ON ", "GRANT INSERT ON ", 1); o != s {
					stmts[i], replaced = o, true
				}
			}
			if !replaced && k != migrations.Reader {
				t.Fatalf("%s: no column grant on personal_keys to turn back into the old table grant", k)
			}
			if k == migrations.Operator {
				stmts = append(stmts, "GRANT SELECT ON "+schema+".snapshots TO "+pgx.Identifier{r.Name}.Sanitize())
			}
			exec(stmts...)
		}
	}
	newGrant := func(r *role, kinds ...migrations.RoleKind) {
		t.Helper()
		for _, k := range kinds {
			if err := migrations.Grant(ctx, db.Pool, r.Name, k, cfg); err != nil {
				t.Fatal(err)
			}
		}
	}
	kinds := [][]migrations.RoleKind{
		{migrations.Reader}, {migrations.Writer}, {migrations.Runner}, {migrations.Operator},
		{migrations.Operator, migrations.Writer},
	}
	var olds []*role
	for _, ks := range kinds {
		r := newRole(t, db, "")
		oldGrant(r, ks...)
		olds = append(olds, r)
	}
	byHand := newRole(t, db, "")
	exec("GRANT USAGE ON SCHEMA " + schema + " TO " + pgx.Identifier{byHand.Name}.Sanitize())
	exec("GRANT SELECT ON " + schema + ".snapshots TO " + pgx.Identifier{byHand.Name}.Sanitize())
	// Before: the operator reads snapshots, every appender inserts any row.
	if !tablePriv(t, db, olds[3].Name, schema+".snapshots", "SELECT") || !tablePriv(t, db, olds[1].Name, schema+".personal_keys", "INSERT") {
		t.Fatal("the old grants are not what the test means to upgrade")
	}

	if _, err := migrations.Up(ctx, db.Pool, cfg); err != nil {
		t.Fatal(err)
	}
	for i, ks := range kinds {
		fresh := newRole(t, db, "")
		newGrant(fresh, ks...)
		got, want := schemaPrivileges(t, db, cfg.Schema, olds[i].Name), schemaPrivileges(t, db, cfg.Schema, fresh.Name)
		if !slices.Equal(got, want) {
			t.Errorf("%v granted before 0029, after it:\n  %s\nwant what annals grant gives now:\n  %s", ks,
				strings.Join(got, "\n  "), strings.Join(want, "\n  "))
		}
	}
	if !tablePriv(t, db, olds[4].Name, schema+".snapshots", "SELECT") {
		t.Error("an operator that is also a writer lost SELECT on snapshots")
	}
	if !tablePriv(t, db, byHand.Name, schema+".snapshots", "SELECT") {
		t.Error("a role granted SELECT on snapshots by hand, no operator, lost it")
	}

	// At work: the upgraded operator cannot read a snapshot; the upgraded
	// writer creates keys through eventstore but cannot forge a tombstone.
	exec(`INSERT INTO ` + schema + `.snapshots (aggregate_type, stream_id, schema_version, stream_version, state)
	      VALUES ('member', 'member-m-1', 1, 1, '{"name":"Ada"}')`)
	for _, q := range []string{"SELECT state FROM " + schema + ".snapshots", "SELECT count(*) FROM " + schema + ".snapshots"} {
		_, err := olds[3].Pool.Exec(ctx, q)
		mustDeny(t, "upgraded operator: "+q, err)
	}
	kek, err := eventstore.NewLocalKEK(make([]byte, 32))
	if err != nil {
		t.Fatal(err)
	}
	reg := eventstore.NewRegistry()
	eventstore.MustRegister[memberJoined](reg, "member.joined", eventstore.PersonalData("MemberID"))
	ws, err := eventstore.New(olds[1].Pool, &eventstore.Config{Schema: cfg.Schema, Registry: reg, KEK: kek})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ws.Append(ctx, "member-m-1", eventstore.NoStream, eventstore.NewEvent(memberJoined{MemberID: "m-1", Name: "Ada"})); err != nil {
		t.Fatalf("upgraded writer appends personal data: %v", err)
	}
	_, err = olds[1].Pool.Exec(ctx, `INSERT INTO `+schema+`.personal_keys (subject, wrapped_key, created_at, forgotten_at)
		VALUES ('m-9', NULL, '2019-01-01', '2019-01-02')`)
	mustDeny(t, "upgraded writer forges a tombstone", err)
}

// TestGrantUpgrade0035: a writer granted before migration 0035 may execute
// append_events_json after it (the migration grants it to every role that
// may execute append_events), so its appends in a transaction keep their
// bytes without annals grant running again; and a role that may execute
// append_events only (as an older annals grant leaves a role it grants
// after 0035) still appends in transactions, through append_events, with
// the data as jsonb renders it, as before 0035.
func TestGrantUpgrade0035(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	cfg := &migrations.Config{Schema: `Grants "0035"`}
	schema := pgx.Identifier{cfg.Schema}.Sanitize()
	if _, err := migrations.UpWith(ctx, db.Pool, cfg, func(ms []migrations.Migration) []migrations.Migration {
		return ms[:34] // through 0034
	}); err != nil {
		t.Fatal(err)
	}
	// What `annals grant writer` ran before 0035.
	oldGrant := func(r *role) {
		t.Helper()
		stmts, err := migrations.GrantSQL(r.Name, migrations.Writer, cfg)
		if err != nil {
			t.Fatal(err)
		}
		n := len(stmts)
		stmts = slices.DeleteFunc(stmts, func(s string) bool {
			return strings.Contains(s, ".append_events_json(")
		})
		if len(stmts) != n-1 {
			t.Fatalf("GrantSQL(writer) has %d statements on append_events_json, want 1", n-len(stmts))
		}
		for _, s := range stmts {
			if _, err := db.Pool.Exec(ctx, s); err != nil {
				t.Fatalf("%s: %v", s, err)
			}
		}
	}
	before := newRole(t, db, "")
	oldGrant(before)
	if _, err := migrations.Up(ctx, db.Pool, cfg); err != nil {
		t.Fatal(err)
	}
	after := newRole(t, db, "")
	oldGrant(after)

	const raw = `{"b": 1, "a": 1e2}`
	for _, c := range []struct {
		r      *role
		stored string
	}{{before, raw}, {after, `{"a": 100, "b": 1}`}} {
		store, err := eventstore.New(c.r.Pool, &eventstore.Config{Schema: cfg.Schema})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := store.Transact(ctx, func(_ context.Context, _ pgx.Tx, b *eventstore.Batch) error {
			return b.Append("s-"+c.r.Name, eventstore.NoStream, eventstore.EventData{Type: "t", Data: json.RawMessage(raw)})
		}); err != nil {
			t.Fatalf("%s appends in a transaction: %v", c.r.Name, err)
		}
		var data string
		if err := db.Pool.QueryRow(ctx, `SELECT data::text FROM `+schema+`.events WHERE stream_id = $1`, "s-"+c.r.Name).Scan(&data); err != nil {
			t.Fatal(err)
		}
		if data != c.stored {
			t.Errorf("%s's event stored as %s, want %s", c.r.Name, data, c.stored)
		}
	}
}

// tablePriv reports whether role holds priv on the whole table (qualified,
// quoted).
func tablePriv(t *testing.T, db *annalstest.DB, role, table, priv string) bool {
	t.Helper()
	var ok bool
	if err := db.Pool.QueryRow(context.Background(), "SELECT has_table_privilege($1, $2::regclass, $3)", role, table, priv).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

// schemaPrivileges lists what role was granted directly in schema, from the
// ACLs: "schema USAGE", "personal_keys INSERT", "personal_keys(subject)
// INSERT", "append_one(...) EXECUTE", sorted.
func schemaPrivileges(t *testing.T, db *annalstest.DB, schema, role string) []string {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), `
		WITH me AS (SELECT oid FROM pg_roles WHERE rolname = $2)
		SELECT 'schema ' || a.privilege_type
		  FROM pg_namespace n, aclexplode(n.nspacl) a, me
		 WHERE n.nspname = $1 AND a.grantee = me.oid
		UNION ALL
		SELECT c.relname || ' ' || a.privilege_type
		  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace, aclexplode(c.relacl) a, me
		 WHERE n.nspname = $1 AND a.grantee = me.oid
		UNION ALL
		SELECT c.relname || '(' || att.attname || ') ' || a.privilege_type
		  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		       JOIN pg_attribute att ON att.attrelid = c.oid, aclexplode(att.attacl) a, me
		 WHERE n.nspname = $1 AND a.grantee = me.oid
		UNION ALL
		SELECT p.oid::regprocedure::text || ' ' || a.privilege_type
		  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace, aclexplode(p.proacl) a, me
		 WHERE n.nspname = $1 AND a.grantee = me.oid
		 ORDER BY 1`, schema, role)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return got
}
