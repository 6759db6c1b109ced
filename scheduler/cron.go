package scheduler

import (
	"context"
	"strings"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/robfig/cron/v3"

	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/errmark"
	"github.com/annals-dev/annals/internal/pgtx"
	"github.com/annals-dev/annals/internal/recovered"
	"github.com/annals-dev/annals/internal/telemetry"
)

// MissedPolicy says what a cron task does about ticks that no dispatcher
// fired in time (every instance was down or paused longer than
// Config.MissedGrace).
type MissedPolicy int

const (
	// FireLatest fires once, for the latest missed tick, and goes on from
	// there. The default.
	FireLatest MissedPolicy = iota
	// SkipMissed fires none of the missed ticks and waits for the next one.
	SkipMissed
)

// String returns the policy's name as stored: "fire_latest" or "skip_missed".
func (p MissedPolicy) String() string {
	switch p {
	case FireLatest:
		return "fire_latest"
	case SkipMissed:
		return "skip_missed"
	}
	return "invalid"
}

func parsePolicy(s string) (MissedPolicy, error) {
	switch s {
	case "fire_latest":
		return FireLatest, nil
	case "skip_missed":
		return SkipMissed, nil
	}
	return 0, errors.Newf("scheduler: unknown missed-tick policy %q", s)
}

// TickEventType is the type of the event a task appends when its Task.Event
// is nil. Its data is a TickData object: {"task": NAME, "tick": RFC 3339 UTC}.
const TickEventType = "annals.cron.tick"

// TickData is the data of a TickEventType event.
type TickData struct {
	// Task is the task's name.
	Task string `json:"task"`
	// Tick is the scheduled time of the tick (not when it fired), in UTC.
	Tick time.Time `json:"tick"`
}

// tickNamespace is the UUIDv5 namespace of tick event IDs.
var tickNamespace = uuid.MustParse("6f1d4c3e-5a0b-4f6e-9c1a-2b7d8e9f0a11")

// TickEventID is the event ID a tick's event gets (unless Task.Event sets
// one): a UUIDv5 of the task name and the tick's instant, so a tick appended
// twice would be one event.
func TickEventID(task string, tick time.Time) uuid.UUID {
	return uuid.NewSHA1(tickNamespace, []byte(task+"\x00"+tick.UTC().Format(time.RFC3339Nano)))
}

// Task is a recurring append: at each tick of Spec (read in TimeZone), an
// event is appended to StreamID.
type Task struct {
	// Name identifies the task cluster-wide. Required.
	Name string
	// Spec is a cron expression: five fields (minute hour day-of-month month
	// day-of-week), or six with a leading seconds field, or a descriptor
	// (@yearly, @monthly, @weekly, @daily, @hourly, @every 1m30s: a whole
	// number of seconds, at least one). A
	// "CRON_TZ=Zone " prefix sets the zone (then TimeZone must be empty or
	// the same). Required.
	Spec string
	// TimeZone is the IANA zone the spec is read in, e.g. "Europe/Berlin".
	// Defaults to "UTC". "Local" is refused: every process must agree.
	TimeZone string
	// StreamID is the stream the tick events go to. Required.
	StreamID string
	// Event returns the event to append for a tick (the tick's scheduled
	// time, in TimeZone). Its ID defaults to TickEventID(Name, tick). An
	// error, or a panic (recovered: the error names the task and the panic
	// value), skips this attempt; it is retried after Config.RetryBackoff,
	// doubling with each consecutive failure up to Config.MaxRetryBackoff.
	// It runs outside the tick's transaction (it may be slow), and may run
	// for a tick that another dispatcher fires, or again after a failed
	// attempt: it should only build the event.
	// Defaults to a TickEventType event with TickData.
	Event func(tick time.Time) (eventstore.EventData, error)
	// Missed is the missed-tick policy. Defaults to FireLatest.
	Missed MissedPolicy
}

