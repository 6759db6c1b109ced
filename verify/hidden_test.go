package verify_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/schemaname"
	"github.com/annals-dev/annals/migrations"
	"github.com/annals-dev/annals/verify"
)

// operatorPool creates a login role granted operator on b's schema (the role
// the docs say to run verify as) and returns a pool connected as it. The
// role is dropped when the test ends.
func (b *bundle) operatorPool(t *testing.T) (string, *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	var r [6]byte
	_, _ = rand.Read(r[:])
	name := "annals_verify_" + hex.EncodeToString(r[:])
	password := hex.EncodeToString(r[:]) + "pw"
	ident := pgx.Identifier{name}.Sanitize()
	if _, err := b.db.Pool.Exec(ctx, fmt.Sprintf("CREATE ROLE %s LOGIN PASSWORD %s", ident, schemaname.Literal(password))); err != nil {
		t.Fatal(err)
	}
	var pool *pgxpool.Pool
	t.Cleanup(func() {
		if pool != nil {
			pool.Close()
		}
		for _, s := range []string{"DROP OWNED BY " + ident, "DROP ROLE " + ident} {
			if _, err := b.db.Pool.Exec(ctx, s); err != nil {
				t.Errorf("%s: %v", s, err)
			}
		}
	})
	if err := migrations.Grant(ctx, b.db.Pool, name, migrations.Operator, &migrations.Config{Schema: b.db.Schema}); err != nil {
		t.Fatal(err)
	}
	u := b.db.URL
	if strings.HasPrefix(u, "postgres://") || strings.HasPrefix(u, "postgresql://") {
		pu, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		pu.User = url.UserPassword(name, password)
		u = pu.String()
	} else {
		u = strings.TrimSpace(u) + fmt.Sprintf(" user=%s password=%s", name, password)
	}
	var err error
	if pool, err = pgxpool.New(ctx, u); err != nil {
		t.Fatal(err)
	}
	return name, pool
}

