package cli

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/scheduler"
)

func (e *env) scheduleCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "schedule",
		Short: "Inspect and manage cron tasks and pending timers",
		Long: `The scheduler package stores timers (delayed appends) and cron tasks in the database;
every process that runs a scheduler dispatcher fires them, each exactly once.
'schedule list' shows what is stored; pause, resume and delete act on a cron task and
cancel on a timer, cluster-wide, from the database alone.`,
		Annotations: map[string]string{groupAnnotation: ""},
		RunE: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usagef("want a subcommand: list, pause, resume, delete or cancel")
			}
			return usagef("unknown subcommand %q: want list, pause, resume, delete or cancel", args[0])
		},
	}
	cmd.AddCommand(e.scheduleListCommand(), e.scheduleTaskCommand("pause"), e.scheduleTaskCommand("resume"),
		e.scheduleTaskCommand("delete"), e.scheduleCancelCommand())
	return cmd
}

func (e *env) scheduleListCommand() *cobra.Command {
	var format *string
	var limit int
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List cron tasks, and timers: counts, next due, failed ones first",
		Long: `List every cron task (spec, time zone, stream, missed-tick policy, paused or not, next
tick, last fired tick), then the timers: how many are pending, when the next is due,
how many have failed (their attempts are spent: kept, never retried, until cancelled),
and up to --limit timers (1 to 1000, default 20), failed ones first, then by due time.

A task's next tick is the first tick after its last fired one; "(overdue)" marks one
in the past by this machine's clock: no running process has the task registered, or
it is being fired right now. Times are UTC.

--output json writes one object:
  {"schema", "tasks": [{"name", "spec", "time_zone", "stream_id", "missed", "paused",
                        "next_tick", "last_tick", "active_since"}],
   "timers": {"pending", "failed", "next_due",
              "list": [{"id", "due_at", "stream_id", "owner", "events", "event_type",
                        "attempts", "last_error", "failed_at", "created_at"}]}}
next_tick, last_tick, next_due and failed_at are null when there is none.`,
		Example: `  annals schedule list
  annals schedule list --output json | jq '.timers.failed'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if limit < 1 || limit > 1000 {
				return usagef("--limit %d: want 1 to 1000", limit)
			}
			out, err := e.loadSchedule(cmd.Context(), limit)
			if err != nil {
				return err
			}
			if *format == outputJSON {
				return writeJSON(e.stdout, out)
			}
			return writeScheduleTable(e.stdout, out, time.Now())
		},
	}
	format = addOutputFlag(cmd, true, outputText, outputJSON)
	cmd.Flags().IntVar(&limit, "limit", 20, "how many timers to list, 1 to 1000")
	return cmd
}

// ScheduleJSON is the output of `annals schedule list --output json`.
type ScheduleJSON struct {
	// Schema is the annals schema inspected.
	Schema string `json:"schema"`
	// Tasks has one element per cron task, by name.
	Tasks []ScheduleTask `json:"tasks"`
	// Timers summarizes and lists the stored timers.
	Timers ScheduleTimers `json:"timers"`
}

// ScheduleTask is one cron task in ScheduleJSON.
type ScheduleTask struct {
	Name        string     `json:"name"`
	Spec        string     `json:"spec"`
	TimeZone    string     `json:"time_zone"`
	StreamID    string     `json:"stream_id"`
	Missed      string     `json:"missed"`
	Paused      bool       `json:"paused"`
	NextTick    *time.Time `json:"next_tick"`
	LastTick    *time.Time `json:"last_tick"`
	ActiveSince time.Time  `json:"active_since"`
}

// ScheduleTimers is the timers part of ScheduleJSON.
type ScheduleTimers struct {
	Pending int             `json:"pending"`
	Failed  int             `json:"failed"`
	NextDue *time.Time      `json:"next_due"`
	List    []ScheduleTimer `json:"list"`
}

// ScheduleTimer is one timer in ScheduleJSON.
type ScheduleTimer struct {
	ID        string     `json:"id"`
	DueAt     time.Time  `json:"due_at"`
	StreamID  string     `json:"stream_id"`
	Owner     *string    `json:"owner"`
	Events    int        `json:"events"`
	EventType string     `json:"event_type"`
	Attempts  int        `json:"attempts"`
	LastError *string    `json:"last_error"`
	FailedAt  *time.Time `json:"failed_at"`
	CreatedAt time.Time  `json:"created_at"`
}

// withScheduler runs fn with a scheduler on the configured database; an
// unmigrated schema is reported as such.
func (e *env) withScheduler(ctx context.Context, fn func(s *scheduler.Scheduler, pool *pgxpool.Pool) error) error {
	pool, err := e.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	store, err := eventstore.New(pool, &eventstore.Config{Schema: e.schema})
	if err != nil {
		return err
	}
	// Times this command writes (a resumed task's start) come from the
	// database's clock, not this machine's, which may be skewed.
	var dbNow time.Time
	if err := pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&dbNow); err != nil {
		return errors.Wrap(err, "read the database's clock")
	}
	s, err := scheduler.New(store, &scheduler.Config{Clock: offsetClock(time.Until(dbNow))})
	if err != nil {
		return err
	}
	return fn(s, pool)
}

// offsetClock is the wall clock shifted by an offset (to the database's).
type offsetClock time.Duration

func (c offsetClock) Now() time.Time                         { return time.Now().Add(time.Duration(c)) }
func (c offsetClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

func (e *env) loadSchedule(ctx context.Context, limit int) (*ScheduleJSON, error) {
	var out *ScheduleJSON
	err := e.withScheduler(ctx, func(s *scheduler.Scheduler, _ *pgxpool.Pool) error {
		var err error
		out, err = readSchedule(ctx, s, limit)
		return err
	})
	if out != nil {
		out.Schema = e.schema
	}
	return out, err
}

// scheduleTaskCommand is 'schedule pause|resume|delete TASK'.
func (e *env) scheduleTaskCommand(verb string) *cobra.Command {
	short := map[string]string{
		"pause":  "Pause a cron task cluster-wide: no tick fires until it is resumed",
		"resume": "Resume a paused cron task: ticks that fell while it was paused never fire",
		"delete": "Delete a cron task and its tick history cluster-wide",
	}[verb]
	long := short + ". An unknown task exits 3 (not found)."
	if verb == "delete" {
		long += `
A process that adds the task again at start (scheduler.AddTask) recreates it: remove it
from the code first.`
	}
	var format *string
	cmd := &cobra.Command{
		Use:   verb + " TASK",
		Short: short,
		Long:  long,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if name == "" {
				return usagef("the task name is empty")
			}
			err := e.withScheduler(cmd.Context(), func(s *scheduler.Scheduler, pool *pgxpool.Pool) error {
				if err := e.mayAudit(cmd.Context(), pool); err != nil {
					return err
				}
				var err error
				switch verb {
				case "pause":
					err = s.PauseTask(cmd.Context(), name)
				case "resume":
					err = s.ResumeTask(cmd.Context(), name)
				default:
					err = s.DeleteTask(cmd.Context(), name)
				}
				if err != nil {
					return err
				}
				// The scheduler committed the change in a transaction of
				// its own: the audit entry follows (as the console's does).
				if err := e.audit(cmd.Context(), pool, "cron."+verb, "cron_task "+name, map[string]any{}); err != nil {
					return errors.Wrapf(err, "%sd cron task %s, but", verb, name)
				}
				return nil
			})
			if errors.Is(err, scheduler.ErrUnknownTask) {
				return notFoundError{err}
			}
			if err != nil {
				return err
			}
			if *format == outputJSON {
				return writeJSON(cmd.OutOrStdout(), ScheduleActionJSON{Action: verb + "d", Task: name})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%sd cron task %s\n", verb, name) // paused, resumed, deleted
			return nil
		},
	}
	format = addOutputFlag(cmd, false, outputText, outputJSON)
	return cmd
}

// ScheduleActionJSON is what `annals schedule pause|resume|delete|cancel
// --output json` prints: the action done ("paused", "resumed", "deleted",
// "cancelled") and the task or timer it was done to.
type ScheduleActionJSON struct {
	Action string `json:"action"`
	Task   string `json:"task,omitempty"`
	Timer  string `json:"timer,omitempty"`
}

// scheduleCancelCommand is 'schedule cancel TIMER-ID'.
func (e *env) scheduleCancelCommand() *cobra.Command {
	var format *string
	cmd := &cobra.Command{
		Use:   "cancel TIMER-ID",
		Short: "Cancel a pending or failed timer (its events are never appended)",
		Long: `Cancel a pending or failed timer by its ID (see 'schedule list'). A timer that is being
fired right now is waited for (at most the scheduler's ClaimTimeout): cancelled if its
append fails, fired otherwise. A timer that was fired already cannot be cancelled: the
command exits 3 (not found) then.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := uuid.Parse(args[0])
			if err != nil {
				return usagef("timer ID %q: want a UUID (see 'annals schedule list')", args[0])
			}
			err = e.withScheduler(cmd.Context(), func(s *scheduler.Scheduler, pool *pgxpool.Pool) error {
				return e.audited(cmd.Context(), pool, "timer.cancel", func(tx pgx.Tx) (string, any, error) {
					ok, err := s.Cancel(cmd.Context(), tx, id)
					if err == nil && !ok {
						// Returned inside the transaction, which then rolls
						// back: a cancel that did nothing records nothing.
						err = notFoundf("no pending timer %s (fired already, cancelled, or never stored)", id)
					}
					return "timer " + id.String(), map[string]any{"cancelled": ok}, err
				})
			})
			if err != nil {
				return err
			}
			if *format == outputJSON {
				return writeJSON(cmd.OutOrStdout(), ScheduleActionJSON{Action: "cancelled", Timer: id.String()})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "cancelled timer %s\n", id)
			return nil
		},
	}
	format = addOutputFlag(cmd, false, outputText, outputJSON)
	return cmd
}

func readSchedule(ctx context.Context, s *scheduler.Scheduler, limit int) (*ScheduleJSON, error) {
	tasks, err := s.Tasks(ctx)
	if err != nil {
		return nil, err
	}
	stats, err := s.TimerStats(ctx)
	if err != nil {
		return nil, err
	}
	timers, err := s.Timers(ctx, limit)
	if err != nil {
		return nil, err
	}
	out := &ScheduleJSON{Tasks: []ScheduleTask{}, Timers: ScheduleTimers{Pending: stats.Pending, Failed: stats.Failed, NextDue: utcPtr(stats.NextDue), List: []ScheduleTimer{}}}
	for _, t := range tasks {
		st := ScheduleTask{Name: t.Name, Spec: t.Spec, TimeZone: t.TimeZone, StreamID: t.StreamID, Missed: t.Missed.String(),
			Paused: t.Paused, LastTick: utcPtr(t.LastTick), ActiveSince: t.ActiveSince.UTC()}
		if !t.NextTick.IsZero() {
			st.NextTick = utcPtr(&t.NextTick)
		}
		out.Tasks = append(out.Tasks, st)
	}
	for _, t := range timers {
		st := ScheduleTimer{ID: t.ID.String(), DueAt: t.DueAt.UTC(), StreamID: t.StreamID, Events: t.Events, EventType: t.EventType,
			Attempts: t.Attempts, FailedAt: utcPtr(t.FailedAt), CreatedAt: t.CreatedAt.UTC()}
		if t.Owner != "" {
			st.Owner = &t.Owner
		}
		if t.LastError != "" {
			st.LastError = &t.LastError
		}
		out.Timers.List = append(out.Timers.List, st)
	}
	return out, nil
}

func utcPtr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

// writeScheduleTable writes the cron tasks and the timers as two tables,
// lined up by display width (textTable: text/tabwriter counted runes, so a
// CJK task name or stream ID pushed the columns after it out of line).
func writeScheduleTable(w io.Writer, s *ScheduleJSON, now time.Time) error {
	var b strings.Builder
	if len(s.Tasks) == 0 {
		b.WriteString("No cron tasks.\n")
	} else {
		var tbl textTable
		tbl.add("TASK", "SPEC", "ZONE", "STREAM", "MISSED", "STATE", "NEXT TICK", "LAST FIRED")
		for _, t := range s.Tasks {
			state, next := "active", "-"
			if t.Paused {
				state = "paused"
			}
			if t.NextTick != nil {
				next = t.NextTick.Format(timeLayout)
				if t.NextTick.Before(now) {
					next += " (overdue)"
				}
			}
			last := "-"
			if t.LastTick != nil {
				last = t.LastTick.Format(timeLayout)
			}
			tbl.add(textCell(t.Name), textCell(t.Spec), textCell(t.TimeZone), textCell(t.StreamID), t.Missed, state, next, last)
		}
		_ = tbl.write(&b)
	}
	b.WriteString("\n")
	tm := s.Timers
	next := ""
	if tm.NextDue != nil {
		next = ", next due " + tm.NextDue.Format(timeLayout)
	}
	fmt.Fprintf(&b, "Timers: %s%s, %d failed.\n", countNoun(tm.Pending, "pending timer"), next, tm.Failed)
	if len(tm.List) > 0 {
		var tbl textTable
		tbl.add("TIMER", "STATE", "DUE", "STREAM", "OWNER", "EVENTS", "ATTEMPTS", "ERROR")
		for _, t := range tm.List {
			state := "pending"
			if t.FailedAt != nil {
				state = "failed"
			}
			owner, errText := "-", "-"
			if t.Owner != nil {
				owner = textCell(*t.Owner)
			}
			if t.LastError != nil {
				errText = summary(*t.LastError)
			}
			events := fmt.Sprintf("%d × %s", t.Events, textCell(t.EventType))
			if t.Events == 1 {
				events = textCell(t.EventType)
			}
			tbl.add(t.ID, state, t.DueAt.Format(timeLayout), textCell(t.StreamID), owner, events, strconv.Itoa(t.Attempts), errText)
		}
		if shown := len(tm.List); shown < tm.Pending+tm.Failed {
			tbl.add(fmt.Sprintf("(%d of %d shown: --limit)", shown, tm.Pending+tm.Failed))
		}
		_ = tbl.write(&b)
	}
	_, err := io.WriteString(w, b.String())
	return err
}