// TaskInfo describes a stored cron task.
type TaskInfo struct {
	// Name, Spec, TimeZone, StreamID and Missed are the task's definition.
	Name, Spec, TimeZone, StreamID string
	Missed                         MissedPolicy
	// Paused tasks fire nothing; ticks that fall while paused never fire.
	Paused bool
	// NextTick is the first tick after the last fired one (or after the
	// definition took effect). When it is in the past the task is overdue:
	// no running process has its Event registered, or it is being fired.
	// Zero for a paused task or a spec that parses no more.
	NextTick time.Time
	// LastTick is the last tick fired (or skipped as missed); nil if none.
	LastTick *time.Time
	// ActiveSince is when the current definition took effect (or the task
	// resumed); no earlier tick fires.
	ActiveSince time.Time
	// CreatedAt and UpdatedAt are the row's times (database clock).
	CreatedAt, UpdatedAt time.Time
	// Registered reports whether this process has the task's Event
	// factory, i.e. whether its dispatcher fires the task.
	Registered bool
}

var parser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// parseSpec parses spec in zone ("" means UTC) and returns the schedule and
// the zone name to store.
func parseSpec(spec, zone string) (cron.Schedule, string, error) {
	spec = strings.TrimSpace(spec)
	if spec == "" {
		return nil, "", errors.Wrap(ErrInvalidTask, "empty cron expression")
	}
	if strings.HasPrefix(spec, "TZ=") || strings.HasPrefix(spec, "CRON_TZ=") {
		eq := strings.IndexByte(spec, '=')
		end := strings.IndexAny(spec, " \t")
		if end < 0 {
			return nil, "", errors.Wrapf(ErrInvalidTask, "cron expression %q has a zone but no schedule", spec)
		}
		prefixZone := spec[eq+1 : end]
		if zone != "" && zone != prefixZone {
			return nil, "", errors.Wrapf(ErrInvalidTask, "cron expression %q names zone %q but TimeZone is %q", spec, prefixZone, zone)
		}
		zone = prefixZone
	}
	if zone == "" {
		zone = "UTC"
	}
	if zone == "Local" {
		return nil, "", errors.Wrap(ErrInvalidTask, `time zone "Local" differs between machines; name an IANA zone such as "Europe/Berlin" or "UTC"`)
	}
	loc, err := time.LoadLocation(zone)
	if err != nil {
		return nil, "", errors.Wrapf(ErrInvalidTask, "unknown time zone %q: %v", zone, err)
	}
	sched, err := parser.Parse(spec)
	if err != nil {
		return nil, "", errors.Wrapf(ErrInvalidTask, "cron expression %q: %v", spec, err)
	}
	if _, ok := sched.(cron.ConstantDelaySchedule); ok {
		if err := checkEvery(spec); err != nil {
			return nil, "", err
		}
	}
	if ss, ok := sched.(*cron.SpecSchedule); ok {
		if ss.Location == time.Local {
			ss.Location = loc
		}
		return zonedSpec{*ss}, zone, nil
	}
	return sched, zone, nil
}

// checkEvery refuses an "@every" spec (after any zone prefix) whose
// interval is not a whole number of seconds, at least one: robfig/cron
// fires such a spec every second (it rounds an interval under a second,
// zero and negative ones included, up to one) or on the whole second below
// it (1.5s fires every second), not as written.
func checkEvery(spec string) error {
	body := spec
	if strings.HasPrefix(body, "TZ=") || strings.HasPrefix(body, "CRON_TZ=") {
		body = strings.TrimSpace(body[strings.IndexByte(body, ' '):]) // as robfig/cron reads it
	}
	d, err := time.ParseDuration(strings.TrimPrefix(body, "@every "))
	switch {
	case err != nil:
		return errors.Wrapf(ErrInvalidTask, "cron expression %q: %v", spec, err)
	case d <= 0:
		return errors.Wrapf(ErrInvalidTask, "cron expression %q: the interval of @every must be positive", spec)
	case d < time.Second:
		return errors.Wrapf(ErrInvalidTask, "cron expression %q: the interval of @every must be at least 1s (ticks are whole seconds)", spec)
	case d%time.Second != 0:
		return errors.Wrapf(ErrInvalidTask, "cron expression %q: the interval of @every must be a whole number of seconds (ticks are whole seconds)", spec)
	}
	return nil
}

