package archive_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/archive"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/schemaname"
	"github.com/annals-dev/annals/projection"
	"github.com/annals-dev/annals/scavenge"
	"github.com/annals-dev/annals/verify"
)

// balances is a projection with real state: per stream a balance, an event
// count and the last version and position applied. It refuses an event
// that is not the next version of its stream (a skip or a reordering), and
// records every event it applies in <table>_applied, in application order.
type balances struct{ name, table string }

func (b balances) Name() string { return b.name }

// Reset empties the read model before a rebuild.
func (b balances) Reset(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, `TRUNCATE `+b.table+`, `+b.table+`_applied RESTART IDENTITY`)
	return err
}

func (b balances) Handle(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	var d struct {
		Amount int64 `json:"amount"`
	}
	if err := json.Unmarshal(e.Data, &d); err != nil {
		return err
	}
	amount := d.Amount
	// Every stream starts at version 1 here: the count of its events
	// applied must be its version.
	var applied int64
	err := tx.QueryRow(ctx, `INSERT INTO `+b.table+` AS t (stream_id, amount, events, last_version, last_position)
		VALUES ($1, $2, 1, $3, $4)
		ON CONFLICT (stream_id) DO UPDATE SET amount = t.amount + $2, events = t.events + 1,
			last_version = $3, last_position = $4
		WHERE t.last_version = $3 - 1 AND t.last_position < $4
		RETURNING t.events`, e.StreamID, amount, e.StreamVersion, e.GlobalSequence).Scan(&applied)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && applied != e.StreamVersion) {
		return errors.Newf("%s: event %d (%s@%d) is not the next of its stream", b.name, e.GlobalSequence, e.StreamID, e.StreamVersion)
	}
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `INSERT INTO `+b.table+`_applied (global_sequence, event_id) VALUES ($1, $2)`, e.GlobalSequence, e.ID)
	return err
}

func createBalances(t *testing.T, db *annalstest.DB, table string) {
	t.Helper()
	if _, err := db.Pool.Exec(context.Background(), `
		CREATE TABLE `+table+` (stream_id text PRIMARY KEY, amount bigint NOT NULL, events int NOT NULL,
			last_version bigint NOT NULL, last_position bigint NOT NULL);
		CREATE TABLE `+table+`_applied (n bigserial PRIMARY KEY, global_sequence bigint NOT NULL UNIQUE, event_id uuid NOT NULL)`); err != nil {
		t.Fatal(err)
	}
}

