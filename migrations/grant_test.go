package migrations_test

import (
	"context"
	stderrors "errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/checkpoint"
	"github.com/annals-dev/annals/deadletter"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/migrations"
	"github.com/annals-dev/annals/projection"
	"github.com/annals-dev/annals/saga"
	"github.com/annals-dev/annals/scheduler"
)

// grantRE splits a GRANT statement into its privileges and its objects.
var grantRE = regexp.MustCompile(`^GRANT (.+?) ON (?:SCHEMA |SEQUENCE |FUNCTION )?(.+?) TO `)

func TestGrantSQL(t *testing.T) {
	t.Parallel()
	t.Run("KindsAndQuoting", func(t *testing.T) {
		t.Parallel()
		const hostile = "app\"; DROP TABLE x; --\nnext"
		for _, k := range migrations.RoleKinds {
			stmts, err := migrations.GrantSQL(hostile, k, &migrations.Config{Schema: `My "S"`})
			if err != nil {
				t.Fatal(err)
			}
			if len(stmts) == 0 {
				t.Fatalf("%s: no statements", k)
			}
			for _, s := range stmts {
				if !strings.HasPrefix(s, "GRANT ") || !strings.HasSuffix(s, ` TO "app""; DROP TABLE x; --`+"\nnext\";") {
					t.Errorf("%s: statement does not end with the quoted role: %q", k, s)
				}
				// The locks groups name PostgreSQL's advisory-lock
				// functions, which are the database's, not the schema's.
				if !strings.Contains(s, `"My ""S"""`) && !strings.HasPrefix(s, "GRANT EXECUTE ON FUNCTION pg_catalog.pg_") {
					t.Errorf("%s: statement does not name the quoted schema: %q", k, s)
				}
				m := grantRE.FindStringSubmatch(s)
				if m == nil {
					t.Errorf("%s: not a GRANT ... ON ... TO: %q", k, s)
					continue
				}
				for _, obj := range strings.Split(m[2], ", ") {
					if obj != `"My ""S""".events` && obj != `"My ""S""".streams` {
						continue
					}
					for _, w := range []string{"INSERT", "UPDATE", "DELETE", "TRUNCATE", "TRIGGER", "REFERENCES", "ALL"} {
						if strings.Contains(m[1], w) {
							t.Errorf("%s: grants %s on the log: %q", k, w, s)
						}
					}
				}
			}
		}
	})
	t.Run("BadInput", func(t *testing.T) {
		t.Parallel()
		if _, err := migrations.GrantSQL("app", "admin", nil); !errors.Is(err, migrations.ErrInvalidRoleKind) {
			t.Errorf("kind admin: %v, want ErrInvalidRoleKind", err)
		}
		if _, err := migrations.GrantSQL("", migrations.Writer, nil); !errors.Is(err, migrations.ErrInvalidRoleKind) {
			t.Errorf("empty role: %v, want ErrInvalidRoleKind", err)
		}
		if k, err := migrations.ParseRoleKind(" Operator "); err != nil || k != migrations.Operator {
			t.Errorf("ParseRoleKind(Operator) = %q, %v", k, err)
		}
		if _, err := migrations.ParseRoleKind("root"); !errors.Is(err, migrations.ErrInvalidRoleKind) {
			t.Errorf("ParseRoleKind(root): %v, want ErrInvalidRoleKind", err)
		}
	})
	t.Run("RoleMustExist", func(t *testing.T) {
		t.Parallel()
		db := annalstest.NewDB(t, nil)
		err := migrations.Grant(context.Background(), db.Pool, "annals_nobody_here", migrations.Reader, nil)
		// The cause first, then what to do.
		const want = `migrations: role "annals_nobody_here" does not exist: create it first (CREATE ROLE "annals_nobody_here" LOGIN ...)`
		// The standard library's errors.Is finds it as well.
		if !errors.Is(err, migrations.ErrRoleNotFound) || !stderrors.Is(err, migrations.ErrRoleNotFound) || err.Error() != want {
			t.Fatalf("grant to a missing role: %v, want ErrRoleNotFound reading %q", err, want)
		}
	})
}