// zonedSpec is a cron spec read in its zone, one UTC offset at a time.
//
// robfig/cron's SpecSchedule.Next steps through the zone's wall time by
// adding hours to instants, which goes wrong where an offset changes by
// other than a whole hour: in Australia/Lord_Howe (+11 to +10:30 on
// 2026-04-05) "0 2 * * *" had no tick that day although 02:00 +10:30
// happens once. Next instead takes the zone's periods of one offset
// (time.Time.ZoneBounds) in turn and asks the spec, read at that fixed
// offset, for its first tick within the period. So a tick is every instant
// whose wall time in the zone matches the spec: a wall time that a change
// skips has none, one that a change repeats has two.
type zonedSpec struct{ spec cron.SpecSchedule }

// maxZonePeriods bounds the periods Next looks through: two changes a year
// over the five years the spec looks ahead, with room to spare.
const maxZonePeriods = 64

// Next returns the first tick after t (zero: none within about five years).
func (z zonedSpec) Next(t time.Time) time.Time {
	loc := z.spec.Location
	x, period := t, t // ticks after x, in the period of one offset that holds period
	for range maxZonePeriods {
		local := period.In(loc)
		name, offset := local.Zone()
		_, end := local.ZoneBounds()
		fixed := z.spec
		fixed.Location = time.FixedZone(name, offset)
		n := fixed.Next(x)
		if n.IsZero() {
			return n
		}
		if end.IsZero() || n.Before(end) {
			return n.In(loc)
		}
		x, period = end.Add(-time.Nanosecond), end // Next(x) starts at end
	}
	return time.Time{}
}

// firstAfter returns the first tick of sched after t (zero: none within
// five years).
func firstAfter(sched cron.Schedule, t time.Time) time.Time { return sched.Next(t) }

// maxWindow bounds the windows latestDue looks for a tick in: a cron
// spec's Next looks at most five years ahead (then it returns zero), so
// within a shorter window a zero Next means no tick in the window.
const maxWindow = 4 * 365 * 24 * time.Hour

// latestDue returns the latest tick of sched in (after, now]. For @every
// schedules the ticks are after + k·delay.
//
// For a cron spec it costs a number of calls of Next that grows with the
// logarithm of now - after, however many ticks lie between (a spec that
// ticks every second of half a year has millions). It looks backwards from
// now in adjoining windows, each twice as long as the one before (at most
// maxWindow), for the latest that holds a tick, then bisects that window:
// Next(x) ≤ now holds for every x before the latest tick T ≤ now and for
// no x at or after it (Next depends only on x's whole second, and ticks are
// whole seconds), so the bisection ends on x = T - 1 s, and Next(x) is T.
func latestDue(sched cron.Schedule, after, now time.Time) (time.Time, bool) {
	first := sched.Next(after)
	if first.IsZero() || first.After(now) {
		return time.Time{}, false
	}
	if cd, ok := sched.(cron.ConstantDelaySchedule); ok {
		k := now.Sub(first) / cd.Delay
		return first.Add(k * cd.Delay), true
	}
	// tickBy reports whether sched has a tick in (x, end], for windows
	// shorter than Next's reach.
	tickBy := func(x, end time.Time) bool {
		n := sched.Next(x)
		return !n.IsZero() && !n.After(end)
	}
	// The latest window (start, end] that holds a tick: none after end
	// (up to now) does. The first tick, after `after`, is in it at the
	// latest.
	end, size := now, time.Second
	start := now.Add(-size)
	for start.After(after) && !tickBy(start, end) {
		end = start
		size = min(2*size, maxWindow)
		start = end.Add(-size)
	}
	if !start.After(after) {
		start = after
	}
	// Bisect on whole seconds: tickBy(lo, end) holds, tickBy(hi, end) does
	// not (Next(end) is after end).
	lo, hi := start.Truncate(time.Second), end.Truncate(time.Second)
	for hi.Sub(lo) > time.Second {
		mid := lo.Add(hi.Sub(lo) / 2).Truncate(time.Second)
		if tickBy(mid, end) {
			lo = mid
		} else {
			hi = mid
		}
	}
	t := sched.Next(lo)
	// A Schedule whose Next is not monotonic (none of the parser's is known
	// to be) could end the bisection on an earlier tick: never return one
	// that has a successor due by now.
	for n := sched.Next(t); !n.IsZero() && !n.After(now) && n.After(t); n = sched.Next(t) {
		t = n
	}
	return t, true
}

