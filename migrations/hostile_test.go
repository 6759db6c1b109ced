package migrations_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/schemaname"
	"github.com/annals-dev/annals/migrations"
)

// TestHostileSchemaNames migrates, appends, reads and listens under schema
// names built to break out of a quoted identifier or literal. The injected
// part of each calls nextval on a marker sequence, which no rollback undoes:
// if any statement that annals renders (a migration, the append function's
// body, a query) ran it, the marker has moved. Each name is tried with
// standard_conforming_strings on and off (off makes backslashes in ordinary
// literals escape characters).
func TestHostileSchemaNames(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	names := []string{
		`q'||nextval('public.injected')::text||'`,      // the reported injection
		`a\'||nextval('public.injected')::text||'`,     // backslash before the quote
		`x"; SELECT nextval('public.injected'); --`,    // identifier break-out, ; and --
		`x'); SELECT nextval('public.injected'); --`,   // literal break-out
		`y\\'; SELECT nextval(E'public.injected'); /*`, // \\ and an open comment
		`Ünïcødé ✓ 日本語 'quoted' "twice"`,               // unicode and quotes
		strings.Repeat("é", schemaname.MaxLen/2),       // exactly MaxLen bytes, multi-byte
		strings.Repeat(`'\`, schemaname.MaxLen/2),      // exactly MaxLen bytes of quotes and backslashes
		`select`, // a keyword
	}
	for _, conforming := range []string{"on", "off"} {
		t.Run("standard_conforming_strings="+conforming, func(t *testing.T) {
			t.Parallel()
			db := annalstest.NewDB(t, nil)
			pool := poolWith(t, db.URL, conforming)
			if _, err := db.Pool.Exec(ctx, `CREATE SEQUENCE public.injected`); err != nil {
				t.Fatal(err)
			}
			for _, name := range names {
				if len(name) > schemaname.MaxLen {
					t.Fatalf("test name %q is %d bytes, over MaxLen", name, len(name))
				}
				migrateAndUse(t, pool, name)
			}
			var called bool
			if err := db.Pool.QueryRow(ctx, `SELECT is_called FROM public.injected`).Scan(&called); err != nil || called {
				t.Fatalf("an injected statement ran (marker sequence called: %v, %v)", called, err)
			}
		})
	}
}

// poolWith returns a pool on url whose sessions have the given
// standard_conforming_strings.
func poolWith(t *testing.T, url, conforming string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["standard_conforming_strings"] = conforming
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	var got string
	if err := pool.QueryRow(context.Background(), `SHOW standard_conforming_strings`).Scan(&got); err != nil || got != conforming {
		t.Fatalf("standard_conforming_strings = %q (%v), want %q", got, err, conforming)
	}
	return pool
}

// migrateAndUse migrates schema name, appends two events through the Go
// store, one through the SQL function and one in a transaction (through
// append_events_json, looked up by the schema's name first), reads them
// back, and checks that the append's NOTIFY arrives on the schema's channel.
func migrateAndUse(t *testing.T, pool *pgxpool.Pool, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := &migrations.Config{Schema: name}
	if _, err := migrations.Up(ctx, pool, cfg); err != nil {
		t.Fatalf("Up(%q): %v", name, err)
	}
	if _, err := migrations.Up(ctx, pool, cfg); err != nil {
		t.Fatalf("second Up(%q): %v", name, err)
	}
	states, err := migrations.Status(ctx, pool, cfg)
	if err != nil {
		t.Fatalf("Status(%q): %v", name, err)
	}
	for _, s := range states {
		if !s.Applied {
			t.Fatalf("Status(%q): migration %d not applied", name, s.Version)
		}
	}
	var exists int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_namespace WHERE nspname = $1`, name).Scan(&exists); err != nil || exists != 1 {
		t.Fatalf("schema %q not created exactly as named (%d, %v)", name, exists, err)
	}

	listener, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = listener.Close(context.Background()) }()
	if _, err := listener.Exec(ctx, "LISTEN "+schemaname.Ident(schemaname.Channel(name))); err != nil {
		t.Fatal(err)
	}

	store, err := eventstore.New(pool, &eventstore.Config{Schema: name})
	if err != nil {
		t.Fatal(err)
	}
	res, err := store.Append(ctx, "s-"+name, eventstore.NoStream,
		eventstore.EventData{Type: "t", Data: json.RawMessage(`{"n":1}`)},
		eventstore.EventData{Type: "t", Data: json.RawMessage(`{"n":2}`)})
	if err != nil {
		t.Fatalf("Append in %q: %v", name, err)
	}
	if res.StreamVersion != 2 || res.Events[1].GlobalSequence != 2 {
		t.Fatalf("Append in %q: %+v", name, res)
	}
	n, err := listener.WaitForNotification(ctx)
	if err != nil || n.Channel != schemaname.Channel(name) || n.Payload != "2" {
		t.Fatalf("NOTIFY in %q: %+v, %v", name, n, err)
	}
	var pos int64
	if err := pool.QueryRow(ctx, `SELECT global_sequence FROM `+schemaname.Ident(name)+`.append_events('sql', 0, '[{"type":"t","data":{}}]')`).Scan(&pos); err != nil || pos != 3 {
		t.Fatalf("SQL append in %q: %d, %v", name, pos, err)
	}
	const raw = `{"b": 1, "a": 1e2}`
	if _, err := store.Transact(ctx, func(_ context.Context, _ pgx.Tx, b *eventstore.Batch) error {
		return b.Append("tx", eventstore.NoStream, eventstore.EventData{Type: "t", Data: json.RawMessage(raw)})
	}); err != nil {
		t.Fatalf("Transact in %q: %v", name, err)
	}
	var got []int64
	var last string
	for e, err := range store.ReadAll(ctx, 0) {
		if err != nil {
			t.Fatalf("ReadAll in %q: %v", name, err)
		}
		got = append(got, e.GlobalSequence)
		last = string(e.Data)
	}
	if !slices.Equal(got, []int64{1, 2, 3, 4}) || last != raw {
		t.Fatalf("ReadAll in %q: positions %v, the last data %s (want %s)", name, got, last, raw)
	}
}

