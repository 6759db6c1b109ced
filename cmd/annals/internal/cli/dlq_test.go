package cli

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
)

// dlqRow is a dead letter as the runner writes it. Zero fields get
// defaults: subscriber orders, partition 0, stream order-1, type
// order.placed, reason failed, status open, created and updated now.
type dlqRow struct {
	sub              string
	part             int
	seq              int64
	stream, typ      string
	reason, status   string
	err, detail      string
	attempts         int
	failedAt         time.Time // first and last failure; zero: NULL
	created, updated time.Time
}

func orNil(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t
}

func dlqAdd(t *testing.T, db *annalstest.DB, r dlqRow) int64 {
	t.Helper()
	def := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	def(&r.sub, "orders")
	def(&r.stream, "order-1")
	def(&r.typ, "order.placed")
	def(&r.reason, "failed")
	def(&r.status, "open")
	var id int64
	err := db.Pool.QueryRow(t.Context(), `
		INSERT INTO annals.dead_letters
		       (subscriber_id, partition, event_id, global_sequence, stream_id, event_type, reason,
		        error, error_detail, attempts, status, first_failed_at, last_failed_at, created_at, updated_at)
		VALUES ($1, $2, gen_random_uuid(), $3, $4, $5, $6, $7, $8, $9, $10, $11, $11,
		        coalesce($12, clock_timestamp()), coalesce($13, clock_timestamp()))
		RETURNING id`,
		r.sub, r.part, r.seq, r.stream, r.typ, r.reason, r.err, r.detail, r.attempts, r.status,
		orNil(r.failedAt), orNil(r.created), orNil(r.updated)).Scan(&id)
	if err != nil {
		t.Fatalf("insert dead letter %+v: %v", r, err)
	}
	return id
}