// nextAfter returns the first tick of sched after now, on the grid that
// starts after `after` (which matters for @every).
func nextAfter(sched cron.Schedule, after, now time.Time) time.Time {
	if cd, ok := sched.(cron.ConstantDelaySchedule); ok {
		first := sched.Next(after)
		if first.After(now) {
			return first
		}
		return first.Add((now.Sub(first)/cd.Delay + 1) * cd.Delay)
	}
	if after.After(now) {
		return sched.Next(after)
	}
	return sched.Next(now)
}

// Check reports what AddTask would refuse in t without storing anything: an
// empty name or stream ID, an unknown missed-tick policy, a cron expression
// that does not parse or never fires (from now on), an unknown or "Local"
// time zone. Its error matches ErrInvalidTask. annals.AddTask calls it, so
// that a mistake shows when the task is added, not when the client starts.
func (t Task) Check() error {
	_, err := t.check(time.Now())
	return err
}

// check is Check at now; it returns the task's time zone.
func (t Task) check(now time.Time) (zone string, err error) {
	if t.Name == "" {
		return "", errors.Wrap(ErrInvalidTask, "task name is empty")
	}
	if t.StreamID == "" {
		return "", errors.Wrapf(ErrInvalidTask, "task %q has an empty stream ID", t.Name)
	}
	if t.Missed != FireLatest && t.Missed != SkipMissed {
		return "", errors.Wrapf(ErrInvalidTask, "task %q has an unknown missed-tick policy %d", t.Name, int(t.Missed))
	}
	sched, zone, err := parseSpec(t.Spec, t.TimeZone)
	if err != nil {
		return "", errors.Wrapf(err, "task %q", t.Name)
	}
	if sched.Next(now).IsZero() {
		return "", errors.Wrapf(ErrInvalidTask, "task %q: cron expression %q never fires", t.Name, t.Spec)
	}
	return zone, nil
}

// AddTask stores (or updates) the task's definition in cron_tasks and
// registers its Event factory in this process: a process's dispatcher fires
// only the tasks registered in it. Adding the same definition again (as
// every process does at start) changes nothing stored; a changed definition
// takes effect now (by the Clock), and no tick from before it fires. A new
// task never fires ticks from before its creation. A paused task stays
// paused. Processes adding one task at once (replicas starting together)
// all succeed, whatever the session's default_transaction_isolation.
func (s *Scheduler) AddTask(ctx context.Context, t Task) error {
	now := s.cfg.Clock.Now()
	zone, err := t.check(now)
	if err != nil {
		return err
	}
	factory := t.Event
	if factory == nil {
		name := t.Name
		factory = func(tick time.Time) (eventstore.EventData, error) {
			return eventstore.EventData{Type: TickEventType, Data: TickData{Task: name, Tick: tick.UTC()}}, nil
		}
	}
	// READ COMMITTED whatever the session's default: under REPEATABLE READ
	// or SERIALIZABLE the upsert of a task another process inserted after
	// its snapshot (replicas starting together) fails to serialize (40001)
	// instead of finding the row.
	err = pgx.BeginTxFunc(ctx, s.pool, pgtx.ReadCommitted, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, s.q.upsertTask, t.Name, strings.TrimSpace(t.Spec), zone, t.StreamID, t.Missed.String(), now)
		return err
	})
	if err != nil {
		return errors.Wrapf(err, "scheduler: store task %q", t.Name)
	}
	s.mu.Lock()
	s.factories[t.Name] = factory
	delete(s.retries, t.Name)
	delete(s.badSpecs, t.Name)
	s.mu.Unlock()
	s.signal()
	return nil
}

// PauseTask pauses the task cluster-wide: it fires nothing until
// ResumeTask. Pausing a paused task changes nothing.
func (s *Scheduler) PauseTask(ctx context.Context, name string) error {
	return s.taskCommand(ctx, "pause", s.q.pauseTask, name)
}

// ResumeTask resumes a paused task. Ticks that fell while it was paused
// never fire; the next one after now (by the Clock) does. Resuming a task
// that is not paused changes nothing.
func (s *Scheduler) ResumeTask(ctx context.Context, name string) error {
	return s.taskCommand(ctx, "resume", s.q.resumeTask, name, s.cfg.Clock.Now())
}

