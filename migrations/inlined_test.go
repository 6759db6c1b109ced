package migrations_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
)

// TestInputRulesInlined: append_batch and append_one state the input rules
// once, in the SQL functions stream_input_bad and event_input_bad, which
// cost nothing extra only while the planner inlines them into the calling
// statement (a SQL function that is not inlined is planned again at every
// call: migration 0016's lesson). With function tracking on, one call of
// each append function must count the append function and not the rules;
// the control calls a rule function in FROM, where PostgreSQL does not
// inline a scalar function, and must count it. A change to either function
// that stops the inlining (SECURITY DEFINER, a SET clause, STRICT, a
// sub-select, a volatile call) fails here.
func TestInputRulesInlined(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	schema := pgx.Identifier{db.Schema}.Sanitize()
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	for _, q := range []string{
		`SET LOCAL track_functions = 'all'`,
		fmt.Sprintf(`SELECT count(*) FROM %s.append_batch('{s-1}', '{NULL}', '{1}', '{1}', ARRAY[gen_random_uuid()],
		             '{t}', '{"{\"a\": 1}"}', '{NULL}', true)`, schema),
		fmt.Sprintf(`SELECT status FROM %s.append_one('s-2', NULL, gen_random_uuid(), 't', '{"a": 1}', NULL, true)`, schema),
	} {
		if _, err := tx.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	calls := func() map[string]int64 {
		rows, err := tx.Query(ctx, `SELECT funcname, calls FROM pg_stat_xact_user_functions WHERE schemaname = $1`, db.Schema)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]int64{}
		for rows.Next() {
			var name string
			var n int64
			if err := rows.Scan(&name, &n); err != nil {
				t.Fatal(err)
			}
			out[name] = n
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	got := calls()
	if got["append_batch"] != 1 || got["append_one"] != 1 {
		t.Fatalf("function calls %v: want append_batch and append_one counted once (is tracking on?)", got)
	}
	for _, rule := range []string{"stream_input_bad", "event_input_bad"} {
		if got[rule] != 0 {
			t.Errorf("%s was called %d times, not inlined: %v", rule, got[rule], got)
		}
	}
	// The control: a call the planner does not inline is counted.
	if _, err := tx.Exec(ctx, fmt.Sprintf(`SELECT * FROM %s.event_input_bad('t', '{}', NULL)`, schema)); err != nil {
		t.Fatal(err)
	}
	if n := calls()["event_input_bad"]; n != 1 {
		t.Fatalf("event_input_bad called in FROM counted %d times; want 1 (the control)", n)
	}
}
