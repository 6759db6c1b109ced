package migrations_test

// Migration 0032: what a writer appends or sets through the SQL API cannot
// stop Forgets and scavenging for everyone (an audit's reproductions), and
// rows stored before it do not either.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/migrations"
	"github.com/annals-dev/annals/verify"
)

// scavengeToEnd runs scavenge steps as pool's role until the run is done.
func scavengeToEnd(ctx context.Context, r *role, schema string) error {
	for range 1000 {
		var done bool
		if err := r.Pool.QueryRow(ctx, `SELECT done FROM `+schema+`.scavenge('t', NULL, 1000)`).Scan(&done); err != nil {
			return err
		}
		if done {
			return nil
		}
	}
	return errors.New("the scavenge run did not finish in 1000 steps")
}

// wantAN002 fails unless err is AN002 whose DETAIL names field.
func wantAN002(t *testing.T, what string, err error, field string) {
	t.Helper()
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "AN002" {
		t.Errorf("%s: got %v, want AN002", what, err)
		return
	}
	var d struct {
		Field string `json:"field"`
	}
	if err := json.Unmarshal([]byte(pgErr.Detail), &d); err != nil || d.Field != field {
		t.Errorf("%s: DETAIL %s, want field %q", what, pgErr.Detail, field)
	}
}

// upTo migrates schema in db up to, not including, the migration named
// before.
func upTo(t *testing.T, db *annalstest.DB, schema, before string) *migrations.Config {
	t.Helper()
	cfg := &migrations.Config{Schema: schema}
	all, err := migrations.All(cfg)
	if err != nil {
		t.Fatal(err)
	}
	n := indexOf(t, all, before)
	if _, err := migrations.UpWith(t.Context(), db.Pool, cfg, func(ms []migrations.Migration) []migrations.Migration { return ms[:n] }); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// grantedRole is newRole for a schema other than db.Schema.
func grantedRole(t *testing.T, db *annalstest.DB, kind migrations.RoleKind, cfg *migrations.Config) *role {
	t.Helper()
	r := newRole(t, db, "")
	if err := migrations.Grant(t.Context(), db.Pool, r.Name, kind, cfg); err != nil {
		t.Fatalf("grant %s to %s: %v", kind, r.Name, err)
	}
	return r
}

const wedgeMigration = "writer_input_cannot_wedge_maintenance"

// A writer's append of personal data ("$personal": what annals reads as
// jsonb) that json accepts and jsonb does not (a number beyond numeric's
// range) is refused, through append_one and append_batch, however the
// number is written; numbers jsonb holds, such text inside strings, and
// data without "$personal" (never cast; Forget and scavenge pass over it
// below) are not. Before 0032 the first was stored, and then
// forget_subject failed for every subject and scavenge at every step over
// it (TestEx4WriterWedgesForgetWithUncastableJSON).
func TestWriterCannotAppendNumbersJsonbRefuses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	w := newRole(t, db, migrations.Writer)
	op := newRole(t, db, migrations.Operator)
	s := pgx.Identifier{db.Schema}.Sanitize()

	// Data with personal data (what annals reads as jsonb) is checked.
	refused := []string{
		`{"n":1e1000000,"$personal":1}`,
		`{"n": -1E-16384, "e": {"$personal": {}}}`,
		"[1,\n 2e+131072, {\"$personal\": 1}]",
		`{"$personal":1,"n":1e000000131072}`,
		// 4 exponent digits, 6385 fraction digits: over 16383 in all.
		`{"$personal":1,"n":0.` + strings.Repeat("0", 6384) + `1e-9999}`,
		// No exponent: 16384 fraction digits.
		`{"$personal":1,"a":[1.` + strings.Repeat("5", 16384) + `]}`,
	}
	for i, data := range refused {
		_, err := w.Pool.Exec(ctx, `SELECT * FROM `+s+`.append_one($1, NULL, gen_random_uuid(), 'T', $2, NULL, true)`,
			fmt.Sprintf("poison-%d", i), data)
		wantAN002(t, fmt.Sprintf("append_one of %.40q", data), err, "data")
		_, err = w.Pool.Exec(ctx, `SELECT * FROM `+s+`.append_batch(ARRAY['ok', $1], '{NULL,NULL}', '{1,2}', '{1,1}',
		        ARRAY[gen_random_uuid(), gen_random_uuid()], '{T,T}', ARRAY['{}', $2], '{NULL,NULL}', false)`,
			fmt.Sprintf("poison-b%d", i), data)
		wantAN002(t, fmt.Sprintf("append_batch of %.40q", data), err, "data")
	}
	// A refusal names the event the rule refused: not data without
	// "$personal" that jsonb cannot hold (accepted), but the bad type after it.
	_, err := w.Pool.Exec(ctx, `SELECT * FROM `+s+`.append_batch('{b-1}', '{NULL}', '{1,1}', '{1,2}',
	        ARRAY[gen_random_uuid(), gen_random_uuid()], ARRAY['T', ''], '{"{\"n\": 1e1000000}", "{}"}', '{NULL,NULL}', false)`)
	wantAN002(t, "append_batch of data jsonb cannot hold, then an empty type", err, "type")
	// Numbers in metadata never reached the log (it is cast to jsonb).
	if _, err := w.Pool.Exec(ctx, `SELECT * FROM `+s+`.append_one('poison-m', NULL, gen_random_uuid(), 'T', '{}', '{"n":1e1000000}', true)`); err == nil {
		t.Error("append_one stored metadata holding 1e1000000")
	}
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+s+`.events`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d events stored (%v), want none", n, err)
	}

	accepted := []string{
		`{"n":1e99999,"$personal":1}`, // within numeric's range, though its exponent has 5 digits
		// Without "$personal", nothing of annals reads the data as jsonb,
		// and the append pays no regular expression for it.
		`{"n":1e000000131072}`,
		`{"id":"3e12345","hash":"e00000ff"}`,
		`{"n":0.` + strings.Repeat("0", 6383) + `1e-9999}`,
		`{"blob":"` + strings.Repeat("x", 20000) + `","n":1.5e300}`,
	}
	for i, data := range accepted {
		var status int
		if err := w.Pool.QueryRow(ctx, `SELECT status FROM `+s+`.append_one($1, NULL, gen_random_uuid(), 'T', $2, NULL, true)`,
			fmt.Sprintf("fine-%d", i), data).Scan(&status); err != nil || status != 0 {
			t.Errorf("append_one of %.40q: status %d, %v; want it written", data, status, err)
		}
	}

	// The audit's sequel: the poison stream with a snapshot, then Forget.
	if _, err := w.Pool.Exec(ctx, `INSERT INTO `+s+`.snapshots (aggregate_type, stream_id, schema_version, stream_version, state)
	                              VALUES ('A', 'fine-0', 1, 1, '{}')`); err != nil {
		t.Fatal(err)
	}
	if _, err := op.Pool.Exec(ctx, `SELECT * FROM `+s+`.forget_subject('alice')`); err != nil {
		t.Errorf("forget_subject('alice'): %v", err)
	}
	if err := scavengeToEnd(ctx, op, s); err != nil {
		t.Errorf("scavenge: %v", err)
	}
}