// verifyAs runs verify on pool (with the same settings as bundle.verify).
func (b *bundle) verifyAs(t *testing.T, pool *pgxpool.Pool, base *verify.Baseline) *verify.Report {
	t.Helper()
	rep, err := verify.Log(context.Background(), pool, &verify.Config{Schema: b.db.Schema, PageSize: 4, Interval: 3, Baseline: base})
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// TestHiddenFromTheAuditor: the owner of the schema (here the superuser
// that migrated it) shows the role that runs verify a log other than the
// one subscribers read. An audit found that verify, run as an operator,
// reported a clean log, and the digest of a baseline taken before, while
// runners read a forged event.
func TestHiddenFromTheAuditor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Run("RowLevelSecurity", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		auditor, pool := b.operatorPool(t)
		base := b.verifyAs(t, pool, nil)
		if !base.OK() {
			t.Fatalf("the clean log has problems: %+v", base.Problems)
		}
		// A forged event in a stream of its own, appended through the
		// function (its position is below the sequence, its stream has its
		// row), hidden from the auditor's role only (forced: also when the
		// auditor's role owns the table).
		if _, err := b.store.Append(ctx, "refunds", eventstore.NoStream, eventstore.EventData{Type: "Refunded", Data: map[string]any{"amount": 1000000}}); err != nil {
			t.Fatal(err)
		}
		who := schemaname.Literal(auditor)
		b.tamper(t,
			`ALTER TABLE %s.events ENABLE ROW LEVEL SECURITY`,
			`ALTER TABLE %s.events FORCE ROW LEVEL SECURITY`,
			`CREATE POLICY p ON %s.events USING (current_user <> `+who+` OR stream_id <> 'refunds')`,
			`ALTER TABLE %s.streams ENABLE ROW LEVEL SECURITY`,
			`CREATE POLICY p ON %s.streams USING (current_user <> `+who+` OR stream_id <> 'refunds')`)
		var n int
		if err := b.db.Pool.QueryRow(ctx, fmt.Sprintf("SELECT count(*) FROM %s.events_all WHERE stream_id = 'refunds'", pgx.Identifier{b.db.Schema}.Sanitize())).Scan(&n); err != nil || n != 1 {
			t.Fatalf("the forged event as others read it: %d rows, %v", n, err)
		}
		rep := b.verifyAs(t, pool, base.Baseline)
		wantProblems(t, rep, verify.Problem{Kind: verify.GuardRemoved}, verify.Problem{Kind: verify.GuardRemoved})
		for _, p := range rep.Problems {
			if !strings.Contains(p.Message, "row-level security") {
				t.Errorf("%s: %s: does not say row-level security", p.Kind, p.Message)
			}
		}
		// The superuser is not filtered (the forged row is a new one, after
		// the baseline); the guards are reported to it too.
		wantProblems(t, b.verify(t, base.Baseline), verify.Problem{Kind: verify.GuardRemoved}, verify.Problem{Kind: verify.GuardRemoved})
	})
	t.Run("ViewReplaced", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		base := b.baseline(t)
		// Event 5 (b-2) changed in events, which subscribers read, and the
		// view events_all replaced to read a copy taken before (the owner
		// may replace its own view): a run reading the log through the view
		// compared the copy with the baseline.
		b.tamper(t,
			`CREATE TABLE %[1]s.events_copy AS SELECT * FROM %[1]s.events`,
			`UPDATE %s.events SET data = '{"s": "b", "i": 1, "forged": true}' WHERE global_sequence = 5`,
			`CREATE OR REPLACE VIEW %[1]s.events_all AS
			     SELECT global_sequence, event_id, stream_id, stream_version, event_type, data, metadata, recorded_at
			       FROM %[1]s.events_archive
			     UNION ALL
			     SELECT global_sequence, event_id, stream_id, stream_version, event_type, data, metadata, recorded_at
			       FROM %[1]s.events_copy`)
		var data string
		if err := b.db.Pool.QueryRow(ctx, fmt.Sprintf("SELECT data::text FROM %s.events WHERE global_sequence = 5", pgx.Identifier{b.db.Schema}.Sanitize())).Scan(&data); err != nil || !strings.Contains(data, "forged") {
			t.Fatalf("event 5 as subscribers read it: %s, %v", data, err)
		}
		wantProblems(t, b.verify(t, base), verify.Problem{Kind: verify.Changed, Position: 6, After: 3})
	})
	t.Run("RewrittenAsWritten", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// A trigger of the owner's rewrites each event of a type as it is
		// appended: the stored row is the forged one, so neither the rows
		// nor a baseline (taken after) can tell; only the catalog can.
		b.tamper(t,
			`CREATE FUNCTION %[1]s.skim() RETURNS trigger LANGUAGE plpgsql AS $$
			 BEGIN NEW.data := '{"amount": 1}'; RETURN NEW; END $$`,
			`CREATE TRIGGER skim BEFORE INSERT ON %[1]s.events FOR EACH ROW
			 WHEN (NEW.event_type = 'Paid') EXECUTE FUNCTION %[1]s.skim()`)
		if _, err := b.store.Append(ctx, "p", eventstore.NoStream, eventstore.EventData{Type: "Paid", Data: map[string]any{"amount": 100}}); err != nil {
			t.Fatal(err)
		}
		var data string
		if err := b.db.Pool.QueryRow(ctx, fmt.Sprintf("SELECT data::text FROM %s.events WHERE stream_id = 'p'", pgx.Identifier{b.db.Schema}.Sanitize())).Scan(&data); err != nil || data != `{"amount": 1}` {
			t.Fatalf("the stored event: %s, %v", data, err)
		}
		rep := b.verify(t, nil)
		wantProblems(t, rep, verify.Problem{Kind: verify.GuardRemoved})
		if len(rep.Problems) == 1 && !strings.Contains(rep.Problems[0].Message, "skim") {
			t.Errorf("the problem does not name the trigger: %s", rep.Problems[0].Message)
		}
	})
	t.Run("TriggerNarrowed", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// The owner makes annals' triggers again under their names, on
		// their functions, enabled, before the same statements: the one on
		// events fires only for an UPDATE that sets recorded_at, the one on
		// events_archive only for a role other than the owner's (WHEN).
		// Updating an event's data then went through, and verify, which
		// looked at the name, the function, the statements and whether
		// each is enabled, said ok (a review).
		b.tamper(t,
			`DROP TRIGGER events_append_only ON %[1]s.events`,
			`CREATE TRIGGER events_append_only BEFORE UPDATE OF recorded_at OR DELETE OR TRUNCATE ON %[1]s.events
			 FOR EACH STATEMENT EXECUTE FUNCTION %[1]s.events_append_only()`,
			`DROP TRIGGER events_archive_guard ON %[1]s.events_archive`,
			`CREATE TRIGGER events_archive_guard BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON %[1]s.events_archive
			 FOR EACH STATEMENT WHEN (pg_catalog.current_user() <> 'nobody in particular') EXECUTE FUNCTION %[1]s.events_archive_guard()`)
		// Outside tamper (which turns triggers off): the trigger lets it be.
		if _, err := b.db.Pool.Exec(ctx, fmt.Sprintf(`UPDATE %s.events SET data = '{"forged": true}' WHERE global_sequence = 5`,
			pgx.Identifier{b.db.Schema}.Sanitize())); err != nil {
			t.Fatalf("the narrowed trigger refused the update: the test does not show it: %v", err)
		}
		rep := b.verify(t, nil)
		wantProblems(t, rep, verify.Problem{Kind: verify.GuardRemoved}, verify.Problem{Kind: verify.GuardRemoved})
	})
	t.Run("RuleAndChildTable", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// A rule on streams, and a table inheriting from events: its rows
		// read as events, and no trigger or unique index of events guards
		// them.
		b.tamper(t,
			`CREATE TABLE %[1]s.streams_seen (LIKE %[1]s.streams)`,
			`CREATE RULE seen AS ON UPDATE TO %[1]s.streams DO ALSO INSERT INTO %[1]s.streams_seen SELECT NEW.*`,
			`CREATE TABLE %[1]s.more_events () INHERITS (%[1]s.events)`)
		wantProblems(t, b.verify(t, nil), verify.Problem{Kind: verify.GuardRemoved}, verify.Problem{Kind: verify.GuardRemoved})
	})
}