// DeleteTask deletes the task and its tick history cluster-wide and
// unregisters it in this process (other processes keep their factory but
// fire nothing for a task that is not stored).
func (s *Scheduler) DeleteTask(ctx context.Context, name string) error {
	if name == "" {
		return errors.Wrap(ErrInvalidTask, "task name is empty")
	}
	var n int
	if err := s.pool.QueryRow(ctx, s.q.deleteTask, name).Scan(&n); err != nil {
		return errors.Wrapf(err, "scheduler: delete task %q", name)
	}
	s.mu.Lock()
	delete(s.factories, name)
	delete(s.retries, name)
	delete(s.badSpecs, name)
	s.mu.Unlock()
	if n == 0 {
		return errors.Wrapf(ErrUnknownTask, "no cron task %q", name)
	}
	return nil
}

func (s *Scheduler) taskCommand(ctx context.Context, verb, sql, name string, args ...any) error {
	if name == "" {
		return errors.Wrap(ErrInvalidTask, "task name is empty")
	}
	var got string
	err := s.pool.QueryRow(ctx, sql, append([]any{name}, args...)...).Scan(&got)
	if errors.Is(err, pgx.ErrNoRows) {
		return errors.Wrapf(ErrUnknownTask, "no cron task %q", name)
	}
	if err != nil {
		return errors.Wrapf(err, "scheduler: %s task %q", verb, name)
	}
	s.signal()
	return nil
}

// taskRow is a cron_tasks row.
type taskRow struct {
	name, spec, zone, stream, missed string
	paused                           bool
	activeSince                      time.Time
	lastTick                         *time.Time
	createdAt, updatedAt             time.Time
	// firedBy is the task's newest tick in cron_ticks at or before the
	// dispatcher's now (nil: none), read with the row.
	firedBy *time.Time
}

func (r *taskRow) scanArgs() []any {
	return []any{&r.name, &r.spec, &r.zone, &r.stream, &r.missed, &r.paused, &r.activeSince, &r.lastTick, &r.createdAt, &r.updatedAt, &r.firedBy}
}

// futureTickTolerance is how far after a dispatcher's clock a task's last
// tick may lie before the dispatcher takes it for the work of one whose
// clock ran ahead (see anchor).
const futureTickTolerance = time.Minute

// anchor is the instant after which the task's ticks are due, for a
// dispatcher whose clock reads now.
//
// A last tick more than futureTickTolerance after now was recorded by a
// dispatcher whose clock had jumped forward: it fired the ticks up to its
// own time early. Taken as it is, it would keep every dispatcher with a
// right clock from firing the task until real time reached it (for as long
// as the clock was wrong, days perhaps). The anchor is then the task's
// newest tick fired at or before now (cron_ticks keeps it, however old:
// PruneTicks), so the task goes on by the right clock from there; ticks
// the early dispatcher fired are not appended again when their time comes
// (cron_ticks is unique per task and tick). With no such tick (none fired
// since the task became active), it is the grid point before the task's
// latest tick due by now, so that tick fires. A dispatcher whose clock is
// still ahead moves last_tick forward again when it fires; the ticks stay
// unique, and the task recovers when that clock is set right.
func (r *taskRow) anchor(sched cron.Schedule, now time.Time) time.Time {
	since := r.since(now)
	if r.lastTick == nil || !r.lastTick.After(since) {
		return since
	}
	if !r.lastTick.After(now.Add(futureTickTolerance)) {
		return *r.lastTick
	}
	if r.firedBy != nil && r.firedBy.After(since) {
		return *r.firedBy
	}
	t, due := latestDue(sched, since, now)
	if !due {
		return since
	}
	prev := t.Add(-time.Second) // sched.Next(t - 1 s) is t for a cron spec
	if cd, ok := sched.(cron.ConstantDelaySchedule); ok {
		prev = t.Add(-cd.Delay) // the previous point of the @every grid
	}
	if prev.Before(since) {
		return since
	}
	return prev
}

// since is the instant the task's current definition took effect, for a
// dispatcher whose clock reads now: active_since, unless a dispatcher whose
// clock ran ahead stored it (AddTask with a changed definition,
// ResumeTask) more than futureTickTolerance after now. Then no dispatcher
// with a right clock would fire the task until real time reached it; the
// row's updated_at, the database's time of that change (or of a later tick
// fired), stands in for it.
func (r *taskRow) since(now time.Time) time.Time {
	if r.activeSince.After(now.Add(futureTickTolerance)) && r.updatedAt.Before(r.activeSince) {
		return r.updatedAt
	}
	return r.activeSince
}