// The number check stays a part of event_input_bad that the planner
// inlines (TestInputRulesInlined): jsonb_may_overflow is not called as a
// function of its own by an append.
func TestNumberCheckInlined(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	s := pgx.Identifier{db.Schema}.Sanitize()
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	for _, q := range []string{
		`SET LOCAL track_functions = 'all'`,
		`SELECT status FROM ` + s + `.append_one('s-1', NULL, gen_random_uuid(), 't', '{"a": 1e5, "$personal": 1}', NULL, true)`,
		`SELECT count(*) FROM ` + s + `.append_batch('{s-2}', '{NULL}', '{1}', '{1}', ARRAY[gen_random_uuid()],
		             '{t}', '{"{\"a\": 1, \"$personal\": 1}"}', '{NULL}', true)`,
	} {
		if _, err := tx.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	var calls int64
	if err := tx.QueryRow(ctx, `SELECT coalesce(sum(calls), 0) FROM pg_stat_xact_user_functions
	                             WHERE schemaname = $1 AND funcname IN ('jsonb_may_overflow', 'data_unstorable', 'event_input_bad', 'jsonb_storable')`,
		db.Schema).Scan(&calls); err != nil || calls != 0 {
		t.Fatalf("the input rules were called as functions %d times (%v), want inlined and jsonb_storable not asked", calls, err)
	}
	if _, err := tx.Exec(ctx, `SELECT * FROM `+s+`.jsonb_may_overflow('{}')`); err != nil {
		t.Fatal(err)
	}
	if err := tx.QueryRow(ctx, `SELECT coalesce(sum(calls), 0) FROM pg_stat_xact_user_functions
	                             WHERE schemaname = $1 AND funcname = 'jsonb_may_overflow'`, db.Schema).Scan(&calls); err != nil || calls != 1 {
		t.Fatalf("the control call of jsonb_may_overflow counted %d (%v), want 1 (is tracking on?)", calls, err)
	}
}

// Events stored before 0032 that jsonb cannot hold stop neither Forgets
// nor scavenging: forget_subject counts one with "$personal" as any
// subject's (its stream's snapshots go), and a scavenge step removes it and
// every snapshot of its stream.
func TestMaintenanceSurvivesStoredUncastableEvents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	cfg := upTo(t, db, "before32", wedgeMigration)
	s := pgx.Identifier{cfg.Schema}.Sanitize()
	envelope := func(subject string) string {
		return `{"$personal": {"v": 1, "subject": "` + subject + `", "kind": "string", "data": "AAAA"}}`
	}
	for _, q := range []string{
		// Before 0032 the SQL API stored these (the owner stands in for a
		// writer: roles are granted on a migrated schema).
		`SELECT * FROM ` + s + `.append_one('poison-p', NULL, gen_random_uuid(), 'T', '{"email": ` + envelope("alice") + `, "n": 1e1000000}', NULL, true)`,
		`SELECT * FROM ` + s + `.append_one('poison-p', NULL, gen_random_uuid(), 'T', '{"n": 1}', NULL, true)`,
		`SELECT * FROM ` + s + `.append_one('poison-x', NULL, gen_random_uuid(), 'T', '{"n": 1e-1000000}', NULL, true)`,
		`SELECT * FROM ` + s + `.append_one('bob-1', NULL, gen_random_uuid(), 'T', '{"email": ` + envelope("bob") + `}', NULL, true)`,
		`SELECT * FROM ` + s + `.append_one('carol-1', NULL, gen_random_uuid(), 'T', '{"email": ` + envelope("carol") + `}', NULL, true)`,
		`INSERT INTO ` + s + `.snapshots (aggregate_type, stream_id, schema_version, stream_version, state)
		 VALUES ('A', 'poison-p', 1, 2, '{}'), ('A', 'poison-x', 1, 1, '{}'), ('A', 'bob-1', 1, 1, '{}'), ('A', 'carol-1', 1, 1, '{}')`,
	} {
		if _, err := db.Pool.Exec(ctx, q); err != nil {
			t.Fatalf("before 0032: %s: %v", q, err)
		}
	}
	if _, err := migrations.Up(ctx, db.Pool, cfg); err != nil {
		t.Fatal(err)
	}
	w := grantedRole(t, db, migrations.Writer, cfg)
	op := grantedRole(t, db, migrations.Operator, cfg)

	var had bool
	var deleted int64
	if err := w.Pool.QueryRow(ctx, `SELECT * FROM `+s+`.forget_subject('bob')`).Scan(&had, &deleted); err != nil {
		t.Fatalf("forget_subject('bob') fails because of another stream's event: %v", err)
	}
	left := func() []string {
		rows, err := db.Pool.Query(ctx, `SELECT stream_id FROM `+s+`.snapshots ORDER BY 1`)
		if err != nil {
			t.Fatal(err)
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return ids
	}
	// bob's, and the stream whose personal event no one can read.
	if got := left(); deleted != 2 || strings.Join(got, ",") != "carol-1,poison-x" {
		t.Errorf("forget_subject('bob') deleted %d snapshots, left %v; want 2, left carol-1 and poison-x", deleted, got)
	}

	if _, err := db.Pool.Exec(ctx, `INSERT INTO `+s+`.snapshots (aggregate_type, stream_id, schema_version, stream_version, state)
	                                VALUES ('A', 'poison-p', 1, 2, '{}')`); err != nil {
		t.Fatal(err)
	}
	for _, stream := range []string{"poison-p", "poison-x"} {
		if _, err := w.Pool.Exec(ctx, `SELECT * FROM `+s+`.delete_stream($1, NULL, true)`, stream); err != nil {
			t.Fatal(err)
		}
	}
	if err := scavengeToEnd(ctx, op, s); err != nil {
		t.Fatalf("scavenge fails on an event stored before 0032: %v", err)
	}
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+s+`.events WHERE stream_id LIKE 'poison-%'`).Scan(&n); err != nil || n != 0 {
		t.Errorf("%d events of the hard-deleted streams left (%v)", n, err)
	}
	if got := left(); strings.Join(got, ",") != "carol-1" {
		t.Errorf("snapshots left after the scavenge: %v, want carol-1's", got)
	}
	// carol's envelope is read as before: a Forget of her deletes hers.
	if err := w.Pool.QueryRow(ctx, `SELECT * FROM `+s+`.forget_subject('carol')`).Scan(&had, &deleted); err != nil || deleted != 1 {
		t.Errorf("forget_subject('carol') deleted %d snapshots (%v), want 1", deleted, err)
	}
}