// dlqLog appends n events, positions 1 to n in a new database, for dead
// letters to point at: one whose event is not in the log is skipped, not
// released, by dlq retry (TestDlqRetryGone).
func dlqLog(t *testing.T, db *annalstest.DB, n int) {
	t.Helper()
	store, err := eventstore.New(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	evs := make([]eventstore.EventData, n)
	for i := range evs {
		evs[i] = eventstore.EventData{Type: "order.placed", Data: map[string]int{"n": i}}
	}
	if _, err := store.Append(t.Context(), "log-1", eventstore.NoStream, evs...); err != nil {
		t.Fatal(err)
	}
}

// dlqState is every dead letter (ID, status, update time) and every
// checkpoint's stop, to show that a command changed nothing.
func dlqState(t *testing.T, db *annalstest.DB) string {
	t.Helper()
	var s string
	err := db.Pool.QueryRow(t.Context(), `
		SELECT coalesce((SELECT string_agg(id || ' ' || status || ' ' || updated_at, ', ' ORDER BY id) FROM annals.dead_letters), '') || ' | ' ||
		       coalesce((SELECT string_agg(subscriber_id || '/' || partition || ' ' || coalesce(stopped_reason, '-') || ' ' || updated_at, ', '
		                                   ORDER BY subscriber_id, partition) FROM annals.checkpoints), '')`).Scan(&s)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func dlqStatuses(t *testing.T, db *annalstest.DB) map[int64]string {
	t.Helper()
	rows, err := db.Pool.Query(t.Context(), `SELECT id, status FROM annals.dead_letters`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[int64]string{}
	for rows.Next() {
		var id int64
		var st string
		if err := rows.Scan(&id, &st); err != nil {
			t.Fatal(err)
		}
		out[id] = st
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// dlqHalt makes a checkpoint halted by the Stop policy.
func dlqHalt(t *testing.T, db *annalstest.DB, sub string, part int, reason string) {
	t.Helper()
	sqlExec(t, db, `INSERT INTO annals.checkpoints (subscriber_id, partition, position, epoch, stopped_reason, stopped_at)
		VALUES ($1, $2, 0, 1, $3, clock_timestamp())`, sub, part, reason)
}

func dlqStopped(t *testing.T, db *annalstest.DB, sub string, part int) bool {
	t.Helper()
	var stopped bool
	if err := db.Pool.QueryRow(t.Context(), `SELECT stopped_reason IS NOT NULL OR stopped_at IS NOT NULL FROM annals.checkpoints
		WHERE subscriber_id = $1 AND partition = $2`, sub, part).Scan(&stopped); err != nil {
		t.Fatal(err)
	}
	return stopped
}

// listedIDs returns the ID column of a dlq list table, and the "more" line.
func listedIDs(t *testing.T, out string) ([]string, string) {
	t.Helper()
	var ids []string
	more := ""
	for i, line := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		switch {
		case i == 0:
			if !strings.HasPrefix(line, "ID ") {
				t.Fatalf("no header in:\n%s", out)
			}
		case strings.HasPrefix(line, "(more"):
			more = line
		default:
			ids = append(ids, strings.Fields(line)[0])
		}
	}
	return ids, more
}

func strIDs(ids ...int64) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = fmt.Sprint(id)
	}
	return out
}

func TestDlqList(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	at := func(min int) time.Time { return t0.Add(time.Duration(min) * time.Minute) }
	a := dlqAdd(t, db, dlqRow{seq: 10, created: at(0), err: "no such customer\nsecond line", attempts: 4, failedAt: at(0)})
	b := dlqAdd(t, db, dlqRow{seq: 12, created: at(1), reason: "parked"})
	c := dlqAdd(t, db, dlqRow{seq: 11, part: 1, stream: "order-2", typ: "order.shipped", status: "resolved", created: at(2), err: "timeout"})
	e := dlqAdd(t, db, dlqRow{seq: 14, sub: "mailer", stream: "order-3", created: at(3), err: "smtp down"})
	d := dlqAdd(t, db, dlqRow{seq: 13, sub: "mailer", status: "skipped", created: at(3), err: "bounce"})
	// d and e share a creation time: the larger ID comes first.

	for _, tc := range []struct {
		args []string
		want []int64
		more string
	}{
		{nil, []int64{d, e, c, b, a}, ""},
		{[]string{"--subscriber", "orders"}, []int64{c, b, a}, ""},
		{[]string{"--stream", "order-1"}, []int64{d, b, a}, ""},
		{[]string{"--type", "order.shipped"}, []int64{c}, ""},
		{[]string{"--status", "open"}, []int64{e, b, a}, ""},
		{[]string{"--subscriber", "mailer", "--status", "open"}, []int64{e}, ""},
		{[]string{"--limit", "2"}, []int64{d, e}, fmt.Sprintf("(more: --before %d)", e)},
		{[]string{"--limit", "2", "--before", fmt.Sprint(e)}, []int64{c, b}, fmt.Sprintf("(more: --before %d)", b)},
		{[]string{"--limit", "2", "--before", fmt.Sprint(b)}, []int64{a}, ""},
		{[]string{"--status", "open", "--limit", "1", "--before", fmt.Sprint(e)}, []int64{b}, fmt.Sprintf("(more: --before %d)", b)},
		{[]string{"--limit", "2", "--offset", "2"}, []int64{c, b}, fmt.Sprintf("(more: --before %d instead of --offset)", b)},
		{[]string{"--limit", "2", "--offset", "4"}, []int64{a}, ""},
	} {
		r := annals(t, db.URL, append([]string{"dlq", "list"}, tc.args...)...)
		if r.code != 0 || r.stderr != "" {
			t.Errorf("dlq list %v: %+v", tc.args, r)
			continue
		}
		ids, more := listedIDs(t, r.stdout)
		if !slices.Equal(ids, strIDs(tc.want...)) || more != tc.more {
			t.Errorf("dlq list %v: %v %q, want %v %q\n%s", tc.args, ids, more, tc.want, tc.more, r.stdout)
		}
	}

	r := annals(t, db.URL, "dlq", "list", "--subscriber", "orders")
	if l := tableLine(t, r.stdout, fmt.Sprint(a)); l != fmt.Sprintf("%d orders 0 order-1 10 order.placed failed open 4 2026-03-01 12:00:00Z no such customer …", a) {
		t.Errorf("row of %d: %q", a, l)
	}
	if l := tableLine(t, r.stdout, fmt.Sprint(b)); !strings.HasSuffix(l, " parked open 0 2026-03-01 12:01:00Z -") {
		t.Errorf("row of %d: %q", b, l)
	}
	if r := annals(t, db.URL, "dlq", "list", "--subscriber", "nobody"); r.code != 0 || r.stdout != "No dead letters match.\n" {
		t.Errorf("no match: %+v", r)
	}
	if r := annals(t, db.URL, "dlq", "list", "--offset", "5"); r.code != 0 || r.stdout != "No dead letters match.\n" {
		t.Errorf("beyond the end: %+v", r)
	}
	if r := annals(t, db.URL, "dlq", "list", "--before", fmt.Sprint(a)); r.code != 0 || r.stdout != "No dead letters match.\n" {
		t.Errorf("before the first: %+v", r)
	}

	t.Run("JSONL", func(t *testing.T) {
		r := annals(t, db.URL, "dlq", "list", "--output", "jsonl", "--subscriber", "orders")
		lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
		if r.code != 0 || len(lines) != 3 {
			t.Fatalf("jsonl: %+v", r)
		}
		var keys map[string]json.RawMessage
		if err := json.Unmarshal([]byte(lines[2]), &keys); err != nil {
			t.Fatal(err)
		}
		want := []string{"attempts", "created_at", "error", "error_detail", "event_id", "event_type", "first_failed_at", "global_sequence",
			"id", "last_failed_at", "partition", "reason", "status", "stream_id", "subscriber_id", "updated_at"}
		if got := slices.Sorted(maps.Keys(keys)); !slices.Equal(got, want) {
			t.Errorf("keys %v, want %v", got, want)
		}
		var first, parked JSONLDeadLetter
		if err := json.Unmarshal([]byte(lines[2]), &first); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal([]byte(lines[1]), &parked); err != nil {
			t.Fatal(err)
		}
		if first.ID != a || first.Error != "no such customer\nsecond line" || first.Attempts != 4 || first.Status != "open" ||
			first.FirstFailedAt == nil || !first.FirstFailedAt.Equal(t0) || !first.CreatedAt.Equal(t0) || first.GlobalSequence != 10 {
			t.Errorf("first: %+v", first)
		}
		if parked.ID != b || parked.Reason != "parked" || parked.FirstFailedAt != nil || string(keysOf(t, lines[1])["last_failed_at"]) != "null" {
			t.Errorf("parked: %+v", parked)
		}
	})
}

func keysOf(t *testing.T, line string) map[string]json.RawMessage {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(line), &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func TestDlqShow(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 123456000, time.UTC)
	detail := "no such customer c-9\n(1) attached stack trace\n  -- stack trace:\n  | main.handle\n  | \tmain.go:12\nWraps: (2) no such customer c-9"
	id := dlqAdd(t, db, dlqRow{part: 2, seq: 42, stream: "order-7", err: "no such customer c-9", detail: detail, attempts: 4,
		failedAt: t0, created: t0.Add(time.Second), updated: t0.Add(2 * time.Second)})
	r := annals(t, db.URL, "dlq", "show", fmt.Sprint(id))
	if r.code != 0 || r.stderr != "" {
		t.Fatalf("show: %+v", r)
	}
	for _, cells := range [][]string{
		{"id", fmt.Sprint(id)}, {"subscriber_id", "orders"}, {"partition", "2"}, {"global_sequence", "42"},
		{"stream_id", "order-7"}, {"event_type", "order.placed"}, {"reason", "failed"}, {"status", "open"}, {"attempts", "4"},
		{"first_failed_at", "2026-03-01", "12:00:00.123456Z"}, {"last_failed_at", "2026-03-01", "12:00:00.123456Z"},
		{"created_at", "2026-03-01", "12:00:01.123456Z"}, {"updated_at", "2026-03-01", "12:00:02.123456Z"},
	} {
		if l := tableLine(t, r.stdout, cells...); l != strings.Join(cells, " ") {
			t.Errorf("line %q", l)
		}
	}
	if l := tableLine(t, r.stdout, "event_id"); len(strings.Fields(l)) != 2 || len(strings.Fields(l)[1]) != 36 {
		t.Errorf("event_id line %q", l)
	}
	if !strings.HasSuffix(r.stdout, "\nerror:\nno such customer c-9\n\nerror_detail:\n"+detail+"\n") {
		t.Errorf("error and detail not shown in full:\n%s", r.stdout)
	}

	parked := dlqAdd(t, db, dlqRow{seq: 43, stream: "order-7", reason: "parked"})
	r = annals(t, db.URL, "dlq", "show", fmt.Sprint(parked))
	if r.code != 0 || tableLine(t, r.stdout, "first_failed_at") != "first_failed_at -" ||
		!strings.HasSuffix(r.stdout, "\nerror:\n(none)\n\nerror_detail:\n(none)\n") {
		t.Errorf("show parked: %+v", r)
	}
}

// dlqParked is a parked stream of orders/0 (failed at 10, parked 12 and 15,
// inserted out of order) and its neighbours, with orders/0 and orders/1
// halted by the Stop policy.
type dlqParked struct {
	failed, parked12, parked15                             int64
	otherStream, otherPartition, otherSubscriber, resolved int64
}

func dlqPark(t *testing.T, db *annalstest.DB) dlqParked {
	t.Helper()
	dlqLog(t, db, 20)
	var p dlqParked
	p.resolved = dlqAdd(t, db, dlqRow{seq: 2, status: "resolved"})
	p.parked15 = dlqAdd(t, db, dlqRow{seq: 15, reason: "parked"})
	p.failed = dlqAdd(t, db, dlqRow{seq: 10, err: "boom", attempts: 4})
	p.parked12 = dlqAdd(t, db, dlqRow{seq: 12, reason: "parked"})
	p.otherStream = dlqAdd(t, db, dlqRow{seq: 11, stream: "order-2"})
	p.otherPartition = dlqAdd(t, db, dlqRow{seq: 13, part: 1})
	p.otherSubscriber = dlqAdd(t, db, dlqRow{seq: 14, sub: "mailer"})
	dlqHalt(t, db, "orders", 0, "dead letter at position 10")
	dlqHalt(t, db, "orders", 1, "dead letter at position 13")
	return p
}

func TestDlqRetry(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	p := dlqPark(t, db)

	r := annals(t, db.URL, "dlq", "retry", fmt.Sprint(p.parked12))
	lines := strings.Split(r.stdout, "\n")
	if r.code != 0 || len(lines) != 3 ||
		lines[0] != fmt.Sprintf("marked 3 dead letters for retry: %d, %d, %d", p.failed, p.parked12, p.parked15) ||
		!strings.HasPrefix(lines[1], "resumed orders/0 (stopped since ") || !strings.HasSuffix(lines[1], ": dead letter at position 10)") {
		t.Fatalf("retry: %+v", r)
	}
	st := dlqStatuses(t, db)
	want := map[int64]string{p.failed: "retry", p.parked12: "retry", p.parked15: "retry", p.otherStream: "open",
		p.otherPartition: "open", p.otherSubscriber: "open", p.resolved: "resolved"}
	if !maps.Equal(st, want) {
		t.Errorf("statuses %v, want %v", st, want)
	}
	if dlqStopped(t, db, "orders", 0) || !dlqStopped(t, db, "orders", 1) {
		t.Error("want orders/0 resumed and orders/1 still stopped")
	}

	// Twice: nothing to do, nothing changed.
	before := dlqState(t, db)
	for _, tc := range []struct {
		id   int64
		want string
	}{
		{p.parked12, "is already marked for retry"},
		{p.failed, "is already marked for retry"},
		{p.resolved, "is resolved"},
	} {
		r := annals(t, db.URL, "dlq", "retry", fmt.Sprint(tc.id))
		if r.code != 0 || r.stdout != fmt.Sprintf("nothing to do: dead letter %d %s\n", tc.id, tc.want) {
			t.Errorf("retry %d again: %+v", tc.id, r)
		}
	}
	if after := dlqState(t, db); after != before {
		t.Errorf("no-op retries changed\n%s\nto\n%s", before, after)
	}

	t.Run("All", func(t *testing.T) {
		r := annals(t, db.URL, "dlq", "retry", "--subscriber", "orders", "--all")
		want := fmt.Sprintf("marked 2 dead letters for retry: %d, %d\nresumed orders/1 (stopped since ", p.otherStream, p.otherPartition)
		if r.code != 0 || !strings.HasPrefix(r.stdout, want) || !strings.HasSuffix(r.stdout, ": dead letter at position 13)\n") {
			t.Fatalf("retry --all: %+v", r)
		}
		if st := dlqStatuses(t, db); st[p.otherSubscriber] != "open" || st[p.otherStream] != "retry" || st[p.otherPartition] != "retry" {
			t.Errorf("statuses %v", st)
		}
		before := dlqState(t, db)
		r = annals(t, db.URL, "dlq", "retry", "--subscriber", "orders", "--all")
		if r.code != 0 || r.stdout != "nothing to do: subscriber orders has no open dead letters and is not stopped\n" {
			t.Errorf("retry --all again: %+v", r)
		}
		if after := dlqState(t, db); after != before {
			t.Errorf("second retry --all changed\n%s\nto\n%s", before, after)
		}
	})
}

func TestDlqSkip(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	p := dlqPark(t, db)
	r := annals(t, db.URL, "dlq", "skip", fmt.Sprint(p.failed))
	want := fmt.Sprintf("skipped dead letter %d\nmarked 2 dead letters for retry: %d, %d\nresumed orders/0 (stopped since ", p.failed, p.parked12, p.parked15)
	if r.code != 0 || !strings.HasPrefix(r.stdout, want) {
		t.Fatalf("skip: %+v", r)
	}
	st := dlqStatuses(t, db)
	if st[p.failed] != "skipped" || st[p.parked12] != "retry" || st[p.parked15] != "retry" || st[p.otherStream] != "open" || st[p.otherPartition] != "open" {
		t.Errorf("statuses %v", st)
	}
	if dlqStopped(t, db, "orders", 0) {
		t.Error("orders/0 still stopped")
	}
	before := dlqState(t, db)
	for id, want := range map[int64]string{p.failed: "is already skipped", p.resolved: "is resolved"} {
		r := annals(t, db.URL, "dlq", "skip", fmt.Sprint(id))
		if r.code != 0 || r.stdout != fmt.Sprintf("nothing to do: dead letter %d %s\n", id, want) {
			t.Errorf("skip %d: %+v", id, r)
		}
	}
	if after := dlqState(t, db); after != before {
		t.Errorf("no-op skips changed\n%s\nto\n%s", before, after)
	}
}

// TestDlqRetryGone: a dead letter whose event a hard delete and scavenge
// (a truncation, retention) removed from the log cannot be re-delivered;
// dlq retry skips it and says so, in text and in JSON ("gone", also in
// "skipped"), and releases the rest of its stream.
func TestDlqRetryGone(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	dlqLog(t, db, 20)
	failed := dlqAdd(t, db, dlqRow{seq: 30, err: "boom", attempts: 1})
	parked := dlqAdd(t, db, dlqRow{seq: 31, reason: "parked"})
	kept := dlqAdd(t, db, dlqRow{seq: 10, reason: "parked"})
	r := annals(t, db.URL, "dlq", "retry", fmt.Sprint(failed))
	want := fmt.Sprintf("skipped 2 dead letters whose events no longer exist in the log (removed by a hard delete and scavenge, "+
		"a truncation or retention), so they cannot be retried: %d, %d\nmarked 1 dead letter for retry: %d\n", failed, parked, kept)
	if r.code != 0 || r.stdout != want {
		t.Fatalf("retry: %+v\nwant stdout %q", r, want)
	}
	if st := dlqStatuses(t, db); st[failed] != "skipped" || st[parked] != "skipped" || st[kept] != "retry" {
		t.Errorf("statuses %v", st)
	}
	r = annals(t, db.URL, "dlq", "show", fmt.Sprint(failed))
	if r.code != 0 || !strings.Contains(r.stdout, "error:\nnot delivered: the event no longer exists in the log") || !strings.Contains(r.stdout, "last error: boom\n") {
		t.Errorf("show: %+v", r)
	}

	one := dlqAdd(t, db, dlqRow{seq: 40, sub: "mailer"})
	r = annals(t, db.URL, "dlq", "retry", fmt.Sprint(one), "--output", "json")
	var c ChangeJSON
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &c) != nil {
		t.Fatalf("retry --output json: %+v", r)
	}
	if !c.Changed || c.Was != "open" || !slices.Equal(c.Gone, []int64{one}) || !slices.Equal(c.Skipped, []int64{one}) || len(c.Retried) != 0 {
		t.Errorf("retry --output json: %+v; want %d gone and skipped", c, one)
	}
	again := dlqAdd(t, db, dlqRow{seq: 41, sub: "billing"})
	r = annals(t, db.URL, "dlq", "retry", "--subscriber", "billing", "--all")
	if want := fmt.Sprintf("skipped dead letter %d: its event no longer exists in the log (removed by a hard delete and scavenge, "+
		"a truncation or retention), so it cannot be retried\n", again); r.code != 0 || r.stdout != want {
		t.Errorf("retry --all: %+v\nwant stdout %q", r, want)
	}
}

func TestDlqPurge(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	now := time.Now()
	day := 24 * time.Hour
	oldResolved := dlqAdd(t, db, dlqRow{seq: 1, status: "resolved", updated: now.Add(-31 * day)})
	youngResolved := dlqAdd(t, db, dlqRow{seq: 2, status: "resolved", updated: now.Add(-29 * day)})
	oldSkipped := dlqAdd(t, db, dlqRow{seq: 3, status: "skipped", updated: now.Add(-40 * day)})
	oldOpen := dlqAdd(t, db, dlqRow{seq: 4, status: "open", updated: now.Add(-40 * day)})
	oldRetry := dlqAdd(t, db, dlqRow{seq: 5, status: "retry", updated: now.Add(-30*day - time.Hour)})
	youngOpen := dlqAdd(t, db, dlqRow{seq: 6, status: "open"})

	remaining := func() []int64 {
		return slices.Sorted(maps.Keys(dlqStatuses(t, db)))
	}
	r := annals(t, db.URL, "dlq", "purge", "--older-than", "30d")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "purged 2 dead letters resolved or skipped last updated at or before ") {
		t.Fatalf("purge: %+v", r)
	}
	cutoff, err := time.Parse(preciseLayout, strings.TrimSpace(strings.TrimPrefix(r.stdout, "purged 2 dead letters resolved or skipped last updated at or before ")))
	if err != nil || cutoff.Before(now.Add(-30*day-time.Minute)) || cutoff.After(time.Now().Add(-30*day+time.Minute)) {
		t.Errorf("cutoff %v (%v), want about 30 days ago", cutoff, err)
	}
	if got, want := remaining(), []int64{youngResolved, oldOpen, oldRetry, youngOpen}; !slices.Equal(got, want) {
		t.Fatalf("after purge: %v, want %v (purged %d and %d)", got, want, oldResolved, oldSkipped)
	}
	r = annals(t, db.URL, "dlq", "purge", "--older-than", "30d")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "nothing to do: no dead letters resolved or skipped last updated at or before ") {
		t.Errorf("second purge: %+v", r)
	}
	// Deleting unresolved dead letters cannot be undone: it needs --yes
	// without a terminal (exit 2), and a terminal's yes; a no changes nothing.
	r = annals(t, db.URL, "dlq", "purge", "--older-than", "720h", "--include-unresolved")
	if r.code != ExitUsage || !strings.Contains(r.stderr, "pass --yes to delete the open and retry dead letters") {
		t.Errorf("purge --include-unresolved without --yes: %+v", r)
	}
	r = annalsIn(t, db.URL, ttyReader{strings.NewReader("n\n")}, "dlq", "purge", "--older-than", "720h", "--include-unresolved")
	if r.code != ExitFailure || !strings.Contains(r.stderr, "About to delete the open and retry dead letters") ||
		!strings.Contains(r.stderr, "not confirmed: no dead letter was purged") {
		t.Errorf("purge --include-unresolved, not confirmed: %+v", r)
	}
	if got, want := remaining(), []int64{youngResolved, oldOpen, oldRetry, youngOpen}; !slices.Equal(got, want) {
		t.Fatalf("after refused purges: %v, want %v", got, want)
	}
	r = annals(t, db.URL, "dlq", "purge", "--older-than", "720h", "--include-unresolved", "--yes")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "purged 2 dead letters of any status last updated at or before ") {
		t.Errorf("purge --include-unresolved: %+v", r)
	}
	if got, want := remaining(), []int64{youngResolved, youngOpen}; !slices.Equal(got, want) {
		t.Fatalf("after purge --include-unresolved: %v, want %v", got, want)
	}
	r = annals(t, db.URL, "dlq", "purge", "--older-than", "28d23h", "--yes") // --yes is accepted, needed or not
	if r.code != 0 || !strings.HasPrefix(r.stdout, "purged 1 dead letter resolved or skipped ") {
		t.Errorf("purge --older-than 28d23h: %+v", r)
	}
}