// TestAppendFunctionsRunAsOwner checks the catalog after every migration:
// each function of the schema that can write (VOLATILE: PostgreSQL refuses
// writes in STABLE and IMMUTABLE functions; trigger functions aside) is
// SECURITY DEFINER with a pinned search_path and no EXECUTE for PUBLIC, and
// a writer and a runner get EXECUTE on every one of them. A later migration
// that redefines append_events without SECURITY DEFINER (CREATE OR REPLACE
// resets it), or a new append function that grant.sql does not list, fails
// here.
func TestAppendFunctionsRunAsOwner(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	rows, err := db.Pool.Query(ctx, `
		SELECT p.oid::regprocedure::text, p.proname, p.prosecdef, coalesce(array_to_string(p.proconfig, ','), ''),
		       has_function_privilege('public', p.oid, 'EXECUTE')
		  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		 WHERE n.nspname = $1 AND p.provolatile = 'v' AND p.prorettype <> 'trigger'::regtype
		 ORDER BY 1`, db.Schema)
	if err != nil {
		t.Fatal(err)
	}
	type fn struct {
		sig, name, config string
		definer, public   bool
	}
	fns, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (fn, error) {
		var f fn
		return f, r.Scan(&f.sig, &f.name, &f.definer, &f.config, &f.public)
	})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(fns, func(f fn) bool { return f.name == "append_events" }) {
		t.Fatalf("append_events is not among the volatile functions %v", fns)
	}
	writer := newRole(t, db, migrations.Writer)
	runner := newRole(t, db, migrations.Runner)
	operator := newRole(t, db, migrations.Operator)
	may := func(r *role, sig string) bool {
		var ok bool
		if err := db.Pool.QueryRow(ctx, "SELECT has_function_privilege($1, $2::regprocedure, 'EXECUTE')", r.Name, sig).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	for _, f := range fns {
		if strings.HasPrefix(f.name, "read_model_") {
			// The blue/green DDL functions (migration 0011) create and drop
			// the schemas and views of read models, which the runner's role
			// owns: they run with the caller's rights, on purpose (as the
			// owner they would let a runner create views in any schema), with
			// a pinned search_path, for runners only.
			if f.definer || !strings.HasPrefix(f.config, "search_path=pg_catalog, pg_temp") || f.public {
				t.Errorf("%s: SECURITY DEFINER %v, config %q, PUBLIC %v; want the caller's rights, search_path=pg_catalog, pg_temp, no PUBLIC",
					f.sig, f.definer, f.config, f.public)
			}
			var ok bool
			if err := db.Pool.QueryRow(ctx, "SELECT has_function_privilege($1, $2::regprocedure, 'EXECUTE')", runner.Name, f.sig).Scan(&ok); err != nil || !ok {
				t.Errorf("%s may not execute %s (%v): add it to the run group of grant.sql", runner.Name, f.sig, err)
			}
			continue
		}
		// Other settings may follow the pinned search_path (append_batch
		// also fixes its plan cache mode).
		if !f.definer || !strings.HasPrefix(f.config, "search_path=pg_catalog, pg_temp") {
			t.Errorf("%s: SECURITY DEFINER %v, config %q; want SECURITY DEFINER with search_path=pg_catalog, pg_temp", f.sig, f.definer, f.config)
		}
		if f.public {
			t.Errorf("%s: PUBLIC may execute it", f.sig)
		}
		if f.name == "snapshot_lock" { // snapshot writes: writers only (runners get no snapshots)
			if !may(writer, f.sig) || may(runner, f.sig) {
				t.Errorf("%s: want EXECUTE for the writer only (snapshots group of grant.sql)", f.sig)
			}
			continue
		}
		if f.name == "scavenge" || f.name == "archive" { // remove or move events: operators only
			if !may(operator, f.sig) || may(writer, f.sig) || may(runner, f.sig) {
				t.Errorf("%s: want EXECUTE for the operator only (operate group of grant.sql)", f.sig)
			}
			continue
		}
		for _, r := range []*role{writer, runner} {
			var ok bool
			if err := db.Pool.QueryRow(ctx, "SELECT has_function_privilege($1, $2::regprocedure, 'EXECUTE')", r.Name, f.sig).Scan(&ok); err != nil || !ok {
				t.Errorf("%s may not execute %s (%v): add it to the append group of grant.sql", r.Name, f.sig, err)
			}
		}
	}
}