// An event naming a subject over 1024 bytes (the SQL API takes it; no key
// can exist for it) does not stop the scavenger when it removes the event:
// the subject is not recorded in personal_streams, whose key could not hold
// it. forget_subject refuses such a subject with AN002; one of 1024 bytes
// is recorded and forgotten as before.
func TestScavengeSurvivesLongSubject(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	w := newRole(t, db, migrations.Writer)
	op := newRole(t, db, migrations.Operator)
	s := pgx.Identifier{db.Schema}.Sanitize()
	// Random, so that the index cannot compress it under its limit.
	var b [1600]byte
	_, _ = rand.Read(b[:])
	long, edge := hex.EncodeToString(b[:]), strings.Repeat("s", 1024)
	appendEnvelope := func(stream, subject string) {
		t.Helper()
		if _, err := w.Pool.Exec(ctx, `SELECT * FROM `+s+`.append_one($1, NULL, gen_random_uuid(), 'Registered',
		       json_build_object('email', json_build_object('$personal', json_build_object('v', 1, 'subject', $2::text,
		         'kind', 'string', 'data', 'AAAA')))::text, NULL, true)`, stream, subject); err != nil {
			t.Fatalf("writer: %v", err)
		}
		if _, err := w.Pool.Exec(ctx, `SELECT * FROM `+s+`.delete_stream($1, NULL, true)`, stream); err != nil {
			t.Fatalf("writer: %v", err)
		}
	}
	appendEnvelope("evil-1", long)
	appendEnvelope("edge-1", edge)
	if err := scavengeToEnd(ctx, op, s); err != nil {
		t.Fatalf("operator's scavenge fails on a writer's event: %v", err)
	}
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+s+`.events WHERE stream_id IN ('evil-1', 'edge-1')`).Scan(&n); err != nil || n != 0 {
		t.Errorf("%d events of the hard-deleted streams left (%v)", n, err)
	}
	var subjects []string
	rows, err := db.Pool.Query(ctx, `SELECT subject FROM `+s+`.personal_streams`)
	if err == nil {
		subjects, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil || len(subjects) != 1 || subjects[0] != edge {
		t.Errorf("personal_streams holds %d subjects (%v), want the 1024-byte one only", len(subjects), err)
	}

	_, err = w.Pool.Exec(ctx, `SELECT * FROM `+s+`.forget_subject($1)`, long)
	wantAN002(t, "forget_subject of 3200 bytes", err, "subject")
	var had bool
	var deleted int64
	if err := w.Pool.QueryRow(ctx, `SELECT * FROM `+s+`.forget_subject($1)`, edge).Scan(&had, &deleted); err != nil {
		t.Fatalf("forget_subject of 1024 bytes: %v", err)
	}
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+s+`.personal_streams`).Scan(&n); err != nil || n != 0 {
		t.Errorf("personal_streams keeps %d rows after the Forget (%v)", n, err)
	}
}

