package eventstore_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/lockkey"
	"github.com/annals-dev/annals/internal/schemaname"
	"github.com/annals-dev/annals/migrations"
)

// roleGrant is how a test role is granted: as `annals grant writer` does
// (grantNew), as one older than migration 0035 did, without
// append_events_json (grantOld), or not at all.
type roleGrant int

const (
	grantNone roleGrant = iota
	grantNew
	grantOld
)

// testRole creates a role with a unique name (LOGIN with a password when
// login is set), grants it as g says in db's schema, and drops it when the
// test ends. Roles are the cluster's: the name keeps it apart.
func testRole(t *testing.T, db *annalstest.DB, login bool, g roleGrant) string {
	t.Helper()
	ctx := context.Background()
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "annals_es_" + hex.EncodeToString(b[:])
	ident := pgx.Identifier{name}.Sanitize()
	create := "CREATE ROLE " + ident
	if login {
		create += " LOGIN PASSWORD " + schemaname.Literal(name+"pw")
	}
	if _, err := db.Pool.Exec(ctx, create); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Revoking takes turns with Grant (its advisory lock): concurrent
		// changes of one object's privileges fail.
		err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			k1, k2 := lockkey.Pair(db.Schema + ":grant")
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
	cfg := &migrations.Config{Schema: db.Schema}
	switch g {
	case grantNew:
		if err := migrations.Grant(ctx, db.Pool, name, migrations.Writer, cfg); err != nil {
			t.Fatal(err)
		}
	case grantOld:
		stmts, err := migrations.GrantSQL(name, migrations.Writer, cfg)
		if err != nil {
			t.Fatal(err)
		}
		stmts = slices.DeleteFunc(stmts, func(s string) bool { return strings.Contains(s, ".append_events_json(") })
		for _, s := range stmts {
			if _, err := db.Pool.Exec(ctx, s); err != nil {
				t.Fatalf("%s: %v", s, err)
			}
		}
	}
	return name
}

// rolePool connects a pool as the login role name (testRole's password) to
// db, with tracer (nil: none), closed when the test ends.
func rolePool(t *testing.T, db *annalstest.DB, name string, tracer pgx.QueryTracer) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User, cfg.ConnConfig.Password = name, name+"pw"
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// questions counts the statements that ask which append function a role
// may execute.
type questions struct{ n atomic.Int64 }

func (q *questions) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "has_function_privilege") {
		q.n.Add(1)
	}
	return ctx
}

func (q *questions) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// asSent and asJSONB are an event's data as the client sends it and as
// append_events stores it (jsonb's rendering).
const (
	asSent  = `{"b": 1, "a": 1e2}`
	asJSONB = `{"a": 100, "b": 1}`
)

// appendAs appends one event to stream through AppendTx in a transaction
// of pool that first runs SET LOCAL ROLE role (none if role is ""), and
// returns the data as stored.
func appendAs(t *testing.T, db *annalstest.DB, s *eventstore.Store, pool *pgxpool.Pool, role, stream string) (string, error) {
	t.Helper()
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if role != "" {
			if _, err := tx.Exec(ctx, "SET LOCAL ROLE "+pgx.Identifier{role}.Sanitize()); err != nil {
				return err
			}
		}
		_, err := s.AppendTx(ctx, tx, stream, eventstore.NoStream, eventstore.EventData{Type: "t", Data: json.RawMessage(asSent)})
		return err
	})
	if err != nil {
		return "", err
	}
	return roleStoredData(t, db, stream), nil
}

// transactAs is appendAs through Transact, whose body runs SET LOCAL ROLE.
func transactAs(t *testing.T, db *annalstest.DB, s *eventstore.Store, role, stream string) (string, error) {
	t.Helper()
	_, err := s.Transact(context.Background(), func(ctx context.Context, tx pgx.Tx, b *eventstore.Batch) error {
		if _, err := tx.Exec(ctx, "SET LOCAL ROLE "+pgx.Identifier{role}.Sanitize()); err != nil {
			return err
		}
		return b.Append(stream, eventstore.NoStream, eventstore.EventData{Type: "t", Data: json.RawMessage(asSent)})
	})
	if err != nil {
		return "", err
	}
	return roleStoredData(t, db, stream), nil
}

