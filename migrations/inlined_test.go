package migrations_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

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

// TestInputRulesCheaperFormsAgree: migration 0045 rewrote two tests of
// event_input_bad and data_unstorable so that they no longer walk the whole
// payload (the first character before ltrim, a backslash before \u). The
// rewritten functions must answer as 0032's bodies, stated here as they
// were, for every input: white space before the value, texts without a
// first character or a backslash, escaped backslashes, multibyte text,
// NULLs; and where one form fails (metadata that is no JSON), the other
// fails alike.
func TestInputRulesCheaperFormsAgree(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	s := pgx.Identifier{db.Schema}.Sanitize()
	oldUnstorable := `((strpos(d, E'\\u') > 0
	        OR (strpos(d, '"$personal"') > 0 AND ` + s + `.jsonb_may_overflow(d)))
	   AND NOT ` + s + `.jsonb_storable(d))`
	oldBad := `(ty IS NULL OR d IS NULL
	    OR starts_with(ty, '$stream.')
	    OR NOT (octet_length(ty) <= 256
	            AND ty ~ E'^[^\\x01-\\x1f\\x7f-\\x9f]*[^\\x01-\\x20\\x7f-\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000][^\\x01-\\x1f\\x7f-\\x9f]*$')
	    OR left(ltrim(d, E' \t\r\n'), 1) NOT IN ('{', '[')
	    OR octet_length(d) + coalesce(octet_length(m), 0) > 67108864
	    OR ` + oldUnstorable + `
	    OR (m IS NOT NULL AND m <> ''
	        AND (left(ltrim(m, E' \t\r\n'), 1) <> '{'
	             OR (strpos(m, E'\\u') > 0 AND NOT ` + s + `.jsonb_storable(m))
	             OR NOT ` + s + `.metadata_ok(m::jsonb))))`
	newBad := s + `.event_input_bad(ty, d, m)`
	newUnstorable := s + `.data_unstorable(d)`

	str := func(v string) *string { return &v }
	texts := []*string{nil, str(""), str(" "), str("{}"), str("[]"), str(" {}"), str("\t\r\n[1]"), str("x"),
		str(`"s"`), str("1"), str(" x{"), str("é{}"), str(`{"é": "ü"}`), str(`{"a": "\u0000"}`),
		str(`{"a": "\\u0041"}`), str(`{"a": "\n"}`), str(`{"a": "\\"}`), str(`{"a": "\ud800"}`),
		str(`{"$personal": {"n": 1e99999}}`), str(`{"$personal": {"n": 1}}`), str(`\u`), str(`\`),
		str(`{"a": 1} `), str("{"), str("\u3000{}"), str(`{"a": "\u00e9"}`), str(`{"$personal": "\u00e9"}`)}
	types := []*string{nil, str("t"), str(""), str(" "), str("$stream.deleted"), str("é"), str("order.placed")}
	metas := []*string{nil, str(""), str("{}"), str(" {}"), str("[]"), str(" []"), str("x"), str(`{"a": "\u0000"}`),
		str(`{"a": "\\u0041"}`), str(`{"a": "\n"}`), str(`{"correlation_id": "c"}`), str("\u3000{}"), str(`{"a": "\ud800"}`),
		str("{"), str("{x"), str(" {x"), str(`{"a": "\u00e9"}`), str(`{"correlation_id": 7}`)}

	// answer evaluates expr over (ty, d, m) in a statement of its own: its
	// result, or the SQLSTATE it failed with.
	answer := func(expr string, ty, d, m *string) string {
		var out *bool
		err := db.Pool.QueryRow(ctx, `SELECT `+expr+` FROM (SELECT $1::text, $2::text, $3::text) AS x(ty, d, m)`, ty, d, m).Scan(&out)
		if err != nil {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) {
				return "error " + pgErr.Code
			}
			t.Fatalf("%s: %v", expr, err)
		}
		if out == nil {
			return "NULL"
		}
		return fmt.Sprint(*out)
	}
	show := func(p *string) string {
		if p == nil {
			return "NULL"
		}
		return fmt.Sprintf("%q", *p)
	}
	compared, failed, errorsSeen := 0, 0, 0
	check := func(ty, d, m *string) {
		compared++
		for _, pair := range [][2]string{{oldBad, newBad}, {oldUnstorable, newUnstorable}} {
			was, is := answer(pair[0], ty, d, m), answer(pair[1], ty, d, m)
			if strings.HasPrefix(was, "error") {
				errorsSeen++
			}
			if was != is {
				failed++
				t.Errorf("type %s, data %s, metadata %s: 0032's form answers %s, 0045's %s (%s)",
					show(ty), show(d), show(m), was, is, pair[1])
			}
		}
	}
	for _, d := range texts {
		for _, m := range metas {
			check(str("t"), d, m)
		}
	}
	for _, ty := range types {
		for _, d := range texts[:6] {
			check(ty, d, nil)
		}
	}
	// The inputs must reach both answers of each rule (the comparison
	// would be empty if every input were refused, or none).
	var refused, accepted int
	for _, d := range texts {
		if answer(newBad, str("t"), d, nil) == "true" {
			refused++
		} else {
			accepted++
		}
	}
	if errorsSeen == 0 {
		t.Fatal("no input made 0032's form fail: the comparison of failures is empty")
	}
	if refused == 0 || accepted == 0 {
		t.Fatalf("inputs refused %d, accepted %d: want both", refused, accepted)
	}
	t.Logf("%d inputs compared (%d answers were failures), %d disagreements", compared, errorsSeen, failed)
}