// set_stream_retention takes a max_age of at most 292 years, and stores it
// as a fixed length. Before 0032 a writer's interval '100000 years' made
// every scavenge step over the stream fail, and StreamInfo and reads of it.
func TestStreamRetentionMaxAgeBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	w := newRole(t, db, migrations.Writer)
	op := newRole(t, db, migrations.Operator)
	s := pgx.Identifier{db.Schema}.Sanitize()
	if _, err := w.Pool.Exec(ctx, `SELECT * FROM `+s+`.append_one('acct-1', NULL, gen_random_uuid(), 'Opened', '{}', NULL, true)`); err != nil {
		t.Fatal(err)
	}
	set := func(age string) (string, error) {
		var got *string
		err := w.Pool.QueryRow(ctx, `SELECT max_age::text FROM `+s+`.set_stream_retention('acct-1', $1::interval, NULL, NULL)`, age).Scan(&got)
		if got == nil {
			return "", err
		}
		return *got, err
	}
	for _, age := range []string{"100000 years", "100000000 years", "292 years 1 day", "9214819200.000001 seconds"} {
		_, err := set(age)
		wantAN002(t, "max_age "+age, err, "max_age")
	}
	// Not negative as PostgreSQL compares intervals (30-day months), but
	// negative as a length (365.25-day years).
	_, err := set("-1 year 362 days")
	wantAN002(t, "max_age -1 year 362 days", err, "retention")
	for age, want := range map[string]string{
		"292 years":                 "2559672:00:00",
		"9214819200 seconds":        "2559672:00:00",
		"30 days":                   "720:00:00",
		"1 mon 2 days 03:04:05.678": "771:04:05.678",
		"0":                         "",
	} {
		if got, err := set(age); err != nil || got != want {
			t.Errorf("max_age %s: stored %q, %v; want %q", age, got, err, want)
		}
	}
	if _, err := set("292 years"); err != nil {
		t.Fatal(err)
	}
	if err := scavengeToEnd(ctx, op, s); err != nil {
		t.Errorf("operator's scavenge after a writer's set_stream_retention: %v", err)
	}
	store, err := eventstore.New(w.Pool, &eventstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	checkStream(t, store, "acct-1", 2559672*time.Hour)
}

