package scheduler

import (
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/errmark"
)

// syncBuffer is a log destination shared by a logger and the test, with
// lines.
type syncBuffer struct{ annalstest.LogBuffer }

// lines returns the logged lines that contain substr.
func (b *syncBuffer) lines(substr string) []string {
	var out []string
	for _, l := range strings.Split(b.String(), "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return out
}

// A panic in one task's Event func is that task's failed attempt: the pass
// goes on to the other tasks, and the panicking task is retried after
// RetryBackoff like a task whose Event returned an error.
func TestCronEventPanicIsTheTasksError(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	clock := newFakeClock(t0)
	var logs syncBuffer
	s := newScheduler(t, db, &Config{Clock: clock, RetryBackoff: 5 * time.Second,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	var calls atomic.Int64
	if err := s.AddTask(t.Context(), Task{Name: "a-panics", Spec: "*/10 * * * * *", StreamID: "cron-a",
		Event: func(time.Time) (eventstore.EventData, error) {
			calls.Add(1)
			panic("report generator bug")
		}}); err != nil {
		t.Fatal(err)
	}
	if err := s.AddTask(t.Context(), Task{Name: "b-fine", Spec: "*/10 * * * * *", StreamID: "cron-b"}); err != nil {
		t.Fatal(err)
	}
	clock.Advance(10 * time.Second)
	func() {
		defer func() {
			if r := recover(); r != nil {
				t.Fatalf("FireDue panicked: %v", r)
			}
		}()
		if n := fireDue(t, s); n != 1 {
			t.Errorf("fired %d, want 1 (b-fine)", n)
		}
	}()
	if got := ticks(t, db, "cron-b"); len(got) != 1 || !got[0].Equal(t0.Add(10*time.Second)) {
		t.Errorf("b-fine fired %v, want its tick at +10 s", got)
	}
	if n := eventsIn(t, db, "cron-a"); n != 0 {
		t.Errorf("a-panics appended %d events", n)
	}
	failed := logs.lines("cron tick failed")
	if len(failed) != 1 || !strings.Contains(failed[0], `a-panics`) || !strings.Contains(failed[0], "report generator bug") {
		t.Errorf("logged %q; want one line naming the task and the panic value", failed)
	}
	if strings.Contains(logs.String(), "stack trace") || strings.Contains(logs.String(), "goroutine ") {
		t.Errorf("the log carries a stack:\n%s", logs.String())
	}
	// Retried after RetryBackoff, not before: as an erroring Event is.
	clock.Advance(4 * time.Second)
	fireDue(t, s)
	if n := calls.Load(); n != 1 {
		t.Errorf("Event called %d times before RetryBackoff passed, want 1", n)
	}
	clock.Advance(time.Second)
	fireDue(t, s)
	if n := calls.Load(); n != 2 {
		t.Errorf("Event called %d times once RetryBackoff passed, want 2", n)
	}
}

// The dispatcher's failure logs carry the error's message on one line
// (telemetry.Err), not the error chain with its stack traces.
func TestFailureLogsAreOneLine(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	clock := newFakeClock(t0)
	var logs syncBuffer
	s := newScheduler(t, db, &Config{Clock: clock, MaxAttempts: 2, RetryBackoff: time.Second,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	ctx := t.Context()
	// A timer whose append fails (a wrong expected version): retried, then
	// kept as failed.
	if _, err := s.ScheduleTimer(ctx, nil, Timer{At: t0, StreamID: "x", Expected: eventstore.Exact(5),
		Events: []eventstore.EventData{ev("x", map[string]int{})}}); err != nil {
		t.Fatal(err)
	}
	// A task whose Event fails, and one whose stored spec no longer parses.
	if err := s.AddTask(ctx, Task{Name: "failing", Spec: "* * * * * *", StreamID: "f",
		Event: func(time.Time) (eventstore.EventData, error) {
			return eventstore.EventData{}, errors.New("report service down")
		}}); err != nil {
		t.Fatal(err)
	}
	if err := s.AddTask(ctx, Task{Name: "garbled", Spec: "* * * * * *", StreamID: "g"}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `UPDATE annals.cron_tasks SET spec = 'not a spec' WHERE name = 'garbled'`); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Second)
	fireDue(t, s)
	clock.Advance(time.Second)
	fireDue(t, s)
	for _, msg := range []string{"timer failed; retrying later", "timer failed; it is kept", "cron tick failed", "does not parse"} {
		lines := logs.lines(msg)
		if len(lines) == 0 {
			t.Errorf("nothing logged with %q:\n%s", msg, logs.String())
			continue
		}
		for _, l := range lines {
			if strings.Contains(l, "stack trace") || strings.Contains(l, `\n`) || len(l) > 600 {
				t.Errorf("%q logged %d bytes over more than one line:\n%s", msg, len(l), l)
			}
		}
	}
}

// A task whose every attempt fails (its event is invalid: no retry can fix
// it) is retried after RetryBackoff, doubling up to MaxRetryBackoff: over N
// seconds it is tried and logged about log2(N) times (plus N over the cap),
// not N times. A task that fails for a while and recovers fires its ticks
// as usual from then on, and its next failure is retried after
// RetryBackoff again.
func TestCronFailingTaskBacksOff(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	clock := newFakeClock(t0)
	var logs syncBuffer
	s := newScheduler(t, db, &Config{Clock: clock, RetryBackoff: time.Second, MaxRetryBackoff: 64 * time.Second,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	ctx := t.Context()
	var brokenCalls, flakyCalls []int // seconds after t0 of each attempt
	if err := s.AddTask(ctx, Task{Name: "broken", Spec: "* * * * * *", StreamID: "broken",
		Event: func(tick time.Time) (eventstore.EventData, error) {
			brokenCalls = append(brokenCalls, int(tick.Sub(t0)/time.Second))
			return eventstore.EventData{Type: ""}, nil // invalid: eventstore.ErrInvalidEvent
		}}); err != nil {
		t.Fatal(err)
	}
	if err := s.AddTask(ctx, Task{Name: "flaky", Spec: "* * * * * *", StreamID: "flaky",
		Event: func(tick time.Time) (eventstore.EventData, error) {
			sec := int(tick.Sub(t0) / time.Second)
			flakyCalls = append(flakyCalls, sec)
			if sec < 20 || sec == 100 {
				return eventstore.EventData{}, errors.New("report service down")
			}
			return eventstore.EventData{Type: TickEventType, Data: TickData{Task: "flaky", Tick: tick.UTC()}}, nil
		}}); err != nil {
		t.Fatal(err)
	}
	const seconds = 300
	for range seconds {
		clock.Advance(time.Second)
		fireDue(t, s)
	}
	// Gaps 1, 2, 4, …, 64, then 64 (the cap): 10 attempts in 300 s.
	if want := []int{1, 2, 4, 8, 16, 32, 64, 128, 192, 256}; !slices.Equal(brokenCalls, want) {
		t.Errorf("the broken task was tried at %v s (%d times in %d s), want %v", brokenCalls, len(brokenCalls), seconds, want)
	}
	if n := len(logs.lines("task=broken")); n != len(brokenCalls) {
		t.Errorf("the broken task logged %d lines for %d attempts", n, len(brokenCalls))
	}
	if n := eventsIn(t, db, "broken"); n != 0 {
		t.Errorf("the broken task appended %d events", n)
	}
	// flaky failed at 1, 2, 4, 8 and 16 s, recovered by 32 s (its first
	// try after 20 s), fired every second since, failed at 100 s and was
	// retried a second later.
	if want := []int{1, 2, 4, 8, 16}; !slices.Equal(flakyCalls[:min(5, len(flakyCalls))], want) {
		t.Errorf("flaky was tried at %v, want %v first", flakyCalls, want)
	}
	var want []time.Time
	for sec := 32; sec <= seconds; sec++ {
		if sec != 100 {
			want = append(want, t0.Add(time.Duration(sec)*time.Second))
		}
	}
	if got := ticks(t, db, "flaky"); !equalTimes(got, want) {
		t.Errorf("flaky fired %d ticks (%v … ), want %d: every second from 32 s on but 100 s", len(got), got[:min(3, len(got))], len(want))
	}
}

// A task whose ticks fail because of the database, not the task (here its
// transaction's connection is terminated, as in an outage), is retried
// after a flat RetryBackoff, and fires at the first try once the database
// is back: its back-off did not grow during the outage (with doubling it
// would have waited 16 s at the end of a 20 s outage, and up to
// MaxRetryBackoff after a longer one, missing ticks older than
// MissedGrace). A failure of its own afterwards still backs off from
// RetryBackoff, doubling.
func TestCronDatabaseFailureDoesNotBackOff(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	clock := newFakeClock(t0)
	var logs syncBuffer
	s := newScheduler(t, db, &Config{Clock: clock, RetryBackoff: time.Second, MaxRetryBackoff: 64 * time.Second,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	ctx := t.Context()
	const outage, broken = 20, 40 // the database fails ticks 1–20; the task's Event fails ticks 40–59
	var calls []int               // seconds after t0 of each attempt
	var killErr error
	// The outage: the tick's transaction, once it holds the task's row,
	// loses its connection.
	s.afterClaim = func(tx pgx.Tx) {
		if int(clock.Now().Sub(t0)/time.Second) > outage {
			return
		}
		var ok bool
		err := db.Pool.QueryRow(ctx, `SELECT pg_terminate_backend($1, 5000)`, int32(tx.Conn().PgConn().PID())).Scan(&ok)
		if err == nil && !ok {
			err = errors.New("pg_terminate_backend returned false")
		}
		if err != nil && killErr == nil {
			killErr = err
		}
	}
	if err := s.AddTask(ctx, Task{Name: "outage", Spec: "* * * * * *", StreamID: "outage",
		Event: func(tick time.Time) (eventstore.EventData, error) {
			sec := int(tick.Sub(t0) / time.Second)
			calls = append(calls, sec)
			if sec >= broken && sec < broken+20 {
				return eventstore.EventData{}, errors.New("report service down")
			}
			return eventstore.EventData{Type: TickEventType, Data: TickData{Task: "outage", Tick: tick.UTC()}}, nil
		}}); err != nil {
		t.Fatal(err)
	}
	const seconds = 80
	for range seconds {
		clock.Advance(time.Second)
		fireDue(t, s)
	}
	if killErr != nil {
		t.Fatalf("terminating the tick's connection: %v", killErr)
	}
	// Tried every second through the outage, fired at once after it.
	var want []int
	for sec := 1; sec <= outage; sec++ {
		want = append(want, sec)
	}
	if got := calls[:min(len(calls), outage)]; !slices.Equal(got, want) {
		t.Errorf("during the outage the task was tried at %v s, want every second %v", calls, want)
	}
	if n := len(logs.lines("cron tick failed")); n < outage {
		t.Errorf("logged %d failed ticks, want at least the %d of the outage:\n%s", n, outage, logs.String())
	}
	if l := logs.lines("cron tick failed"); len(l) > 0 && !strings.Contains(l[0], "SQLSTATE 57P01") && !strings.Contains(l[0], "conn") {
		t.Errorf("the first failure %q is not the lost connection", l[0])
	}
	var fired []time.Time
	for sec := outage + 1; sec < broken; sec++ {
		fired = append(fired, t0.Add(time.Duration(sec)*time.Second))
	}
	// Then its own failures from 40 s back off (40, 41, 43, 47, 55 fail;
	// 71 fires the latest tick), and it fires every second again.
	for sec := 71; sec <= seconds; sec++ {
		fired = append(fired, t0.Add(time.Duration(sec)*time.Second))
	}
	if got := ticks(t, db, "outage"); !equalTimes(got, fired) {
		t.Errorf("fired %v, want %v", got, fired)
	}
	after := calls[min(len(calls), outage+(broken-outage-1)):] // the attempts from 40 s on
	if want := []int{40, 41, 43, 47, 55, 71}; !slices.Equal(after[:min(len(after), len(want))], want) {
		t.Errorf("after its own failure at 40 s the task was tried at %v, want %v first", after, want)
	}
}

// Which failed attempts are the task's own (its back-off doubles) and which
// the database's (retried after RetryBackoff).
func TestCronOwnFailure(t *testing.T) {
	pg := func(code string) error {
		return errors.Wrap(&pgconn.PgError{Code: code, Message: "m"}, "scheduler: append tick")
	}
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"EventFunc", errmark.Mark(errors.New("Event func panicked: boom"), errTaskFault), true},
		{"InvalidEvent", errors.Wrap(eventstore.ErrInvalidEvent, "empty type"), true},
		{"AN002", pg(eventstore.CodeInvalidEvent), true},
		{"UnknownType", errors.Wrap(eventstore.ErrUnknownEventType, "x"), true},
		{"EventIDConflict", pg(eventstore.CodeEventIDConflict), true},
		{"StreamTombstoned", pg(eventstore.CodeStreamTombstoned), true},
		{"AdminShutdown", pg("57P01"), false},
		{"ConnectionFailure", pg("08006"), false},
		{"SerializationFailure", pg("40001"), false},
		{"LockTimeout", pg("55P03"), false},
		{"StatementTimeout", pg("57014"), false},
		{"ReadOnly", pg("25006"), false},
		{"Closed", errors.New("conn closed"), false},
	} {
		if got := ownFailure(c.err); got != c.want {
			t.Errorf("%s: ownFailure(%v) = %v, want %v", c.name, c.err, got, c.want)
		}
	}
}

// A stored task whose spec no longer parses (here `@every 500ms`, which
// AddTask accepted before whole seconds were required) logs one ERROR per
// definition, not one per dispatcher pass, and fires nothing. Another bad
// definition logs once again; a valid one fires, and the same bad
// definition stored again afterwards logs again.
func TestCronUnparsableStoredSpecLogsOnce(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	clock := newFakeClock(t0)
	var logs syncBuffer
	s := newScheduler(t, db, &Config{Clock: clock, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	ctx := t.Context()
	if err := s.AddTask(ctx, Task{Name: "old", Spec: "@every 1s", StreamID: "old"}); err != nil {
		t.Fatal(err)
	}
	store := func(spec string) {
		t.Helper()
		if _, err := db.Pool.Exec(ctx, `UPDATE annals.cron_tasks SET spec = $1 WHERE name = 'old'`, spec); err != nil {
			t.Fatal(err)
		}
	}
	passes := func(n int) {
		t.Helper()
		for range n {
			clock.Advance(time.Second)
			fireDue(t, s)
		}
	}
	errorLines := func() int { return len(logs.lines("level=ERROR")) }

	store("@every 500ms")
	passes(20)
	if got := logs.lines("level=ERROR"); len(got) != 1 || !strings.Contains(got[0], "task=old") ||
		!strings.Contains(got[0], `spec="@every 500ms"`) || !strings.Contains(got[0], "annals schedule list") {
		t.Fatalf("20 passes logged %d ERROR lines, want 1 naming the task, its spec and how to find it:\n%s", len(got), strings.Join(got, "\n"))
	}
	if n := eventsIn(t, db, "old"); n != 0 {
		t.Fatalf("the unparsable task appended %d events", n)
	}
	store("@every 250ms")
	passes(5)
	if n := errorLines(); n != 2 {
		t.Fatalf("%d ERROR lines after another bad definition, want 2", n)
	}
	store("@every 1s")
	passes(3)
	if n := eventsIn(t, db, "old"); n == 0 {
		t.Fatal("the task fired nothing once its spec parsed")
	}
	store("@every 500ms")
	passes(5)
	if n := errorLines(); n != 3 {
		t.Fatalf("%d ERROR lines after the bad definition came back, want 3", n)
	}
}