// state is a projection's tables as text, for comparison.
func state(t *testing.T, db *annalstest.DB, table string) (rows, applied []string) {
	t.Helper()
	ctx := context.Background()
	read := func(sql string) []string {
		r, err := db.Pool.Query(ctx, sql)
		if err != nil {
			t.Fatal(err)
		}
		out, err := pgx.CollectRows(r, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	return read(`SELECT t::text FROM ` + table + ` t ORDER BY stream_id`),
		read(`SELECT global_sequence || ' ' || event_id FROM ` + table + `_applied ORDER BY n`)
}

func deposit(amount int) eventstore.EventData {
	return eventstore.EventData{Type: "acct.deposited", Data: map[string]any{"amount": amount}}
}

type fixture struct {
	db    *annalstest.DB
	store *eventstore.Store
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	db := annalstest.NewDB(t, nil)
	store, err := eventstore.New(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{db: db, store: store}
}

// fill appends n events interleaved over streams acct-0..acct-(streams-1),
// several per append.
func (f *fixture) fill(t *testing.T, streams, n int) {
	t.Helper()
	ctx := context.Background()
	for i := 0; i < n; {
		s := fmt.Sprintf("acct-%d", (i/3)%streams)
		k := min(3, n-i)
		evs := make([]eventstore.EventData, k)
		for j := range evs {
			evs[j] = deposit(i + j + 1)
		}
		if _, err := f.store.Append(ctx, s, eventstore.Any, evs...); err != nil {
			t.Fatal(err)
		}
		i += k
	}
}

// bulk appends 64 events with IDs of the caller's to a new stream in one
// call, and returns them and the outcome: re-appending them is a call of 64
// events, which append_batch may make without looking the IDs up first
// (migration 0020).
func (f *fixture) bulk(t *testing.T, stream string) ([]eventstore.EventData, eventstore.AppendResult) {
	t.Helper()
	events := make([]eventstore.EventData, 64)
	for i := range events {
		events[i] = deposit(i)
		events[i].ID = uuid.New()
	}
	res, err := f.store.Append(context.Background(), stream, eventstore.NoStream, events...)
	if err != nil {
		t.Fatal(err)
	}
	return events, res
}

func (f *fixture) archiver(t *testing.T, cfg archive.Config) *archive.Archiver {
	t.Helper()
	if cfg.Pause == 0 {
		cfg.Pause = -1
	}
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	a, err := archive.New(f.db.Pool, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func (f *fixture) count(t *testing.T, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := f.db.Pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// readAll returns the log from position 0 as "position id stream@version type data".
func (f *fixture) readAll(t *testing.T) []string {
	t.Helper()
	var out []string
	for e, err := range f.store.ReadAll(context.Background(), 0) {
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("%d %s %s@%d %s %s", e.GlobalSequence, e.ID, e.StreamID, e.StreamVersion, e.Type, e.Data))
	}
	return out
}

func (f *fixture) readStream(t *testing.T, stream string, from int64) []string {
	t.Helper()
	var out []string
	for e, err := range f.store.ReadStream(context.Background(), stream, from) {
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("%d %s %s@%d %s", e.GlobalSequence, e.ID, e.StreamID, e.StreamVersion, e.Data))
	}
	return out
}

func newRunner(t *testing.T, f *fixture, ps ...balances) *projection.Runner {
	t.Helper()
	r, err := projection.NewRunner(f.db.Pool, &projection.Config{LockRetryInterval: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if err := r.Register(p, nil); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

// TestArchiveThenRebuild: archiving 90% of the log changes nothing any
// reader sees. A rebuild from zero after archiving equals the rebuild
// before it; ReadAll from 0 and ReadStream across the horizon return the
// same events; a fresh subscriber catches up across the horizon with
// nothing skipped, duplicated or reordered; annals verify finds nothing.
func TestArchiveThenRebuild(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	f := newFixture(t)
	const streams, n = 7, 3000
	f.fill(t, streams, n)
	head, err := f.store.Head(ctx)
	if err != nil {
		t.Fatal(err)
	}
	createBalances(t, f.db, "bal")
	runner := newRunner(t, f, balances{"balances", "bal"})
	if err := runner.RunUntilCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	if err := runner.Rebuild(ctx, "balances", nil); err != nil {
		t.Fatal(err)
	}
	wantRows, wantApplied := state(t, f.db, "bal")
	if len(wantRows) != streams || len(wantApplied) != n {
		t.Fatalf("before archiving: %d streams, %d applied", len(wantRows), len(wantApplied))
	}
	wantLog := f.readAll(t)
	wantStreams := map[string][]string{}
	for i := range streams {
		s := fmt.Sprintf("acct-%d", i)
		wantStreams[s] = f.readStream(t, s, 1)
	}

	before := head * 9 / 10
	var steps []archive.Progress
	a := f.archiver(t, archive.Config{BatchSize: 250, InstanceID: "test",
		OnProgress: func(p archive.Progress) { steps = append(steps, p) }})
	p, err := a.RunOnce(ctx, before)
	if err != nil {
		t.Fatal(err)
	}
	if !p.Done || p.From != 0 || p.Target != before-1 || p.ArchivedTo != before-1 || p.Moved != before-1 || p.Before != before {
		t.Fatalf("run %+v, want positions 1..%d moved", p, before-1)
	}
	if want := int((before - 1 + 249) / 250); len(steps) != want || p.Steps != want {
		t.Fatalf("%d steps reported, %d recorded; want %d", len(steps), p.Steps, want)
	}
	if hot, arch := f.count(t, `SELECT count(*) FROM annals.events`), f.count(t, `SELECT count(*) FROM annals.events_archive`); arch != before-1 || hot != head-before+1 {
		t.Fatalf("%d hot and %d archived events, want %d and %d", hot, arch, head-before+1, before-1)
	}
	if h, err := f.store.Head(ctx); err != nil || h != head {
		t.Fatalf("head %d after archiving, want %d (%v)", h, head, err)
	}

	if got := f.readAll(t); !slices.Equal(got, wantLog) {
		t.Fatalf("ReadAll from 0 after archiving: %d events, want %d (first difference at %d)", len(got), len(wantLog), firstDiff(got, wantLog))
	}
	for s, want := range wantStreams {
		if got := f.readStream(t, s, 1); !slices.Equal(got, want) {
			t.Fatalf("ReadStream %s after archiving differs at %d", s, firstDiff(got, want))
		}
		// From a version in the middle: the first versions come from the
		// archive, the rest from the hot table.
		mid := int64(len(want) / 2)
		if got := f.readStream(t, s, mid); !slices.Equal(got, want[mid-1:]) {
			t.Fatalf("ReadStream %s from %d after archiving differs at %d", s, mid, firstDiff(got, want[mid-1:]))
		}
	}

	if err := runner.Rebuild(ctx, "balances", nil); err != nil {
		t.Fatal(err)
	}
	gotRows, gotApplied := state(t, f.db, "bal")
	if !slices.Equal(gotRows, wantRows) || !slices.Equal(gotApplied, wantApplied) {
		t.Fatalf("rebuild after archiving differs:\n got  %v\n want %v\n applied: %d, first difference at %d",
			gotRows, wantRows, len(gotApplied), firstDiff(gotApplied, wantApplied))
	}

	// A subscriber that starts after the archiving, from 0, through the
	// catch-up engine (not a rebuild).
	createBalances(t, f.db, "fresh")
	fresh := newRunner(t, f, balances{"fresh", "fresh"})
	if err := fresh.RunUntilCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	if rows, applied := state(t, f.db, "fresh"); !slices.Equal(rows, wantRows) || !slices.Equal(applied, wantApplied) {
		t.Fatalf("fresh subscriber after archiving: %d rows, %d applied (first difference at %d)", len(rows), len(applied), firstDiff(applied, wantApplied))
	}

	rep, err := verify.Log(ctx, f.db.Pool, nil)
	if err != nil || len(rep.Problems) != 0 {
		t.Fatalf("verify after archiving: %+v %v", rep, err)
	}
	st, err := a.Status(ctx, 5)
	if err != nil {
		t.Fatal(err)
	}
	if st.Horizon != before || st.Moved != before-1 || st.NewestArchived != before-1 || st.Head != head ||
		len(st.Runs) != 1 || st.Runs[0].Instance != "test" || st.Runs[0].FinishedAt == nil || st.ArchiveBytes == 0 {
		t.Fatalf("status %+v", st)
	}
	// Archiving again below the horizon moves nothing; the newest event is
	// never archived, whatever before says.
	if p, err := a.RunOnce(ctx, before); err != nil || !p.Done || p.Moved != 0 {
		t.Fatalf("second run %+v %v", p, err)
	}
	if p, err := a.RunOnce(ctx, head+100); err != nil || !p.Done || p.Target != head-1 || p.Moved != head-before {
		t.Fatalf("run to beyond the head: %+v %v", p, err)
	}
	if hot := f.count(t, `SELECT count(*) FROM annals.events`); hot != 1 {
		t.Fatalf("%d hot events, want the newest only", hot)
	}
	if got := f.readAll(t); !slices.Equal(got, wantLog) {
		t.Fatalf("ReadAll after archiving all but the newest differs at %d", firstDiff(got, wantLog))
	}
	// And the live subscriber goes on from the hot table.
	if _, err := f.store.Append(ctx, "acct-0", eventstore.Any, deposit(5)); err != nil {
		t.Fatal(err)
	}
	if err := fresh.RunUntilCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	if _, applied := state(t, f.db, "fresh"); len(applied) != n+1 {
		t.Fatalf("fresh subscriber applied %d events, want %d", len(applied), n+1)
	}
}

func firstDiff(a, b []string) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// TestIdempotencyAcrossTheArchive: re-appending an archived event is
// answered with its stored position, through every append path; another
// event with an archived ID is refused.
func TestIdempotencyAcrossTheArchive(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	ids := make([]uuid.UUID, 6)
	var first eventstore.AppendResult
	for i := range ids {
		ids[i] = uuid.New()
		e := deposit(i)
		e.ID = ids[i]
		res, err := f.store.Append(ctx, "idem", eventstore.Any, e)
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = res
		}
	}
	// A stream appended in one call of 64 events: its re-append is a call
	// that append_batch makes without looking IDs up first on a log never
	// archived (migration 0020), which this one no longer is.
	bulk, bulkFirst := f.bulk(t, "bulk")
	if _, err := f.store.Append(ctx, "tail", eventstore.Any, deposit(0)); err != nil {
		t.Fatal(err)
	}
	if p, err := f.archiver(t, archive.Config{}).RunOnce(ctx, 100); err != nil || p.Moved != int64(len(ids)+len(bulk)) {
		t.Fatalf("archive: %+v %v", p, err)
	}
	bulkAgain, err := f.store.Append(ctx, "bulk", eventstore.Any, bulk...)
	if err != nil {
		t.Fatalf("re-append of 64 archived events: %v", err)
	}
	if got, want := bulkAgain.Events[0].GlobalSequence, bulkFirst.Events[0].GlobalSequence; got != want || bulkAgain.StreamVersion != 64 {
		t.Fatalf("re-append of 64 archived events: first at position %d, stream version %d; want %d and 64", got, bulkAgain.StreamVersion, want)
	}
	if n := f.count(t, `SELECT count(*) FROM annals.events_all WHERE stream_id = 'bulk'`); n != int64(len(bulk)) {
		t.Fatalf("%d rows of the stream appended in one call, want %d", n, len(bulk))
	}
	again := deposit(0)
	again.ID = ids[0]
	// Store.Append (group commit: append_batch).
	res, err := f.store.Append(ctx, "idem", eventstore.Any, again)
	if err != nil || res.Events[0].GlobalSequence != first.Events[0].GlobalSequence || res.StreamVersion != 1 {
		t.Fatalf("re-append of an archived event: %+v %v, want position %d", res, err, first.Events[0].GlobalSequence)
	}
	// Inside a transaction (append_events).
	err = pgx.BeginFunc(ctx, f.db.Pool, func(tx pgx.Tx) error {
		res, err = f.store.AppendTx(ctx, tx, "idem", eventstore.Any, again)
		return err
	})
	if err != nil || res.Events[0].GlobalSequence != first.Events[0].GlobalSequence {
		t.Fatalf("re-append of an archived event in a transaction: %+v %v", res, err)
	}
	// Different data, or another stream, with an archived ID.
	other := deposit(99)
	other.ID = ids[1]
	if _, err := f.store.Append(ctx, "idem", eventstore.Any, other); !errors.Is(err, eventstore.ErrEventIDConflict) {
		t.Fatalf("other data with an archived ID: %v, want ErrEventIDConflict", err)
	}
	elsewhere := deposit(1)
	elsewhere.ID = ids[1]
	err = pgx.BeginFunc(ctx, f.db.Pool, func(tx pgx.Tx) error {
		_, err := f.store.AppendTx(ctx, tx, "elsewhere", eventstore.Any, elsewhere)
		return err
	})
	if !errors.Is(err, eventstore.ErrEventIDConflict) {
		t.Fatalf("another stream with an archived ID in a transaction: %v, want ErrEventIDConflict", err)
	}
	// Half archived, half new: refused like a partly stored hot append.
	mixed := []eventstore.EventData{deposit(2), deposit(100)}
	mixed[0].ID = ids[2]
	if _, err := f.store.Append(ctx, "idem", eventstore.Any, mixed...); !errors.Is(err, eventstore.ErrEventIDConflict) {
		t.Fatalf("an append partly archived: %v, want ErrEventIDConflict", err)
	}
	if n := f.count(t, `SELECT count(*) FROM annals.events_all WHERE event_id = ANY($1)`, ids); n != int64(len(ids)) {
		t.Fatalf("%d rows with the IDs, want %d", n, len(ids))
	}
	if n := f.count(t, `SELECT count(*) FROM annals.events WHERE stream_id IN ('idem', 'elsewhere')`); n != 0 {
		t.Fatalf("%d hot events of the archived stream, want 0", n)
	}

	// A REPEATABLE READ transaction whose snapshot predates an archive step
	// cannot see what the step moved: its append with IDs is refused as a
	// serialization failure (to be retried) rather than storing an event
	// twice.
	id := uuid.New()
	tx, err := f.db.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT 1`); err != nil { // takes the snapshot
		t.Fatal(err)
	}
	e := deposit(7)
	e.ID = id
	if _, err := f.store.Append(ctx, "late", eventstore.Any, e); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.Append(ctx, "tail", eventstore.Any, deposit(0)); err != nil {
		t.Fatal(err)
	}
	if p, err := f.archiver(t, archive.Config{}).RunOnce(ctx, 1000); err != nil || p.Moved == 0 {
		t.Fatalf("archive: %+v %v", p, err)
	}
	var pgErr *pgconn.PgError
	_, err = tx.Exec(ctx, `SELECT * FROM annals.append_events('late', NULL, $1)`,
		fmt.Sprintf(`[{"type": "acct.deposited", "data": {"amount": 7}, "event_id": %q}]`, id))
	if !errors.As(err, &pgErr) || pgErr.Code != "40001" {
		t.Fatalf("append in a snapshot older than the archive step: %v, want serialization_failure", err)
	}
	if n := f.count(t, `SELECT count(*) FROM annals.events_all WHERE event_id = $1`, id); n != 1 {
		t.Fatalf("%d rows of event %s, want 1", n, id)
	}
}

// TestArchiveStepDuringALargeAppend: a call of 64 events with caller-chosen
// IDs on a log never archived does not look the IDs up before the lock
// (migration 0020). An archive step that moves those IDs while the call waits
// for the append lock must make it look them up after all, under the lock:
// the re-append answers the stored positions and stores nothing twice.
func TestArchiveStepDuringALargeAppend(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	bulk, first := f.bulk(t, "bulk")
	tail, err := f.store.Append(ctx, "tail", eventstore.Any, deposit(0)) // the newest event stays hot
	if err != nil {
		t.Fatal(err)
	}

	tx, err := f.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	k1, k2 := schemaname.AppendLockKey("annals")
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, $2)`, k1, k2); err != nil {
		t.Fatal(err)
	}
	type outcome struct {
		res eventstore.AppendResult
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := f.store.Append(ctx, "bulk", eventstore.Any, bulk...)
		done <- outcome{res, err}
	}()
	// The re-append waits for the append lock.
	annalstest.WaitFor(t, 20*time.Second, func() bool {
		return f.count(t, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
		                     AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`) > 0
	})
	var moved int64
	if err := tx.QueryRow(ctx, `SELECT moved FROM annals.archive('test', $1, 1000)`, tail.Events[0].GlobalSequence).Scan(&moved); err != nil {
		t.Fatal(err)
	}
	if moved != int64(len(bulk)) {
		t.Fatalf("the archive step moved %d events, want %d", moved, len(bulk))
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	o := <-done
	if o.err != nil {
		t.Fatalf("re-append while its events were archived: %v", o.err)
	}
	if got, want := o.res.Events[0].GlobalSequence, first.Events[0].GlobalSequence; got != want || o.res.StreamVersion != 64 {
		t.Fatalf("re-append while its events were archived: first at position %d, stream version %d; want %d and 64",
			got, o.res.StreamVersion, want)
	}
	if n := f.count(t, `SELECT count(*) FROM annals.events_all WHERE stream_id = 'bulk'`); n != int64(len(bulk)) {
		t.Fatalf("%d rows of the stream, want %d", n, len(bulk))
	}
}

// TestConcurrentWritersAndTail: writers append and a subscriber tails the
// log while archive runs move it: nothing is lost, and the subscriber sees
// every event once, in order (the balances projection refuses anything
// else).
func TestConcurrentWritersAndTail(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	f := newFixture(t)
	f.fill(t, 4, 300)
	createBalances(t, f.db, "tail")
	runner := newRunner(t, f, balances{"tail", "tail"})
	rctx, stopRunner := context.WithCancel(ctx)
	runDone := make(chan error, 1)
	go func() { runDone <- runner.Run(rctx) }()

	a := f.archiver(t, archive.Config{BatchSize: 40})
	wctx, stopWriters := context.WithTimeout(ctx, 3*time.Second)
	defer stopWriters()
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	appended := make([]int, 4)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; wctx.Err() == nil; i++ {
				evs := []eventstore.EventData{deposit(i)}
				if i%3 == 0 {
					evs = append(evs, deposit(i+1))
					evs[0].ID = uuid.New() // caller-chosen IDs: the look-up path
				}
				if _, err := f.store.Append(ctx, fmt.Sprintf("w-%d", w), eventstore.Any, evs...); err != nil {
					errs <- err
					return
				}
				appended[w] += len(evs)
			}
		}()
	}
	runs := 0
	wg.Add(1)
	go func() {
		defer wg.Done()
		for wctx.Err() == nil {
			head, err := f.store.Head(ctx)
			if err != nil {
				errs <- err
				return
			}
			if _, err := a.RunOnce(ctx, head); err != nil {
				errs <- err
				return
			}
			runs++
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	total := 300
	for _, n := range appended {
		total += n
	}
	if got := f.count(t, `SELECT count(*) FROM annals.events_all`); got != int64(total) {
		t.Fatalf("%d events stored, %d appended", got, total)
	}
	if arch := f.count(t, `SELECT count(*) FROM annals.events_archive`); runs < 2 || arch < 300 {
		t.Fatalf("%d runs archived %d events: the test did not exercise the archive", runs, arch)
	}
	head, err := f.store.Head(ctx)
	if err != nil {
		t.Fatal(err)
	}
	annalstest.WaitForErr(t, 30*time.Second, func() error {
		if cp := f.count(t, `SELECT coalesce((SELECT position FROM annals.checkpoints WHERE subscriber_id = 'tail'), 0)`); cp != head {
			var last string
			_ = f.db.Pool.QueryRow(ctx, `SELECT coalesce((SELECT error FROM annals.failures ORDER BY id DESC LIMIT 1), '')`).Scan(&last)
			return errors.Newf("checkpoint %d, head %d; last failure: %s", cp, head, last)
		}
		return nil
	})
	stopRunner()
	if err := <-runDone; err != nil {
		t.Fatal(err)
	}
	if n := f.count(t, `SELECT count(*) FROM annals.events_all e FULL JOIN tail_applied a USING (global_sequence)
		WHERE e.event_id IS DISTINCT FROM a.event_id`); n != 0 {
		t.Fatalf("%d events differ between the log and what the subscriber applied", n)
	}
	if n := f.count(t, `SELECT count(*) FROM (SELECT global_sequence < lag(global_sequence) OVER (ORDER BY n) AS back FROM tail_applied) x WHERE back`); n != 0 {
		t.Fatalf("the subscriber applied %d events out of position order", n)
	}
	if n := f.count(t, `SELECT count(*) FROM annals.dead_letters`); n != 0 {
		t.Fatalf("%d dead letters", n)
	}
}

// TestLeaderAndResume: one archiver at a time; a stopped run is resumed by
// the next; a run killed with SIGKILL is resumed and stays recorded.
func TestLeaderAndResume(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("Busy", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		f.fill(t, 3, 200)
		want := f.readAll(t)
		stepped := make(chan struct{}, 1000)
		a := f.archiver(t, archive.Config{BatchSize: 1, Pause: 20 * time.Millisecond, InstanceID: "a",
			OnProgress: func(archive.Progress) { stepped <- struct{}{} }})
		b := f.archiver(t, archive.Config{BatchSize: 1000, InstanceID: "b"})
		actx, stop := context.WithCancel(ctx)
		var pa archive.Progress
		var errA error
		done := make(chan struct{})
		go func() {
			defer close(done)
			pa, errA = a.RunOnce(actx, 150)
		}()
		<-stepped
		<-stepped
		if _, err := b.RunOnce(ctx, 150); !errors.Is(err, archive.ErrBusy) {
			t.Fatalf("second archiver: %v, want ErrBusy", err)
		}
		stop()
		<-done
		if !errors.Is(errA, context.Canceled) || pa.Done || pa.Steps < 2 {
			t.Fatalf("stopped run: %+v %v", pa, errA)
		}
		// A step interrupted by the cancel closed a's connection: its
		// session, and the archiver lock, end once the server notices
		// (RunOnce's doc), and until then b is told ErrBusy.
		var pb archive.Progress
		annalstest.WaitForErr(t, 10*time.Second, func() error {
			var err error
			if pb, err = b.RunOnce(ctx, 150); errors.Is(err, archive.ErrBusy) {
				return err
			} else if err != nil {
				t.Fatalf("resumed run: %v (stopped at %+v)", err, pa)
			}
			return nil
		})
		if pb.RunID != pa.RunID || !pb.Done || pb.Moved != 149 {
			t.Fatalf("resumed run %+v (stopped at %+v)", pb, pa)
		}
		if got := f.readAll(t); !slices.Equal(got, want) {
			t.Fatalf("log after a resumed run differs at %d", firstDiff(got, want))
		}
	})

	t.Run("SIGKILL", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		f.fill(t, 3, 400)
		want := f.readAll(t)
		child := startChild(t, f.db, childSpec{Instance: "doomed", Before: 390, Pause: 30 * time.Millisecond})
		steps := func() (n int64, open bool) {
			err := f.db.Pool.QueryRow(ctx, `SELECT coalesce(max(steps), 0), coalesce(bool_or(finished_at IS NULL), false) FROM annals.archive_runs`).Scan(&n, &open)
			if err != nil {
				t.Fatal(err)
			}
			return n, open
		}
		annalstest.WaitFor(t, 30*time.Second, func() bool { n, _ := steps(); return n >= 5 })
		child.Kill()
		killedAt, open := steps()
		if !open {
			t.Fatalf("the run finished before the kill (%d steps)", killedAt)
		}
		// Every committed step moved its whole batch, and only it.
		if arch := f.count(t, `SELECT count(*) FROM annals.events_archive`); arch != f.count(t, `SELECT archived_to FROM annals.archive_runs`) {
			t.Fatalf("%d archived events after the kill, run says otherwise", arch)
		}
		a := f.archiver(t, archive.Config{BatchSize: 50, InstanceID: "survivor"})
		var p archive.Progress
		annalstest.WaitForErr(t, 30*time.Second, func() error {
			var err error
			p, err = a.RunOnce(ctx, 390)
			return err
		})
		if !p.Done || p.Moved != 389 || int64(p.Steps) <= killedAt {
			t.Fatalf("resumed run %+v, want done with 389 moved after step %d", p, killedAt)
		}
		runs, err := a.Runs(ctx, 10)
		var user string
		if err := f.db.Pool.QueryRow(ctx, `SELECT session_user`).Scan(&user); err != nil {
			t.Fatal(err)
		}
		if err != nil || len(runs) != 1 || runs[0].Instance != "doomed" || runs[0].StartedBy != user || runs[0].FinishedAt == nil ||
			runs[0].Before != 390 || time.Since(runs[0].StartedAt) > time.Minute {
			t.Fatalf("runs %+v %v: want the one run the child started, finished", runs, err)
		}
		if got := f.readAll(t); !slices.Equal(got, want) {
			t.Fatalf("log after a killed and resumed run differs at %d", firstDiff(got, want))
		}
	})
}

// TestArchiveIsGuarded: nobody writes events_archive directly, not even
// the owner; scavenging removes archived rows of a hard-deleted stream.
func TestArchiveIsGuarded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("WrittenOnlyByTheFunctions", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		f.fill(t, 2, 20)
		if _, err := f.archiver(t, archive.Config{}).RunOnce(ctx, 10); err != nil {
			t.Fatal(err)
		}
		for _, sql := range []string{
			`DELETE FROM annals.events_archive`,
			`UPDATE annals.events_archive SET data = '{}'`,
			`TRUNCATE annals.events_archive`,
			`INSERT INTO annals.events_archive SELECT * FROM annals.events WHERE global_sequence = 15`,
			`DELETE FROM annals.events WHERE global_sequence = 15`,
		} {
			var pgErr *pgconn.PgError
			if _, err := f.db.Pool.Exec(ctx, sql); !errors.As(err, &pgErr) || pgErr.Code != eventstore.CodeAppendOnly {
				t.Errorf("%s: %v, want %s", sql, err, eventstore.CodeAppendOnly)
			}
		}
		// Not even in the transaction of an archive step, once it returned.
		err := pgx.BeginFunc(ctx, f.db.Pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SELECT * FROM annals.archive('x', 15, 1)`); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `DELETE FROM annals.events WHERE global_sequence = 18`)
			return err
		})
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != eventstore.CodeAppendOnly {
			t.Fatalf("DELETE after an archive step in its transaction: %v", err)
		}
	})

	t.Run("ScavengeReachesTheArchive", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		for i := range 30 {
			for _, s := range []string{"doomed", "kept"} {
				if _, err := f.store.Append(ctx, s, eventstore.Any, deposit(i)); err != nil {
					t.Fatal(err)
				}
			}
		}
		if _, err := f.store.DeleteStream(ctx, "doomed", eventstore.Any, &eventstore.DeleteOptions{Hard: true}); err != nil {
			t.Fatal(err)
		}
		if _, err := f.store.Append(ctx, "kept", eventstore.Any, deposit(0)); err != nil {
			t.Fatal(err)
		}
		if p, err := f.archiver(t, archive.Config{}).RunOnce(ctx, 40); err != nil || p.Moved != 39 {
			t.Fatalf("archive: %+v %v", p, err)
		}
		s, err := scavenge.New(f.db.Pool, &scavenge.Config{BatchSize: 7, Pause: -1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		p, err := s.RunOnce(ctx)
		if err != nil || p.Removed != 31 || p.From != 0 {
			t.Fatalf("scavenge: %+v %v, want the 31 events of doomed removed from position 1 on", p, err)
		}
		if n := f.count(t, `SELECT count(*) FROM annals.events_all WHERE stream_id = 'doomed'`); n != 0 {
			t.Fatalf("%d events of the hard-deleted stream left", n)
		}
		if a, h := f.count(t, `SELECT count(*) FROM annals.events_archive WHERE stream_id = 'kept'`),
			f.count(t, `SELECT count(*) FROM annals.events WHERE stream_id = 'kept'`); a == 0 || a+h != 31 {
			t.Fatalf("kept: %d archived + %d hot events, want 31 with some archived", a, h)
		}
		if got := len(f.readStream(t, "kept", 1)); got != 31 {
			t.Fatalf("kept reads %d events, want 31", got)
		}
	})
}