// checkStream reads stream's info and events through the Go client: its
// maximum age is want and its one event is visible.
func checkStream(t *testing.T, store *eventstore.Store, stream string, want time.Duration) {
	t.Helper()
	ctx := context.Background()
	info, err := store.StreamInfo(ctx, stream)
	if err != nil || info.MaxAge != want {
		t.Errorf("StreamInfo(%s): MaxAge %v, %v; want %v", stream, info.MaxAge, err, want)
	}
	n := 0
	for _, err := range store.ReadStream(ctx, stream, 1) {
		if err != nil {
			t.Errorf("ReadStream(%s): %v", stream, err)
			break
		}
		n++
	}
	if n != 1 {
		t.Errorf("ReadStream(%s) read %d events, want 1", stream, n)
	}
}

// Maximum ages stored before 0032 are converted: one within 292 years to
// the same length as a fixed interval, a longer one to 292 years, one that
// is not positive as a length to no limit. Scavenging, StreamInfo and
// reads then work on every stream.
func TestStoredMaxAgeConverted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	cfg := upTo(t, db, "before32", wedgeMigration)
	s := pgx.Identifier{cfg.Schema}.Sanitize()
	ages := map[string]struct{ set, want string }{
		"huge":     {"100000 years", "2559672:00:00"},
		"huger":    {"100000000 years", "2559672:00:00"},
		"calendar": {"1 mon 1 day", "744:00:00"},
		"mixed":    {"-1 year 362 days", ""}, // 2 days as PostgreSQL compares, -3.25 as a length
		"plain":    {"36:00:00", "36:00:00"},
	}
	for stream, a := range ages {
		for _, q := range []string{
			`SELECT * FROM ` + s + `.append_one($1, NULL, gen_random_uuid(), 'Opened', '{}', NULL, true)`,
			`SELECT * FROM ` + s + `.set_stream_retention($1, '` + a.set + `', NULL, NULL)`,
		} {
			if _, err := db.Pool.Exec(ctx, q, stream); err != nil {
				t.Fatalf("before 0032: %s: %v", q, err)
			}
		}
	}
	if _, err := migrations.Up(ctx, db.Pool, cfg); err != nil {
		t.Fatal(err)
	}
	for stream, a := range ages {
		var got *string
		if err := db.Pool.QueryRow(ctx, `SELECT max_age::text FROM `+s+`.streams WHERE stream_id = $1`, stream).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if (got == nil) != (a.want == "") || (got != nil && *got != a.want) {
			shown := "NULL"
			if got != nil {
				shown = *got
			}
			t.Errorf("%s: max_age %s after the upgrade, want %q", stream, shown, a.want)
		}
	}
	op := grantedRole(t, db, migrations.Operator, cfg)
	if err := scavengeToEnd(ctx, op, s); err != nil {
		t.Errorf("scavenge over ages stored before 0032: %v", err)
	}
	store, err := eventstore.New(op.Pool, &eventstore.Config{Schema: cfg.Schema})
	if err != nil {
		t.Fatal(err)
	}
	checkStream(t, store, "huge", 2559672*time.Hour)
	checkStream(t, store, "huger", 2559672*time.Hour)
	checkStream(t, store, "mixed", 0)

	// annals verify reports the ages shortened to 292 years (their records
	// say otherwise), not those whose length was kept.
	rep, err := verify.Log(ctx, db.Pool, &verify.Config{Schema: cfg.Schema})
	if err != nil {
		t.Fatal(err)
	}
	var unrecorded []string
	for _, p := range rep.Problems {
		if p.Kind == verify.RetentionUnrecorded {
			unrecorded = append(unrecorded, p.StreamID)
		} else {
			t.Errorf("verify: %s", p.Message)
		}
	}
	if slices.Sort(unrecorded); strings.Join(unrecorded, ",") != "huge,huger" {
		t.Errorf("verify reports retention set outside set_stream_retention for %v, want huge and huger", unrecorded)
	}
}