// TestRefusedSchemaNameLeavesNothing: names that annals refuses are refused
// before any SQL, so no schema or table appears.
func TestRefusedSchemaNameLeavesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	before := namespaces(t, db.Pool)
	for _, bad := range []string{
		`a$$b`, `x$fn$; DROP SCHEMA public CASCADE; --`, `$1`, // '$' (dollar-quoted bodies)
		"nul\x00byte", "\xff\xfe", // not storable in PostgreSQL
		"t1\nCREATE TABLE injected(who text);--", "cr\rSELECT 1;--", // a line break ends the "--" comments that name the schema
		strings.Repeat("a", schemaname.MaxLen+1), strings.Repeat("é", schemaname.MaxLen/2) + "x",
	} {
		if _, err := migrations.Up(ctx, db.Pool, &migrations.Config{Schema: bad}); !errors.Is(err, schemaname.ErrInvalid) {
			t.Errorf("Up(%q) = %v, want ErrInvalid", bad, err)
		}
		if _, err := migrations.Status(ctx, db.Pool, &migrations.Config{Schema: bad}); !errors.Is(err, schemaname.ErrInvalid) {
			t.Errorf("Status(%q) = %v, want ErrInvalid", bad, err)
		}
		if _, err := eventstore.New(db.Pool, &eventstore.Config{Schema: bad}); !errors.Is(err, schemaname.ErrInvalid) {
			t.Errorf("eventstore.New(%q) = %v, want ErrInvalid", bad, err)
		}
	}
	if after := namespaces(t, db.Pool); !slices.Equal(before, after) {
		t.Fatalf("schemas changed from %q to %q", before, after)
	}
	var injected bool
	if err := db.Pool.QueryRow(ctx, `SELECT to_regclass('public.injected') IS NOT NULL`).Scan(&injected); err != nil || injected {
		t.Fatalf("a schema name's SQL ran: public.injected exists (%v)", err)
	}
}

// TestFailedUpLeavesNothing: Up into a schema that already holds a table of
// the same name as one of annals' fails at that migration, and everything the
// earlier migrations of the same call made is rolled back, the schema's own
// table untouched.
func TestFailedUpLeavesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	if _, err := db.Pool.Exec(ctx, `CREATE SCHEMA app; CREATE TABLE app.checkpoints (mine int); INSERT INTO app.checkpoints VALUES (7)`); err != nil {
		t.Fatal(err)
	}
	if _, err := migrations.Up(ctx, db.Pool, &migrations.Config{Schema: "app"}); err == nil {
		t.Fatal("Up into a schema with a conflicting table succeeded")
	}
	if objs := objectsIn(t, db.Pool, "app"); !slices.Equal(objs, []string{"checkpoints"}) {
		t.Fatalf("after a failed Up, schema app holds %q, want only its own table", objs)
	}
	var mine int
	if err := db.Pool.QueryRow(ctx, `SELECT mine FROM app.checkpoints`).Scan(&mine); err != nil || mine != 7 {
		t.Fatalf("the schema's own table changed: %d, %v", mine, err)
	}
}

// namespaces lists the database's schema names.
func namespaces(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	var out []string
	rows, err := pool.Query(context.Background(), `SELECT nspname FROM pg_namespace ORDER BY nspname`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// objectsIn lists the relations, functions and types in schema, sorted.
func objectsIn(t *testing.T, pool *pgxpool.Pool, schema string) []string {
	t.Helper()
	var out []string
	rows, err := pool.Query(context.Background(), `
		SELECT relname FROM pg_class WHERE relnamespace = $1::regnamespace AND relkind <> 'i'
		UNION ALL SELECT proname FROM pg_proc WHERE pronamespace = $1::regnamespace
		UNION ALL SELECT typname FROM pg_type WHERE typnamespace = $1::regnamespace AND typrelid = 0 AND typelem = 0
		ORDER BY 1`, schemaname.Ident(schema))
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