// futureTick reports whether the task's last tick is one anchor disregards.
func (r *taskRow) futureTick(now time.Time) bool {
	return r.activeSince.After(now.Add(futureTickTolerance)) ||
		(r.lastTick != nil && r.lastTick.After(r.since(now)) && r.lastTick.After(now.Add(futureTickTolerance)))
}

func (s *Scheduler) listTasks(ctx context.Context, now time.Time) ([]taskRow, error) {
	rows, err := s.pool.Query(ctx, s.q.listTasks, now)
	if err != nil {
		return nil, errors.Wrap(err, "scheduler: list tasks")
	}
	var out []taskRow
	var r taskRow
	_, err = pgx.ForEachRow(rows, r.scanArgs(), func() error {
		out = append(out, r)
		return nil
	})
	return out, errors.Wrap(err, "scheduler: list tasks")
}

// Tasks lists every stored cron task, by name.
func (s *Scheduler) Tasks(ctx context.Context) ([]TaskInfo, error) {
	now := s.cfg.Clock.Now()
	rows, err := s.listTasks(ctx, now)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]TaskInfo, 0, len(rows))
	for _, r := range rows {
		p, _ := parsePolicy(r.missed)
		info := TaskInfo{Name: r.name, Spec: r.spec, TimeZone: r.zone, StreamID: r.stream, Missed: p, Paused: r.paused,
			LastTick: r.lastTick, ActiveSince: r.activeSince, CreatedAt: r.createdAt, UpdatedAt: r.updatedAt}
		_, info.Registered = s.factories[r.name]
		if sched, _, err := parseSpec(r.spec, r.zone); err == nil && !r.paused {
			info.NextTick = firstAfter(sched, r.anchor(sched, now))
		}
		out = append(out, info)
	}
	return out, nil
}

// fireTasks fires the due tick of every task registered in this process.
// It returns the ticks fired, the earliest time a task needs a look again
// (zero: none), and whether a due task was held by another dispatcher.
func (s *Scheduler) fireTasks(ctx context.Context, now time.Time) (fired int, next time.Time, contended bool, err error) {
	s.mu.Lock()
	registered := len(s.factories)
	s.mu.Unlock()
	if registered == 0 {
		return 0, time.Time{}, false, nil
	}
	rows, err := s.listTasks(ctx, now)
	if err != nil {
		return 0, time.Time{}, false, err
	}
	earliest := func(t time.Time) {
		if !t.IsZero() && (next.IsZero() || t.Before(next)) {
			next = t
		}
	}
	for _, r := range rows {
		s.mu.Lock()
		factory, ok := s.factories[r.name]
		retry := s.retries[r.name]
		badSpec, badLogged := s.badSpecs[r.name]
		s.mu.Unlock()
		if !ok || r.paused {
			continue
		}
		sched, _, perr := parseSpec(r.spec, r.zone)
		if perr != nil {
			// Logged once per definition (per process), not at every
			// pass: nothing changes until someone stores a valid one.
			if def := r.spec + "\x00" + r.zone; !badLogged || badSpec != def {
				s.mu.Lock()
				s.badSpecs[r.name] = def
				s.mu.Unlock()
				s.cfg.Logger.ErrorContext(ctx, "annals: stored cron task does not parse; not firing it until its definition is fixed (AddTask with a valid spec, or DeleteTask; see 'annals schedule list'); logged once for this definition",
					"task", r.name, "spec", r.spec, "time_zone", r.zone, telemetry.Err(perr))
			}
			continue
		}
		if badLogged {
			s.mu.Lock()
			delete(s.badSpecs, r.name)
			s.mu.Unlock()
		}
		if now.Before(retry.at) {
			earliest(retry.at)
			continue
		}
		if r.futureTick(now) {
			s.cfg.Logger.WarnContext(ctx, "annals: cron task's last tick or activation is in the future (a dispatcher's clock ran ahead); firing it by this dispatcher's clock",
				"task", r.name, "last_tick", r.lastTick, "active_since", r.activeSince, "now", now)
		}
		if tick, due := latestDue(sched, r.anchor(sched, now), now); due {
			ok, held, ferr := s.fireTask(ctx, r, tick, factory, now)
			if ferr != nil {
				if ctx.Err() != nil {
					return fired, next, contended, ferr
				}
				// Back off from the task's own failures (an Event func that
				// panics, an invalid event): a task that keeps failing is
				// tried, and logs, ever less often, up to once per
				// MaxRetryBackoff. Any other failure (the connection, the
				// server) is retried after RetryBackoff: the task fires as
				// soon as the database is back.
				d := s.cfg.RetryBackoff
				if ownFailure(ferr) {
					retry.failures++
					d = s.backoff(retry.failures)
				}
				retry.at = now.Add(d)
				s.mu.Lock()
				s.retries[r.name] = retry
				s.mu.Unlock()
				s.cfg.Logger.ErrorContext(ctx, "annals: cron tick failed; retrying later",
					"task", r.name, "failures", retry.failures, "retry_in", d, telemetry.Err(ferr))
				earliest(retry.at)
				continue
			}
			if !held && (retry.failures > 0 || !retry.at.IsZero()) {
				s.mu.Lock()
				delete(s.retries, r.name)
				s.mu.Unlock()
			}
			if ok {
				fired++
			}
			if held {
				contended = true
				continue
			}
			// Fired or skipped: the task's anchor is now its latest due tick.
			earliest(nextAfter(sched, r.anchor(sched, now), now))
			continue
		}
		earliest(nextAfter(sched, r.anchor(sched, now), now))
	}
	return fired, next, contended, nil
}