// TestNoRoleCanWriteTheLog: whatever its kind, a granted role cannot insert,
// change or delete a row of the log (a forged position included), move the
// position sequence, or switch the append-only trigger off.
func TestNoRoleCanWriteTheLog(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, &annalstest.Options{Schema: `Roles "Q"`})
	ctx := context.Background()
	owner, err := eventstore.New(db.Pool, &eventstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := owner.Append(ctx, "real", eventstore.NoStream, eventstore.EventData{Type: "Real", Data: map[string]int{"n": 1}}); err != nil {
		t.Fatal(err)
	}
	events, streams, seq := rel(db, "events"), rel(db, "streams"), rel(db, "events_global_sequence")
	for _, k := range migrations.RoleKinds {
		t.Run(string(k), func(t *testing.T) {
			t.Parallel()
			r := newRole(t, db, k)
			denyAll(t, r,
				fmt.Sprintf(`INSERT INTO %s (global_sequence, event_id, stream_id, stream_version, event_type, data)
				             VALUES (999999, gen_random_uuid(), 'forged', 1, 'Forged', '{}')`, events),
				fmt.Sprintf(`UPDATE %s SET data = '{"n": 2}'`, events),
				fmt.Sprintf(`DELETE FROM %s`, events),
				fmt.Sprintf(`TRUNCATE %s`, events),
				fmt.Sprintf(`INSERT INTO %s (stream_id, version) VALUES ('forged', 1)`, streams),
				fmt.Sprintf(`UPDATE %s SET version = 7`, streams),
				fmt.Sprintf(`DELETE FROM %s`, streams),
				fmt.Sprintf(`TRUNCATE %s`, streams),
				fmt.Sprintf(`SELECT setval('%s', 999999)`, strings.ReplaceAll(seq, "'", "''")),
				fmt.Sprintf(`SELECT nextval('%s')`, strings.ReplaceAll(seq, "'", "''")),
				`SET session_replication_role = replica`,
				fmt.Sprintf(`ALTER TABLE %s DISABLE TRIGGER events_append_only`, events),
				fmt.Sprintf(`ALTER TABLE %s DISABLE TRIGGER ALL`, events),
				fmt.Sprintf(`CREATE TRIGGER sneaky BEFORE INSERT ON %s FOR EACH ROW EXECUTE FUNCTION %s()`, events, rel(db, "events_append_only")),
				fmt.Sprintf(`CREATE TABLE %s (i int)`, rel(db, "mine")),
			)
			// What no statement above tries: REFERENCES (a foreign key
			// that would block a scavenge's delete) and the rest, on the
			// tables or any column, directly or through a role.
			if got := writePrivileges(t, db, r.Name); len(got) != 0 {
				t.Errorf("%s holds %v on the log", r.Name, got)
			}
			var n int
			var head int64
			if err := db.Pool.QueryRow(ctx, fmt.Sprintf("SELECT count(*), max(global_sequence) FROM %s", events)).Scan(&n, &head); err != nil || n != 1 || head != 1 {
				t.Errorf("the log has %d events up to %d (%v), want the one real event", n, head, err)
			}
		})
	}
	// The check sees a privilege granted on one column.
	r := newRole(t, db, migrations.Writer)
	if _, err := db.Pool.Exec(ctx, fmt.Sprintf("GRANT REFERENCES (event_id) ON %s TO %s", events, pgx.Identifier{r.Name}.Sanitize())); err != nil {
		t.Fatal(err)
	}
	if got := writePrivileges(t, db, r.Name); len(got) != 1 || got[0] != "events: column REFERENCES" {
		t.Errorf("a writer granted REFERENCES (event_id) on the events: the check found %v", got)
	}
}