func roleStoredData(t *testing.T, db *annalstest.DB, stream string) string {
	t.Helper()
	var data string
	if err := db.Pool.QueryRow(context.Background(), `SELECT data::text FROM annals.events WHERE stream_id = $1`, stream).Scan(&data); err != nil {
		t.Fatal(err)
	}
	return data
}

// A Store chooses the function of appends in a transaction by the role
// that appends, not once by its first caller's: with SET ROLE per tenant
// in one session, a role an annals grant older than migration 0035 granted
// (append_events only) appends through append_events (jsonb's spelling), a
// role granted since through append_events_json (as sent), in either order,
// through AppendTx and Transact; and so do transactions of two pools whose
// users are of the two kinds. With one role the Store asks once, not per
// append. The first role's answer was kept for every role: the old one
// first made every later append jsonb's; the new one first made the old
// role's appends fail with a bare 42501.
func TestAppendFunctionPerRole(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	oldTenant := testRole(t, db, false, grantOld)
	newTenant := testRole(t, db, false, grantNew)
	app := testRole(t, db, true, grantNone)
	for _, r := range []string{oldTenant, newTenant} {
		if _, err := db.Pool.Exec(context.Background(), "GRANT "+pgx.Identifier{r}.Sanitize()+" TO "+pgx.Identifier{app}.Sanitize()); err != nil {
			t.Fatal(err)
		}
	}
	appPool := rolePool(t, db, app, nil)
	oldLogin := testRole(t, db, true, grantOld)
	newLogin := testRole(t, db, true, grantNew)
	oldPool, newPool := rolePool(t, db, oldLogin, nil), rolePool(t, db, newLogin, nil)
	want := func(what, got string, err error, data string) {
		t.Helper()
		if err != nil || got != data {
			t.Errorf("%s: stored %s (%v), want %s", what, got, err, data)
		}
	}
	n := 0
	stream := func() string { n++; return fmt.Sprintf("s-%d", n) }

	for _, order := range [][]string{{oldTenant, newTenant}, {newTenant, oldTenant}} {
		s, err := eventstore.New(appPool, nil)
		if err != nil {
			t.Fatal(err)
		}
		for range 2 {
			for _, role := range order {
				data := asSent
				if role == oldTenant {
					data = asJSONB
				}
				got, err := appendAs(t, db, s, appPool, role, stream())
				want("AppendTx as "+role, got, err, data)
				got, err = transactAs(t, db, s, role, stream())
				want("Transact as "+role, got, err, data)
			}
		}
	}

	for _, order := range [][]*pgxpool.Pool{{oldPool, newPool}, {newPool, oldPool}} {
		s, err := eventstore.New(appPool, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, pool := range order {
			data := asSent
			if pool == oldPool {
				data = asJSONB
			}
			got, err := appendAs(t, db, s, pool, "", stream())
			want("AppendTx in a transaction of another session user", got, err, data)
		}
	}

	// One role: one question for the Store's life.
	var q questions
	one := rolePool(t, db, newLogin, &q)
	s, err := eventstore.New(one, nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		got, err := appendAs(t, db, s, one, "", stream())
		want("AppendTx with one role", got, err, asSent)
		got, err = transactAs(t, db, s, newLogin, stream())
		want("Transact with one role", got, err, asSent)
	}
	if got := q.n.Load(); got != 1 {
		t.Errorf("ten appends in transactions with one role asked %d questions about the append function, want 1", got)
	}
}

// wantNotGranted fails t unless err is ErrNotGranted, says what to run and
// still holds PostgreSQL's 42501.
func wantNotGranted(t *testing.T, what string, err error) {
	t.Helper()
	var pgErr *pgconn.PgError
	if !errors.Is(err, eventstore.ErrNotGranted) || !strings.Contains(err.Error(), "annals grant") ||
		!errors.As(err, &pgErr) || pgErr.Code != "42501" {
		t.Errorf("%s: %v, want ErrNotGranted (42501) saying to run annals grant", what, err)
	}
}

// When the privileges change after the Store asked (append_events_json
// taken from the role: what a role an older annals grant granted since
// holds), an append in a transaction fails with ErrNotGranted, not a bare
// 42501, and the next one, the Store having asked again, goes through
// append_events; a lone Append without group commit is sent again at once.
// A role granted nothing gets ErrNotGranted on every path.
func TestAppendNotGranted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	w := testRole(t, db, true, grantNew)
	pool := rolePool(t, db, w, nil)
	s, err := eventstore.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	alone, err := eventstore.New(pool, &eventstore.Config{GroupCommit: eventstore.GroupCommit{Disabled: true}})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := appendAs(t, db, s, pool, "", "before"); err != nil || got != asSent {
		t.Fatalf("AppendTx: stored %s (%v), want %s", got, err, asSent)
	}
	if _, err := alone.Append(ctx, "alone-before", eventstore.NoStream, eventstore.EventData{Type: "t", Data: json.RawMessage(asSent)}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `REVOKE EXECUTE ON FUNCTION annals.append_events_json(text, bigint, json) FROM `+pgx.Identifier{w}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	_, err = appendAs(t, db, s, pool, "", "revoked")
	wantNotGranted(t, "AppendTx after append_events_json was revoked", err)
	if got, err := appendAs(t, db, s, pool, "", "after"); err != nil || got != asJSONB {
		t.Errorf("the next AppendTx: stored %s (%v), want %s", got, err, asJSONB)
	}
	if _, err := alone.Append(ctx, "alone-after", eventstore.NoStream, eventstore.EventData{Type: "t", Data: json.RawMessage(asSent)}); err != nil {
		t.Errorf("Append without group commit after append_events_json was revoked: %v", err)
	} else if got := roleStoredData(t, db, "alone-after"); got != asJSONB {
		t.Errorf("Append without group commit stored %s, want %s", got, asJSONB)
	}

	nobody := testRole(t, db, true, grantNone)
	if _, err := db.Pool.Exec(ctx, `GRANT USAGE ON SCHEMA annals TO `+pgx.Identifier{nobody}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	np := rolePool(t, db, nobody, nil)
	ns, err := eventstore.New(np, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = appendAs(t, db, ns, np, "", "nobody")
	wantNotGranted(t, "AppendTx by a role granted nothing", err)
	_, err = transactAs(t, db, ns, nobody, "nobody")
	wantNotGranted(t, "Transact by a role granted nothing", err)
	for _, n := range []int{1, 2} {
		events := slices.Repeat([]eventstore.EventData{{Type: "t", Data: json.RawMessage(`{}`)}}, n)
		_, err = ns.Append(ctx, "nobody", eventstore.Any, events...)
		wantNotGranted(t, fmt.Sprintf("Append of %d events by a role granted nothing", n), err)
	}
	assertNoStream(t, db, "revoked", "nobody")
}

func assertNoStream(t *testing.T, db *annalstest.DB, streams ...string) {
	t.Helper()
	var n int
	if err := db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM annals.events WHERE stream_id = ANY($1)`, streams).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("%d events stored in %v, want none", n, streams)
	}
}

// tracedPool connects a pool as db's own user (a superuser on the test
// cluster), with tracer, closed when the test ends.
func tracedPool(t *testing.T, db *annalstest.DB, tracer pgx.QueryTracer, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = tracer
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	var super bool
	if err := pool.QueryRow(context.Background(), `SELECT rolsuper FROM pg_roles WHERE rolname = session_user`).Scan(&super); err != nil {
		t.Fatal(err)
	}
	if !super {
		t.Fatal("the test database's user is not a superuser: this test needs one")
	}
	return pool
}

// A superuser's session asks once about the append function, whatever
// roles of the cluster an older annals grant granted: a superuser may
// execute any function, and the Store tells by the is_superuser the
// server reports whether the role in effect is one. Only once it takes a
// role of the other kind by SET ROLE is that role asked about, per
// transaction, and its appends go through its function. It asked in every
// transaction: pg_has_role makes a superuser a member of every role, so one
// old-granted role anywhere put every superuser session (owners,
// development set-ups) in the mode that asks per transaction.
func TestAppendFunctionSuperuser(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	oldTenant := testRole(t, db, false, grantOld)
	newTenant := testRole(t, db, false, grantNew)
	var q questions
	pool := tracedPool(t, db, &q, 0)
	s, err := eventstore.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	stream := func() string { n++; return fmt.Sprintf("super-%d", n) }
	for range 5 {
		if got, err := appendAs(t, db, s, pool, "", stream()); err != nil || got != asSent {
			t.Fatalf("AppendTx as the superuser: stored %s (%v), want %s", got, err, asSent)
		}
	}
	if got := q.n.Load(); got != 1 {
		t.Errorf("five appends of a superuser asked %d questions about the append function, want 1", got)
	}
	for _, role := range []string{oldTenant, newTenant, oldTenant} {
		data := asSent
		if role == oldTenant {
			data = asJSONB
		}
		got, err := appendAs(t, db, s, pool, role, stream())
		if err != nil || got != data {
			t.Errorf("AppendTx after SET ROLE %s: stored %s (%v), want %s", role, got, err, data)
		}
		got, err = transactAs(t, db, s, role, stream())
		if err != nil || got != data {
			t.Errorf("Transact with SET ROLE %s: stored %s (%v), want %s", role, got, err, data)
		}
	}
	before := q.n.Load()
	for range 3 {
		if got, err := appendAs(t, db, s, pool, "", stream()); err != nil || got != asSent {
			t.Errorf("AppendTx as the superuser again: stored %s (%v), want %s", got, err, asSent)
		}
	}
	if got := q.n.Load() - before; got != 0 {
		t.Errorf("appends of the superuser after its SET ROLEs asked %d questions, want none", got)
	}
}

// Behind a proxy that does not report the session's user, the Store keeps
// its answer per connection: sessions of users of both kinds each append
// through their own function, in either order, and one connection asks
// once. Every such session shared the answer of the empty user, so the
// first one's held for all: an old-granted user's first made a new one's
// appends jsonb's rendering, a new one's first made an old one's fail.
func TestAppendFunctionUnreportedSessionUser(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	oldLogin := testRole(t, db, true, grantOld)
	newLogin := testRole(t, db, true, grantNew)
	var q questions
	oldPool, newPool := rolePool(t, db, oldLogin, nil), rolePool(t, db, newLogin, &q)
	n := 0
	stream := func() string { n++; return fmt.Sprintf("unreported-%d", n) }
	for _, order := range [][]*pgxpool.Pool{{oldPool, newPool}, {newPool, oldPool}} {
		s, err := eventstore.New(oldPool, nil)
		if err != nil {
			t.Fatal(err)
		}
		eventstore.UnreportedSessionUser(s)
		for range 2 {
			for _, pool := range order {
				data := asSent
				if pool == oldPool {
					data = asJSONB
				}
				got, err := appendAs(t, db, s, pool, "", stream())
				if err != nil || got != data {
					t.Errorf("AppendTx by a session whose user is not reported: stored %s (%v), want %s", got, err, data)
				}
			}
		}
	}

	q.n.Store(0)
	one := rolePool(t, db, newLogin, &q) // appendAs uses one connection at a time: the pool's one idle
	s, err := eventstore.New(one, nil)
	if err != nil {
		t.Fatal(err)
	}
	eventstore.UnreportedSessionUser(s)
	for range 5 {
		if got, err := appendAs(t, db, s, one, "", stream()); err != nil || got != asSent {
			t.Errorf("AppendTx on one connection: stored %s (%v), want %s", got, err, asSent)
		}
	}
	if got := q.n.Load(); got != 1 {
		t.Errorf("five appends on one connection whose user is not reported asked %d questions, want 1", got)
	}
}

// statements records what a session sends, statement by statement, named
// by kind: BEGIN, COMMIT, ROLLBACK, "function" (AppendFunction),
// "role" (AppendJSONUsable), "append" (the append), others "other".
type statements struct {
	mu  sync.Mutex
	all []string
}

func (r *statements) add(sql string) {
	kind := "other"
	switch u := strings.ToUpper(strings.TrimSpace(sql)); {
	case u == "BEGIN" || u == "COMMIT" || u == "ROLLBACK":
		kind = u
	case strings.Contains(sql, "bool_and"):
		kind = "function"
	case strings.Contains(sql, "has_function_privilege"):
		kind = "role"
	case strings.Contains(sql, ".append_events"):
		kind = "append"
	}
	r.mu.Lock()
	r.all = append(r.all, kind)
	r.mu.Unlock()
}

func (r *statements) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	all := r.all
	r.all = nil
	return all
}

func (r *statements) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	r.add(d.SQL)
	return ctx
}
func (r *statements) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (r *statements) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}
func (r *statements) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	r.add(d.SQL)
}
func (r *statements) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// A lone append (no group commit) by a session user that may take roles
// of both kinds asks about the role in effect and appends in one
// transaction: BEGIN, the question, the append, COMMIT. A proxy that pools
// transactions runs them on one server session, so the append goes
// through the function of the role the question saw, even one a pooled
// session was left with by SET ROLE (simulated here by each connection's
// first statement). They were two statements of their own, which such a
// proxy may run on two server sessions with different roles.
func TestAppendAloneAsksInItsTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	oldTenant := testRole(t, db, false, grantOld)
	app := testRole(t, db, true, grantNew)
	if _, err := db.Pool.Exec(ctx, "GRANT "+pgx.Identifier{oldTenant}.Sanitize()+" TO "+pgx.Identifier{app}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	var rec statements
	pool := rolePool(t, db, app, &rec)
	s, err := eventstore.New(pool, &eventstore.Config{GroupCommit: eventstore.GroupCommit{Disabled: true}})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		stream := fmt.Sprintf("alone-%d", i)
		if _, err := s.Append(ctx, stream, eventstore.NoStream, eventstore.EventData{Type: "t", Data: json.RawMessage(asSent)}); err != nil {
			t.Fatal(err)
		}
		if got := roleStoredData(t, db, stream); got != asSent {
			t.Errorf("lone Append %d: stored %s, want %s", i, got, asSent)
		}
		sent := slices.DeleteFunc(rec.take(), func(k string) bool { return k == "other" || k == "function" })
		if want := []string{"BEGIN", "role", "append", "COMMIT"}; !slices.Equal(sent, want) {
			t.Errorf("lone Append %d sent %v, want %v", i, sent, want)
		}
	}

	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User, cfg.ConnConfig.Password = app, app+"pw"
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, "SET ROLE "+pgx.Identifier{oldTenant}.Sanitize())
		return err
	}
	leaked, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer leaked.Close()
	ls, err := eventstore.New(leaked, &eventstore.Config{GroupCommit: eventstore.GroupCommit{Disabled: true}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ls.Append(ctx, "leaked", eventstore.NoStream, eventstore.EventData{Type: "t", Data: json.RawMessage(asSent)}); err != nil {
		t.Fatal(err)
	}
	if got := roleStoredData(t, db, "leaked"); got != asJSONB {
		t.Errorf("lone Append in a session left with SET ROLE %s: stored %s, want %s", oldTenant, got, asJSONB)
	}
	var idle int32
	for _, c := range leaked.AcquireAllIdle(ctx) {
		if c.Conn().PgConn().TxStatus() == 'I' {
			idle++
		}
		c.Release()
	}
	if idle == 0 {
		t.Error("the lone append's connection did not come back to the pool idle")
	}
}

// A superuser behind a proxy that reports neither session_authorization nor
// is_superuser, on a cluster where one role was granted by an older annals
// grant (append_events only): the role in effect may be a superuser or not,
// so the answer covers every role, superusers included, and the
// superuser's events are stored as sent, not as jsonb renders them (the
// answer over the other roles alone said append_events).
func TestAppendFunctionSuperuserUnreported(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	_ = testRole(t, db, false, grantOld)
	pool := tracedPool(t, db, nil, 0)
	s, err := eventstore.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	eventstore.UnreportedSessionUser(s)
	for i := range 3 {
		got, err := appendAs(t, db, s, pool, "", fmt.Sprintf("super-unreported-%d", i))
		if err != nil || got != asSent {
			t.Errorf("AppendTx %d as a superuser whose is_superuser is not reported: stored %s (%v), want %s", i, got, err, asSent)
		}
	}
}