// fireTask fires (or, under SkipMissed, skips) the latest due tick of the
// task, tick as computed from r, the task's row read without a lock.
//
// The task's Event func runs first, outside any transaction: it is the
// user's code and may take its time, which inside the claim would count as
// idle in transaction, and past ClaimTimeout the server would end the
// session (the task then never fired, and every attempt cost a
// connection). Then one transaction (eventstore.Store.Transact): lock the
// task row (skipping it if another dispatcher holds it), re-read it and
// recompute the due tick, record the tick (unique per task and tick) and
// advance last_tick; then the tick's append and the COMMIT go in one round
// trip, so the log's ordering lock is held only for their server-side
// time. If the locked row's due tick is not the one the event was made
// for (the task was fired, changed or resumed meanwhile), nothing is
// fired and the task counts as held: the next pass looks again. Exactly
// once still rests on the row lock and the unique (task, tick) row.
func (s *Scheduler) fireTask(ctx context.Context, r taskRow, tick time.Time, factory func(time.Time) (eventstore.EventData, error), now time.Time) (fired, held bool, err error) {
	name := r.name
	_, zone, err := parseSpec(r.spec, r.zone)
	if err != nil {
		return false, false, errmark.Mark(err, errTaskFault)
	}
	policy, err := parsePolicy(r.missed)
	if err != nil {
		return false, false, errmark.Mark(err, errTaskFault)
	}
	tick = inZone(tick, zone)
	var ev eventstore.EventData
	haveEvent := false
	if now.Sub(tick) <= s.cfg.MissedGrace || policy == FireLatest {
		if ev, err = callEvent(factory, tick); err != nil {
			return false, false, errmark.Mark(errors.Wrapf(err, "scheduler: event of task %q for tick %s", name, tick), errTaskFault)
		}
		haveEvent = true
	}

	inserted, staged := 0, false
	var skipped time.Time
	var late time.Duration
	_, err = s.store.Transact(readCommitted(ctx), func(ctx context.Context, tx pgx.Tx, b *eventstore.Batch) error {
		var r taskRow
		err := s.boundedClaim(ctx, tx, func(q *pgx.QueuedQuery) {
			q.QueryRow(func(row pgx.Row) error { return row.Scan(r.scanArgs()...) })
		}, s.q.lockTask, name, now)
		if err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				held = true // held by another dispatcher (or deleted)
				return nil
			}
			return errors.Wrapf(err, "scheduler: lock task %q", name)
		}
		if s.afterClaim != nil {
			s.afterClaim(tx)
		}
		if r.paused {
			return nil
		}
		sched, lockedZone, err := parseSpec(r.spec, r.zone)
		if err != nil {
			return errmark.Mark(err, errTaskFault)
		}
		lockedTick, due := latestDue(sched, r.anchor(sched, now), now)
		if !due {
			return nil // another dispatcher fired it meanwhile
		}
		lockedTick = inZone(lockedTick, lockedZone)
		policy, err := parsePolicy(r.missed)
		if err != nil {
			return errmark.Mark(err, errTaskFault)
		}
		if late = now.Sub(lockedTick); late > s.cfg.MissedGrace && policy == SkipMissed {
			if _, err := tx.Exec(ctx, s.q.skipTick, name, lockedTick); err != nil {
				return errors.Wrapf(err, "scheduler: skip missed tick of %q", name)
			}
			skipped = lockedTick
			return nil
		}
		if !haveEvent || !lockedTick.Equal(tick) || lockedZone != zone {
			held = true // changed since it was read: the next pass looks again
			return nil
		}
		if late > s.cfg.MissedGrace {
			s.cfg.Logger.InfoContext(ctx, "annals: cron task missed its ticks; firing the latest (FireLatest)",
				"task", name, "tick", tick, "late", late)
		}
		if ev.ID == uuid.Nil {
			ev.ID = TickEventID(name, tick)
		}
		if err := tx.QueryRow(ctx, s.q.recordTick, name, tick, ev.ID).Scan(&inserted); err != nil {
			return errors.Wrapf(err, "scheduler: record tick of %q", name)
		}
		if inserted == 1 {
			if err := b.Append(r.stream, eventstore.Any, ev); err != nil {
				return errors.Wrapf(err, "scheduler: append tick of %q", name)
			}
			staged = true
		}
		return nil
	})
	switch {
	case err != nil && staged:
		return false, false, errors.Wrapf(err, "scheduler: append tick of %q", name)
	case err != nil:
		return false, false, err
	case !skipped.IsZero():
		s.cfg.Logger.InfoContext(ctx, "annals: cron task missed its ticks; skipping them (SkipMissed)",
			"task", name, "latest_missed", skipped, "late", late)
	case inserted == 1:
		s.ticksFired.Add(1)
	}
	return inserted == 1, held, nil
}