func TestDlqParseAge(t *testing.T) {
	t.Parallel()
	day := 24 * time.Hour
	for in, want := range map[string]time.Duration{
		"30d": 30 * day, "12h": 12 * time.Hour, "1d12h": 36 * time.Hour, "90m": 90 * time.Minute, "0s": 0, "0d": 0, "0": 0,
		"1.5h": 90 * time.Minute, "2d30m15s": 2*day + 30*time.Minute + 15*time.Second, "106751d": 106751 * day,
	} {
		if got, err := parseAge(in); err != nil || got != want {
			t.Errorf("parseAge(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "d", "30", "-1d", "+1d", "1d-3h", "1d+3h", "30D", "1.5d", "-5m", "abc", "1d1d", "d5h",
		" 30d", "106752d", "106751d24h", "99999999999999999999d", "9223372036854775807ns1h"} {
		if got, err := parseAge(in); err == nil {
			t.Errorf("parseAge(%q) = %v, want an error", in, got)
		}
	}
}

// Bad input exits 2 with one line of error and a usage hint, and changes nothing.
func TestDlqBadInput(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	p := dlqPark(t, db)
	id := fmt.Sprint(p.failed)
	before := dlqState(t, db)
	for _, args := range [][]string{
		{"dlq"},
		{"dlq", "bogus"},
		{"dlq", "list", "--status", "pending"},
		{"dlq", "list", "--status", "OPEN"},
		{"dlq", "list", "--limit", "0"},
		{"dlq", "list", "--limit", "1001"},
		{"dlq", "list", "--limit", "-1"},
		{"dlq", "list", "--limit", "ten"},
		{"dlq", "list", "--offset", "-1"},
		{"dlq", "list", "--before", "0"},
		{"dlq", "list", "--before", "-1"},
		{"dlq", "list", "--before", "x"},
		{"dlq", "list", "--before", "5", "--offset", "1"},
		{"dlq", "list", "--output", "yaml"},
		{"dlq", "list", "--subscriber", ""},
		{"dlq", "list", "extra"},
		{"dlq", "list", "--schema", "bad$schema"},
		{"dlq", "show"},
		{"dlq", "show", "abc"},
		{"dlq", "show", "0"},
		{"dlq", "show", id, id},
		{"dlq", "retry"},
		{"dlq", "retry", "abc"},
		{"dlq", "retry", "1.5"},
		{"dlq", "retry", "-1"},
		{"dlq", "retry", "99999999999999999999"},
		{"dlq", "retry", "--all"},
		{"dlq", "retry", "--subscriber", "orders"},
		{"dlq", "retry", "--subscriber", "", "--all"},
		{"dlq", "retry", id, "--subscriber", "orders", "--all"},
		{"dlq", "retry", id, "--all"},
		{"dlq", "retry", id, "--subscriber", "orders"},
		{"dlq", "retry", id, id},
		{"dlq", "skip"},
		{"dlq", "skip", "x"},
		{"dlq", "purge"},
		{"dlq", "purge", "--include-unresolved"},
		{"dlq", "purge", "--older-than", "30"},
		{"dlq", "purge", "--older-than", "30x"},
		{"dlq", "purge", "--older-than", "-1d"},
		{"dlq", "purge", "--older-than", ""},
		{"dlq", "purge", "--older-than", "1d-1h"},
		{"dlq", "purge", "--older-than", "999999d"},
		{"dlq", "purge", "--older-than", "0s", "extra"},
	} {
		r := annals(t, db.URL, args...)
		if r.code != 2 || r.stdout != "" || !strings.HasPrefix(r.stderr, "annals: ") || strings.Count(r.stderr, "\n") != 2 {
			t.Errorf("annals %q: %+v", args, r)
		}
	}
	// What does not exist is not found (exit 3), like an unknown cron task.
	for _, args := range [][]string{{"show", "99"}, {"retry", "99"}, {"skip", "99"}} {
		r := annals(t, db.URL, append([]string{"dlq"}, args...)...)
		if r.code != ExitNotFound || r.stdout != "" || r.stderr != "annals: no dead letter 99 (see 'annals dlq list')\n" {
			t.Errorf("dlq %v: %+v", args, r)
		}
	}
	if r := annals(t, db.URL, "dlq", "retry", "--subscriber", "ordres", "--all"); r.code != ExitNotFound || !strings.Contains(r.stderr, `unknown subscriber "ordres"`) {
		t.Errorf("unknown subscriber: %+v", r)
	}
	if r := annals(t, db.URL, "dlq", "purge", "--older-than", "30x"); !strings.Contains(r.stderr, "want a duration like 30d, 12h or 1d12h") {
		t.Errorf("malformed duration: %q", r.stderr)
	}
	if after := dlqState(t, db); after != before {
		t.Errorf("bad input changed\n%s\nto\n%s", before, after)
	}

	// A schema without the tables is a failure, with a hint.
	r := annals(t, db.URL, "dlq", "list", "--schema", "nowhere")
	if r.code != 1 || !strings.Contains(r.stderr, "annals migrate") || strings.Count(r.stderr, "\n") != 1 {
		t.Errorf("dlq list on a missing schema: %+v", r)
	}
}

// Setting a checkpoint back delivers the events after it again: the
// partition's dead letters after the new position, skipped ones too, are
// settled as resolved (one that fails again is open again), so that Await
// does not report an event the replay applies as dead-lettered. Moving
// forward, or another partition's, leaves them.
func TestCheckpointSetBackSettlesDeadLetters(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	store, err := eventstore.New(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 30 {
		if _, err := store.Append(t.Context(), "order-1", eventstore.Any, eventstore.EventData{Type: "order.placed", Data: map[string]any{}}); err != nil {
			t.Fatal(err)
		}
	}
	sqlExec(t, db, `INSERT INTO annals.checkpoints (subscriber_id, partition, position, epoch) VALUES ('orders', 0, 20, 1), ('orders', 1, 20, 1)`)
	before := dlqAdd(t, db, dlqRow{seq: 5})
	open := dlqAdd(t, db, dlqRow{seq: 12})
	skipped := dlqAdd(t, db, dlqRow{seq: 14, status: "skipped"})
	released := dlqAdd(t, db, dlqRow{seq: 15, status: "retry"})
	otherPart := dlqAdd(t, db, dlqRow{seq: 13, part: 1})
	otherSub := dlqAdd(t, db, dlqRow{seq: 13, sub: "mailer"})

	r := annals(t, db.URL, "checkpoint", "set", "orders", "25", "--yes")
	if r.code != 0 || strings.Contains(r.stdout, "settled") {
		t.Fatalf("set forward: %+v", r)
	}
	if st := dlqStatuses(t, db); st[open] != "open" || st[skipped] != "skipped" || st[released] != "retry" {
		t.Fatalf("moving forward changed dead letters: %v", st)
	}
	var out CheckpointSetJSON
	r = annals(t, db.URL, "checkpoint", "set", "orders", "10", "--yes", "--output", "json")
	if r.code != 0 {
		t.Fatalf("set back: %+v", r)
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || out.DeadLettersSettled != 3 {
		t.Fatalf("set back: %+v (%v); want 3 dead letters settled", r, err)
	}
	want := map[int64]string{before: "open", open: "resolved", skipped: "resolved", released: "resolved", otherPart: "open", otherSub: "open"}
	if st := dlqStatuses(t, db); !maps.Equal(st, want) {
		t.Fatalf("statuses after setting back: %v, want %v", st, want)
	}
	var detail string
	if err := db.Pool.QueryRow(t.Context(), `SELECT detail->>'dead_letters_settled' FROM annals.audit_log
		WHERE action = 'checkpoint.set' ORDER BY id DESC LIMIT 1`).Scan(&detail); err != nil || detail != "3" {
		t.Fatalf("audit detail dead_letters_settled = %q (%v), want 3", detail, err)
	}
}