// writePrivileges lists what role may do to the log's tables and sequence
// other than read them: table and column privileges, held directly or
// through membership.
func writePrivileges(t *testing.T, db *annalstest.DB, role string) []string {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), `
		SELECT t.name || ': ' || p.priv
		  FROM (VALUES ('events'), ('streams')) t(name),
		       (VALUES ('INSERT'), ('UPDATE'), ('DELETE'), ('TRUNCATE'), ('REFERENCES'), ('TRIGGER')) p(priv)
		 WHERE has_table_privilege($1, format('%I.%I', $2::text, t.name), p.priv)
		UNION ALL
		SELECT t.name || ': column ' || p.priv
		  FROM (VALUES ('events'), ('streams')) t(name),
		       (VALUES ('INSERT'), ('UPDATE'), ('REFERENCES')) p(priv)
		 WHERE NOT has_table_privilege($1, format('%I.%I', $2::text, t.name), p.priv)
		   AND has_any_column_privilege($1, format('%I.%I', $2::text, t.name), p.priv)
		UNION ALL
		SELECT 'events_global_sequence: ' || p.priv
		  FROM (VALUES ('USAGE'), ('UPDATE')) p(priv)
		 WHERE has_sequence_privilege($1, format('%I.%I', $2::text, 'events_global_sequence'), p.priv)
		 ORDER BY 1`, role, db.Schema)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func TestWriterRole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, &annalstest.Options{Schema: `Roles "Q"`})
	w := newRole(t, db, migrations.Writer)
	store, err := eventstore.New(w.Pool, &eventstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	res, err := store.Append(ctx, "order-1", eventstore.NoStream,
		eventstore.EventData{Type: "Placed", Data: map[string]int{"total": 5}},
		eventstore.EventData{Type: "Paid", Data: map[string]int{"total": 5}})
	if err != nil {
		t.Fatalf("writer append: %v", err)
	}
	if res.Events[1].GlobalSequence != 2 || res.Events[1].StreamVersion != 2 {
		t.Fatalf("append result %+v", res)
	}
	var types []string
	for e, err := range store.ReadStream(ctx, "order-1", 1) {
		if err != nil {
			t.Fatal(err)
		}
		types = append(types, e.Type)
	}
	if !slices.Equal(types, []string{"Placed", "Paid"}) {
		t.Errorf("writer reads %v", types)
	}
	// The rows are the owner's: the function ran with its rights.
	if v, err := store.StreamVersion(ctx, "order-1"); err != nil || v != 2 {
		t.Errorf("stream version %d, %v", v, err)
	}
	// Snapshots: the aggregate package's upsert.
	snap := fmt.Sprintf(`INSERT INTO %s AS s (aggregate_type, stream_id, schema_version, stream_version, state)
		VALUES ('order', 'order-1', 1, 2, '{}')
		ON CONFLICT (aggregate_type, stream_id, schema_version) DO UPDATE
		   SET stream_version = EXCLUDED.stream_version, state = EXCLUDED.state, created_at = EXCLUDED.created_at
		 WHERE s.stream_version < EXCLUDED.stream_version`, rel(db, "snapshots"))
	for range 2 {
		if _, err := w.Pool.Exec(ctx, snap); err != nil {
			t.Fatalf("writer saves a snapshot: %v", err)
		}
	}
	denyAll(t, w,
		fmt.Sprintf(`INSERT INTO %s (subscriber_id) VALUES ('x')`, rel(db, "checkpoints")),
		fmt.Sprintf(`DELETE FROM %s`, rel(db, "snapshots")),
		fmt.Sprintf(`DELETE FROM %s`, rel(db, "dead_letters")),
		fmt.Sprintf(`SELECT * FROM %s`, rel(db, "timers")),
		fmt.Sprintf(`SELECT * FROM %s`, rel(db, "relay_acks")),
	)
}