// inZone returns tick in the named zone (as it is if the zone does not
// load, which parseSpec has checked).
func inZone(tick time.Time, zone string) time.Time {
	if loc, err := time.LoadLocation(zone); err == nil {
		return tick.In(loc)
	}
	return tick
}

// errTaskFault marks a failed attempt to fire a tick that is the task's own
// doing, not the database's: its Event func returned an error or panicked,
// or its stored definition does not parse.
var errTaskFault = errors.New("the cron task's own failure")

// ownFailure reports whether err, a failed attempt to fire a task's tick,
// is the task's own failure, which retrying as it is will not fix, so that
// its back-off doubles (fireTasks): its Event func failed or panicked, its
// definition does not parse (errTaskFault), or its event cannot be
// appended: invalid (eventstore.ErrInvalidEvent, SQLSTATE AN002), of an
// unregistered type, with an ID stored as a different event (AN003), or to
// a deleted stream (AN005, AN006). Anything else is the connection's or the
// server's failure (a connection lost, a shutdown, a lock or statement
// timeout, a serialization failure), retried after a flat RetryBackoff, so
// that after a database outage every task fires again as soon as the
// database is back instead of waiting out a back-off grown meanwhile.
func ownFailure(err error) bool {
	if errors.IsAny(err, errTaskFault, eventstore.ErrInvalidEvent, eventstore.ErrUnknownEventType,
		eventstore.ErrEventIDConflict, eventstore.ErrStreamDeleted) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case eventstore.CodeInvalidEvent, eventstore.CodeEventIDConflict, eventstore.CodeStreamDeleted, eventstore.CodeStreamTombstoned:
			return true
		}
	}
	return false
}

// callEvent calls a task's Event func, turning a panic into an error (with
// the panic's stack as a detail, which a one-line log leaves out): the
// failure of one task's code is that task's failed attempt, retried like an
// error it returned, and neither stops the other tasks nor the dispatcher.
func callEvent(factory func(time.Time) (eventstore.EventData, error), tick time.Time) (ev eventstore.EventData, err error) {
	err = recovered.Call("Event func", func() error {
		ev, err = factory(tick)
		return err
	})
	return ev, err
}