func TestReaderRole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	owner, err := eventstore.New(db.Pool, &eventstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := owner.Append(ctx, "s", eventstore.NoStream, eventstore.EventData{Type: "T", Data: map[string]int{}}); err != nil {
		t.Fatal(err)
	}
	r := newRole(t, db, migrations.Reader)
	store, err := eventstore.New(r.Pool, &eventstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	var n int
	for _, err := range store.ReadAll(ctx, 0) {
		if err != nil {
			t.Fatal(err)
		}
		n++
	}
	if n != 1 {
		t.Errorf("reader read %d events, want 1", n)
	}
	_, err = store.Append(ctx, "s", eventstore.Any, eventstore.EventData{Type: "T", Data: map[string]int{}})
	mustDeny(t, "reader append", err)

	// Not one table of the schema is writable, not one function that can
	// write (VOLATILE) callable.
	var writable []string
	rows, err := db.Pool.Query(ctx, `
		SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		 WHERE n.nspname = $1 AND c.relkind IN ('r', 'p', 'S')
		   AND (CASE WHEN c.relkind = 'S' THEN has_sequence_privilege($2, c.oid, 'USAGE, UPDATE')
		             ELSE has_table_privilege($2, c.oid, 'INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER') END)
		UNION ALL
		SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		 WHERE n.nspname = $1 AND p.provolatile = 'v' AND p.prorettype <> 'trigger'::regtype
		   AND has_function_privilege($2, p.oid, 'EXECUTE')`, db.Schema, r.Name)
	if err != nil {
		t.Fatal(err)
	}
	if writable, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	if len(writable) > 0 {
		t.Errorf("the reader may write or call %v", writable)
	}
	denyAll(t, r,
		fmt.Sprintf(`INSERT INTO %s (subscriber_id) VALUES ('x')`, rel(db, "checkpoints")),
		fmt.Sprintf(`SELECT * FROM %s`, rel(db, "saga_states")),
	)
}

// fine is the payload of the "Fine" events; sagaState the saga's state.
type (
	fine      struct{}
	sagaState struct{ Seen int }
)

// countingProjection counts the events it handles and whether it was reset.
type countingProjection struct {
	name  string
	n     int
	reset bool
}

func (p *countingProjection) Name() string { return p.name }
func (p *countingProjection) Handle(context.Context, pgx.Tx, eventstore.Event) error {
	p.n++
	return nil
}
func (p *countingProjection) Reset(context.Context, pgx.Tx) error {
	p.reset = true
	return nil
}

// failingObserver fails every event of type "Poison".
type failingObserver struct{ name string }

func (o failingObserver) Name() string { return o.name }
func (o failingObserver) Handle(_ context.Context, e eventstore.Event) error {
	if e.Type == "Poison" {
		return errors.New("poison event")
	}
	return nil
}

// TestRunnerAndOperatorRoles runs a real projection runner, a scheduler and the
// operator's commands under the roles an installation would use: writer
// appends, runner runs, operator acts on the dead letter the runner left.
func TestRunnerAndOperatorRoles(t *testing.T) {
	t.Parallel()
	t.Run("AdvisoryLocksPublic", func(t *testing.T) { t.Parallel(); testRunnerAndOperatorRoles(t, false) })
	// The same once the lock functions are taken from PUBLIC: the grants
	// give each kind the lock functions its statements call.
	t.Run("AdvisoryLocksRestricted", func(t *testing.T) { t.Parallel(); testRunnerAndOperatorRoles(t, true) })
}

func testRunnerAndOperatorRoles(t *testing.T, restricted bool) {
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	w, run, op := newRole(t, db, migrations.Writer), newRole(t, db, migrations.Runner), newRole(t, db, migrations.Operator)
	if restricted {
		restrictAdvisoryLocks(t, db)
	}

	wstore, err := eventstore.New(w.Pool, &eventstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	for i, typ := range []string{"Fine", "Poison", "Fine"} {
		if _, err := wstore.Append(ctx, fmt.Sprintf("s-%d", i), eventstore.NoStream, eventstore.EventData{Type: typ, Data: map[string]int{}}); err != nil {
			t.Fatal(err)
		}
	}

	// The runner: checkpoints, instances, failures and a dead letter; a
	// saga that keeps state, schedules a timer, appends and completes
	// (which cancels the timer).
	rstore, err := eventstore.New(run.Pool, &eventstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	sched, err := scheduler.New(rstore, nil)
	if err != nil {
		t.Fatal(err)
	}
	reg := eventstore.NewRegistry()
	if err := eventstore.Register[fine](reg, "Fine"); err != nil {
		t.Fatal(err)
	}
	sg := saga.New[sagaState]("roles-saga", reg)
	saga.On(sg, func(e eventstore.Envelope[fine]) string { return e.StreamID },
		func(ctx context.Context, inst *saga.Instance[sagaState], e eventstore.Envelope[fine]) error {
			inst.State.Seen++
			if _, err := inst.ScheduleAfter(ctx, time.Hour, "later-"+inst.ID(), eventstore.EventData{Type: "Later", Data: map[string]int{}}); err != nil {
				return err
			}
			if _, err := inst.Append(ctx, "saga-out-"+inst.ID(), eventstore.NoStream, eventstore.EventData{Type: "SagaDid", Data: map[string]int{}}); err != nil {
				return err
			}
			inst.Complete()
			return nil
		})
	const sub = "roles-observer"
	runner, err := projection.NewRunner(run.Pool, &projection.Config{
		Schema:            db.Schema,
		PollInterval:      50 * time.Millisecond,
		LockRetryInterval: 100 * time.Millisecond,
		HeartbeatInterval: 100 * time.Millisecond,
		ShutdownTimeout:   5 * time.Second,
		Retry:             &projection.RetryPolicy{MaxRetries: 1, InitialDelay: time.Millisecond, Jitter: -1},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := runner.Register(failingObserver{sub}, &projection.Options{OnDeadLetter: projection.SkipEvent}); err != nil {
		t.Fatal(err)
	}
	if err := saga.Register(runner, sg, &saga.Config{Store: rstore, Scheduler: sched}); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- runner.Run(rctx) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("runner as %s: %v", run.Name, err)
			}
		case <-time.After(15 * time.Second):
			t.Error("runner did not stop")
		}
	}
	t.Cleanup(stop)
	q := func(sql string, args ...any) int64 {
		t.Helper()
		var n int64
		if err := db.Pool.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	checkpoints, instances := rel(db, "checkpoints"), rel(db, "instances")
	annalstest.WaitFor(t, 20*time.Second, func() bool {
		return q(fmt.Sprintf("SELECT coalesce(max(position), 0) FROM %s WHERE subscriber_id = $1", checkpoints), sub) >= 3 &&
			q(fmt.Sprintf("SELECT count(*) FROM %s WHERE completed", rel(db, "saga_states"))) == 2 &&
			q(fmt.Sprintf("SELECT count(*) FROM %s", instances)) == 1
	}) // the runner checkpoints the head, the saga completes two instances, the runner registers
	if n := q(fmt.Sprintf("SELECT count(*) FROM %s WHERE event_type = 'SagaDid'", rel(db, "events"))); n != 2 {
		t.Errorf("the saga appended %d events, want 2", n)
	}
	if n := q(fmt.Sprintf("SELECT count(*) FROM %s", rel(db, "timers"))); n != 0 {
		t.Errorf("%d timers left, want the completed instances' timers cancelled", n)
	}
	if n := q(fmt.Sprintf("SELECT count(*) FROM %s WHERE subscriber_id = $1", rel(db, "failures")), sub); n != 2 {
		t.Errorf("%d failed attempts recorded, want 2", n)
	}
	dlID := q(fmt.Sprintf("SELECT id FROM %s WHERE subscriber_id = $1 AND global_sequence = 2 AND status = 'open'", rel(db, "dead_letters")), sub)
	stop()
	if n := q(fmt.Sprintf("SELECT count(*) FROM %s", instances)); n != 0 {
		t.Errorf("%d instances left after Run returned, want it deregistered", n)
	}

	// The scheduler as the runner: a timer that appends, a cron task.
	if _, err := sched.Schedule(ctx, nil, time.Now().Add(-time.Second), "timed", eventstore.EventData{Type: "Timed", Data: map[string]int{}}); err != nil {
		t.Fatalf("runner schedules: %v", err)
	}
	if err := sched.AddTask(ctx, scheduler.Task{Name: "tick", Spec: "@every 1s", StreamID: "ticks"}); err != nil {
		t.Fatalf("runner adds a cron task: %v", err)
	}
	annalstest.WaitFor(t, 10*time.Second, func() bool {
		if _, err := sched.FireDue(ctx); err != nil {
			t.Fatalf("runner fires: %v", err)
		}
		return q(fmt.Sprintf("SELECT count(*) FROM %s WHERE stream_id IN ('timed', 'ticks')", rel(db, "events"))) >= 2
	}) // the runner's scheduler fires the timer and a tick

	// The relay's record of what its stream acknowledged (an upsert, read at
	// each leadership's start); a runner does not delete it.
	acks := fmt.Sprintf(`INSERT INTO %s (subscriber_id, stream, stream_created_ns, stream_sequence, position)
		VALUES ('relay', 'ANNALS', 1, 2, 3)
		ON CONFLICT (subscriber_id, partition) DO UPDATE SET stream_sequence = EXCLUDED.stream_sequence`, rel(db, "relay_acks"))
	for range 2 {
		if _, err := run.Pool.Exec(ctx, acks); err != nil {
			t.Fatalf("runner records a relay's acknowledged sequence: %v", err)
		}
	}
	var seq int64
	if err := run.Pool.QueryRow(ctx, fmt.Sprintf(`SELECT stream_sequence FROM %s`, rel(db, "relay_acks"))).Scan(&seq); err != nil || seq != 2 {
		t.Fatalf("runner reads a relay's acknowledged sequence: %d, %v", seq, err)
	}

	// What the runner may not do: write the log, purge dead letters, delete tasks.
	denyAll(t, run,
		fmt.Sprintf(`DELETE FROM %s`, rel(db, "relay_acks")),
		fmt.Sprintf(`INSERT INTO %s (global_sequence, event_id, stream_id, stream_version, event_type, data)
		             VALUES (999999, gen_random_uuid(), 'forged', 1, 'Forged', '{}')`, rel(db, "events")),
		fmt.Sprintf(`DELETE FROM %s`, rel(db, "dead_letters")),
		fmt.Sprintf(`DELETE FROM %s`, rel(db, "cron_tasks")),
	)

	// The operator: dlq retry, skip, purge; checkpoint set; schedule delete.
	dlq, err := deadletter.New(op.Pool, &deadletter.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	if c, err := dlq.Retry(ctx, dlID); err != nil || !c.Changed() {
		t.Fatalf("operator retry: %+v, %v", c, err)
	}
	if c, err := dlq.Skip(ctx, dlID); err != nil || !c.Changed() {
		t.Fatalf("operator skip: %+v, %v", c, err)
	}
	if n, err := dlq.Purge(ctx, time.Now().Add(time.Hour), false); err != nil || n != 1 {
		t.Fatalf("operator purge: %d, %v", n, err)
	}
	cps, err := checkpoint.New(db.Schema)
	if err != nil {
		t.Fatal(err)
	}
	if c, err := cps.Set(ctx, op.Pool, sub, 0, 1); err != nil || c.Position != 1 {
		t.Fatalf("operator checkpoint set: %+v, %v", c, err)
	}
	ostore, err := eventstore.New(op.Pool, &eventstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	osched, err := scheduler.New(ostore, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := osched.DeleteTask(ctx, "tick"); err != nil {
		t.Fatalf("operator deletes a task: %v", err)
	}
	if tasks, err := osched.Tasks(ctx); err != nil || len(tasks) != 0 {
		t.Fatalf("tasks after delete: %v, %v", tasks, err)
	}
	// A rebuild by the operator: resets the checkpoint, settles dead
	// letters, forgets failures, replays.
	orunner, err := projection.NewRunner(op.Pool, &projection.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	counted := &countingProjection{name: "roles-projection"}
	if err := orunner.Register(counted, nil); err != nil {
		t.Fatal(err)
	}
	if err := orunner.Rebuild(ctx, counted.name, nil); err != nil {
		t.Fatalf("operator rebuild: %v", err)
	}
	if counted.n == 0 || !counted.reset {
		t.Fatalf("rebuild handled %d events, reset %v", counted.n, counted.reset)
	}
}

// TestPrivilegesMigrationTakesDirectWrites migrates a schema to just before
// the privileges migration, gives a role what appending used to need
// (INSERT on events and streams, UPDATE on streams and the sequence) and
// more (TRIGGER, column privileges), then applies the rest: the role keeps
// appending, through the function only, and cannot write the log directly.
func TestPrivilegesMigrationTakesDirectWrites(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	const schema = `legacy "L"`
	ms, err := migrations.All(&migrations.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	at := slices.IndexFunc(ms, func(m migrations.Migration) bool { return m.Name == "privileges" })
	if at < 0 {
		t.Fatal("no privileges migration")
	}
	exec := func(sql string) {
		t.Helper()
		if _, err := db.Pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	exec("CREATE SCHEMA " + pgx.Identifier{schema}.Sanitize())
	for _, m := range ms[:at] {
		exec(m.SQL)
	}
	legacy := &annalstest.DB{URL: db.URL, Name: db.Name, Schema: schema, Pool: db.Pool}
	old := newRole(t, legacy, "")
	events, streams, seq := rel(legacy, "events"), rel(legacy, "streams"), rel(legacy, "events_global_sequence")
	who := pgx.Identifier{old.Name}.Sanitize()
	exec(fmt.Sprintf("GRANT USAGE ON SCHEMA %s TO %s", pgx.Identifier{schema}.Sanitize(), who))
	exec(fmt.Sprintf("GRANT SELECT, INSERT, TRIGGER ON %s TO %s", events, who))
	exec(fmt.Sprintf("GRANT UPDATE (data) ON %s TO %s", events, who))
	exec(fmt.Sprintf("GRANT SELECT, INSERT, UPDATE ON %s TO %s", streams, who))
	exec(fmt.Sprintf("GRANT USAGE, UPDATE ON SEQUENCE %s TO %s", seq, who))
	// Before the migrations from privileges on, there is no append_batch
	// either: that client appended through append_events alone.
	before, err := eventstore.New(old.Pool, &eventstore.Config{Schema: schema, GroupCommit: eventstore.GroupCommit{Disabled: true}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := before.Append(ctx, "s", eventstore.NoStream, eventstore.EventData{Type: "Before", Data: map[string]int{}}); err != nil {
		t.Fatalf("append before the migration: %v", err)
	}
	for _, m := range ms[at:] {
		exec(m.SQL)
	}
	// After them, through append_batch too (group commit, the default).
	store, err := eventstore.New(old.Pool, &eventstore.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Append(ctx, "s", eventstore.Exact(1), eventstore.EventData{Type: "After", Data: map[string]int{}}); err != nil {
		t.Fatalf("append after the migration: %v", err)
	}
	denyAll(t, old,
		fmt.Sprintf(`INSERT INTO %s (global_sequence, event_id, stream_id, stream_version, event_type, data)
		             VALUES (999999, gen_random_uuid(), 'forged', 1, 'Forged', '{}')`, events),
		fmt.Sprintf(`UPDATE %s SET data = '{}'`, events),
		fmt.Sprintf(`UPDATE %s SET version = 9`, streams),
		fmt.Sprintf(`SELECT setval('%s', 999999)`, strings.ReplaceAll(seq, "'", "''")),
		fmt.Sprintf(`CREATE TRIGGER sneaky BEFORE INSERT ON %s FOR EACH ROW EXECUTE FUNCTION %s()`, events, rel(legacy, "events_append_only")),
	)
}

// TestSearchPathIsPinned: append_events runs with its owner's rights, so
// an unqualified name in its body that a caller could resolve to a function
// of its own would run that function as the owner. The writer gets a schema
// of its own, puts a jsonb_typeof there that inserts a forged row, and puts
// its schema first in search_path: with the migrated function nothing is
// forged; with the SET clause removed (the control) the forgery succeeds,
// which is what the pin prevents.
func TestSearchPathIsPinned(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	w := newRole(t, db, migrations.Writer)
	evil := pgx.Identifier{w.Name + "_own"}.Sanitize()
	if _, err := db.Pool.Exec(ctx, fmt.Sprintf("CREATE SCHEMA %s AUTHORIZATION %s", evil, pgx.Identifier{w.Name}.Sanitize())); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = db.Pool.Exec(ctx, "DROP SCHEMA "+evil+" CASCADE") })
	conn, err := w.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, fmt.Sprintf(`CREATE FUNCTION %[1]s.jsonb_typeof(j jsonb) RETURNS text LANGUAGE plpgsql AS $f$
		BEGIN
		    INSERT INTO annals.events (global_sequence, event_id, stream_id, stream_version, event_type, data)
		    VALUES (999999, gen_random_uuid(), 'forged', 1, 'Forged', '{}') ON CONFLICT DO NOTHING;
		    RETURN pg_catalog.jsonb_typeof(j);
		END $f$;
		SET search_path = %[1]s, pg_catalog`, evil)); err != nil {
		t.Fatal(err)
	}
	forged := func() bool {
		var n int
		if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM annals.events WHERE global_sequence = 999999").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	}
	appendRaw := `SELECT * FROM annals.append_events('s', NULL, '[{"type": "T", "data": {}}]')`
	if _, err := conn.Exec(ctx, appendRaw); err != nil {
		t.Fatalf("append with the writer's search_path: %v", err)
	}
	if forged() {
		t.Fatal("the writer's function ran as the owner: a row was forged at 999999")
	}
	// The control: without the pin the same call forges.
	if _, err := db.Pool.Exec(ctx, "ALTER FUNCTION annals.append_events(text, bigint, jsonb) RESET search_path"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, appendRaw); err != nil {
		t.Fatalf("append without the pin: %v", err)
	}
	if !forged() {
		t.Error("control: without the pinned search_path the forgery did not happen either; the test proves nothing")
	}
}

// The sample of `annals grant writer orders_app --print` in
// docs/operations.md is what GrantSQL returns, and the count the command
// prints after it is the number of those statements: the page operators
// copy privileges from does not fall behind the grants.
func TestGrantSampleInOperationsDoc(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile(filepath.Join("..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	const printed, apply = "$ annals grant writer orders_app --print\n", "$ annals grant writer orders_app\n"
	text := string(doc)
	start := strings.Index(text, printed)
	if start < 0 {
		t.Fatalf("docs/operations.md has no %q", strings.TrimSpace(printed))
	}
	sample, rest, ok := strings.Cut(text[start+len(printed):], apply)
	if !ok {
		t.Fatalf("docs/operations.md: no %q after the sample", strings.TrimSpace(apply))
	}
	want, err := migrations.GrantSQL("orders_app", migrations.Writer, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Split(strings.TrimSpace(sample), "\n"); !slices.Equal(got, want) {
		t.Errorf("docs/operations.md shows\n%s\nGrantSQL returns\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if line, _, _ := strings.Cut(rest, "\n"); line != fmt.Sprintf("granted writer to orders_app (%d statements)", len(want)) {
		t.Errorf("docs/operations.md: %q after the sample, want the count of %d statements", line, len(want))
	}
}
