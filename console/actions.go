package console

import (
	"context"
	"crypto/hmac"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/checkpoint"
	"github.com/annals-dev/annals/deadletter"
	"github.com/annals-dev/annals/internal/pgtx"
	"github.com/annals-dev/annals/internal/telemetry"
	"github.com/annals-dev/annals/scheduler"
)

// maxIDs bounds how many dead letters one request may act on.
const maxIDs = 1000

// record appends one audit entry in tx (or on the pool when tx is nil).
func (c *Console) record(ctx context.Context, tx pgx.Tx, p Principal, action, target string, detail any) error {
	b, err := json.Marshal(detail)
	if err != nil {
		return errors.Wrap(err, "audit: encode the detail")
	}
	var id int64
	var db queryer = c.pool
	if tx != nil {
		db = tx
	}
	if len(target) > 1000 {
		target = target[:1000]
	}
	return errors.Wrap(db.QueryRow(ctx, c.q["Audit"], p.Name, action, target, string(b)).Scan(&id), "audit: record the action")
}

// done redirects to next with a message for the page to show, signed (ds)
// so that a page shows only messages this console wrote: a link someone
// else made with ?done=... shows nothing.
func (c *Console) done(w http.ResponseWriter, r *http.Request, next, msg string) {
	sep := "?"
	if strings.Contains(next, "?") {
		sep = "&"
	}
	http.Redirect(w, r, c.base(r)+next+sep+url.Values{"done": {msg}, "ds": {c.mac("done", msg)}}.Encode(), http.StatusSeeOther)
}

// doneMessage returns the request's done message if this console signed it.
func (c *Console) doneMessage(r *http.Request) string {
	q := r.URL.Query()
	msg := q.Get("done")
	if msg == "" || !hmac.Equal([]byte(q.Get("ds")), []byte(c.mac("done", msg))) {
		return ""
	}
	return msg
}

// actionError answers an action's failure: bad input 400, unknown 404, else 500.
func (c *Console) actionError(w http.ResponseWriter, r *http.Request, err error) {
	var he httpError
	switch {
	case errors.As(err, &he):
		c.fail(w, r, he.code, he.msg)
	case errors.Is(err, deadletter.ErrNotFound), errors.Is(err, scheduler.ErrUnknownTask), errors.Is(err, checkpoint.ErrNotFound):
		c.fail(w, r, http.StatusNotFound, err.Error()+": nothing was changed.")
	case errors.Is(err, deadletter.ErrInvalid), errors.Is(err, scheduler.ErrInvalidTask):
		c.fail(w, r, http.StatusBadRequest, err.Error()+": nothing was changed.")
	default:
		c.cfg.Logger.Error("console: action", "path", r.URL.Path, telemetry.Err(err))
		c.fail(w, r, http.StatusInternalServerError, "The action failed and was rolled back: "+err.Error())
	}
}

// ids reads the dead-letter IDs of a form (one or many "id" fields).
func ids(r *http.Request) ([]int64, error) {
	if err := r.ParseForm(); err != nil {
		return nil, badRequest("unreadable form: %v", err)
	}
	vals := r.PostForm["id"]
	if len(vals) == 0 {
		return nil, badRequest("select at least one dead letter")
	}
	if len(vals) > maxIDs {
		return nil, badRequest("at most %d dead letters at once", maxIDs)
	}
	out := make([]int64, 0, len(vals))
	for _, v := range vals {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 1 {
			return nil, badRequest("dead letter ID %q: want an integer from 1", v)
		}
		out = append(out, n)
	}
	return out, nil
}

// back is where an action on dead letters returns: the page it came from
// when that is a console page, else the list.
func (c *Console) back(r *http.Request) string {
	if n := r.PostFormValue("next"); localPath(n) {
		return n
	}
	return "/dead-letters"
}

// localPath reports whether p is a path on this host: it starts with one
// slash, and no slash or backslash follows it (browsers read "//x" and
// "/\\x" as another host), and holds no control character.
func localPath(p string) bool {
	if len(p) < 1 || p[0] != '/' || (len(p) > 1 && (p[1] == '/' || p[1] == '\\')) {
		return false
	}
	for _, r := range p {
		if r < 0x20 || r == 0x7f {
			return false
		}
	}
	return true
}

func (c *Console) dlqEach(w http.ResponseWriter, r *http.Request, p Principal, action string,
	op func(context.Context, pgx.Tx, int64) (deadletter.Change, error)) {
	list, err := ids(r)
	if err != nil {
		c.actionError(w, r, err)
		return
	}
	ctx := r.Context()
	var total deadletter.Change
	err = pgtx.Retrying(ctx, c.pool, func(tx pgx.Tx) error {
		// A dead letter can change twice in one request (skipping one
		// releases the stream's next, which the next ID then skips): each
		// is counted once, by its last change.
		total = deadletter.Change{} // an attempt a deadlock aborted counted nothing
		last := map[int64]bool{}    // id → skipped (else retried)
		var order []int64
		note := func(ids []int64, skipped bool) {
			for _, id := range ids {
				if _, seen := last[id]; !seen {
					order = append(order, id)
				}
				last[id] = skipped
			}
		}
		for _, id := range list {
			ch, err := op(ctx, tx, id)
			if err != nil {
				return err // it names the dead letter
			}
			note(ch.Retried, false)
			note(ch.Skipped, true)
			total.Gone = append(total.Gone, ch.Gone...)
			total.Resumed = append(total.Resumed, ch.Resumed...)
		}
		// The audit detail lists none as [], never null.
		total.Retried, total.Skipped = []int64{}, []int64{}
		for _, id := range order {
			if last[id] {
				total.Skipped = append(total.Skipped, id)
			} else {
				total.Retried = append(total.Retried, id)
			}
		}
		return c.record(ctx, tx, p, action, idsText(list), map[string]any{
			"ids": list, "retried": total.Retried, "skipped": total.Skipped, "gone": orEmpty(total.Gone),
			"resumed": len(total.Resumed)})
	})
	if err != nil {
		c.actionError(w, r, err)
		return
	}
	msg := fmt.Sprintf("%d dead letter(s) marked for re-delivery, %d skipped, %d halted partition(s) resumed.",
		len(total.Retried), len(total.Skipped), len(total.Resumed))
	msg += gone(total.Gone)
	if !total.Changed() {
		msg = "Nothing to change: the selected dead letters were no longer open."
	}
	c.done(w, r, c.back(r), msg)
}

// orEmpty returns list, or an empty list for nil: an audit detail writes
// none as [], as the other entries do, not null.
func orEmpty(list []int64) []int64 {
	if list == nil {
		return []int64{}
	}
	return list
}

func idsText(list []int64) string {
	parts := make([]string, len(list))
	for i, id := range list {
		parts[i] = strconv.FormatInt(id, 10)
	}
	return "dead_letters " + strings.Join(parts, ",")
}

func (c *Console) dlqRetry(w http.ResponseWriter, r *http.Request, p Principal) {
	c.dlqEach(w, r, p, "dlq.retry", c.dlq.RetryTx)
}

func (c *Console) dlqSkip(w http.ResponseWriter, r *http.Request, p Principal) {
	c.dlqEach(w, r, p, "dlq.skip", c.dlq.SkipTx)
}

func (c *Console) dlqRetryAll(w http.ResponseWriter, r *http.Request, p Principal) {
	sub := r.PostFormValue("subscriber")
	if sub == "" {
		c.actionError(w, r, badRequest("subscriber is empty"))
		return
	}
	ctx := r.Context()
	var ch deadletter.Change
	err := pgtx.Retrying(ctx, c.pool, func(tx pgx.Tx) error {
		var err error
		if ch, err = c.dlq.RetryAllTx(ctx, tx, sub); err != nil {
			return err
		}
		return c.record(ctx, tx, p, "dlq.retry_all", "subscriber "+sub, map[string]any{"retried": orEmpty(ch.Retried),
			"gone": orEmpty(ch.Gone), "resumed": len(ch.Resumed)})
	})
	if err != nil {
		c.actionError(w, r, err)
		return
	}
	c.done(w, r, c.back(r), fmt.Sprintf("%d dead letter(s) of %s marked for re-delivery, %d halted partition(s) resumed.", len(ch.Retried), sub, len(ch.Resumed))+gone(ch.Gone))
}

// gone is the sentence a retry adds for the dead letters it skipped
// because their events are no longer in the log (deadletter.Change.Gone),
// or "".
func gone(ids []int64) string {
	if len(ids) == 0 {
		return ""
	}
	return fmt.Sprintf(" Skipped %d whose event no longer exists in the log (removed by a delete, truncation or retention, then a scavenge): %s.",
		len(ids), strings.TrimPrefix(idsText(ids), "dead_letters "))
}

func (c *Console) dlqPurge(w http.ResponseWriter, r *http.Request, p Principal) {
	if r.PostFormValue("confirm") != "yes" {
		c.actionError(w, r, badRequest("confirm the purge (tick the box): nothing was deleted"))
		return
	}
	age, err := deadletter.ParseAge(r.PostFormValue("older_than"))
	if err != nil {
		c.actionError(w, r, badRequest("older than %q: want a duration such as 30d, 24h or 0s", r.PostFormValue("older_than")))
		return
	}
	all := r.PostFormValue("include_unresolved") == "yes"
	ctx := r.Context()
	var n int64
	err = pgtx.Retrying(ctx, c.pool, func(tx pgx.Tx) error {
		var now time.Time
		if err := tx.QueryRow(ctx, "SELECT now()").Scan(&now); err != nil {
			return errors.Wrap(err, "read the clock")
		}
		cutoff := now.Add(-age)
		if n, err = c.dlq.PurgeTx(ctx, tx, cutoff, all); err != nil {
			return err
		}
		return c.record(ctx, tx, p, "dlq.purge", "dead_letters", map[string]any{"older_than": age.String(), "cutoff": cutoff, "include_unresolved": all, "deleted": n})
	})
	if err != nil {
		c.actionError(w, r, err)
		return
	}
	c.done(w, r, "/dead-letters", fmt.Sprintf("Purged %d dead letter(s).", n))
}

func (c *Console) checkpointSet(w http.ResponseWriter, r *http.Request, p Principal) {
	sub := r.PathValue("name")
	part, err := strconv.Atoi(r.PostFormValue("partition"))
	if err != nil || part < 0 {
		c.actionError(w, r, badRequest("partition %q: want 0 or more", r.PostFormValue("partition")))
		return
	}
	pos, err := strconv.ParseInt(r.PostFormValue("position"), 10, 64)
	if err != nil || pos < 0 {
		c.actionError(w, r, badRequest("position %q: want 0 or more", r.PostFormValue("position")))
		return
	}
	if r.PostFormValue("confirm") != "yes" {
		c.actionError(w, r, badRequest("confirm the move (tick the box): the checkpoint is unchanged"))
		return
	}
	ctx := r.Context()
	var m checkpoint.Moved
	err = pgtx.Retrying(ctx, c.pool, func(tx pgx.Tx) error {
		var head int64
		if err := tx.QueryRow(ctx, c.q["Head"]).Scan(&head, new(time.Time)); err != nil {
			return errors.Wrap(err, "read the head")
		}
		if pos > head {
			return badRequest("position %d is past the head of the log (%d): the checkpoint is unchanged", pos, head)
		}
		// Move locks the row, moves it and, moving back, settles the
		// partition's dead letters after the new position, as `annals
		// checkpoint set` does.
		var err error
		m, err = c.cps.Move(ctx, tx, sub, part, pos)
		if errors.Is(err, checkpoint.ErrNotFound) {
			return notFound("No subscriber %s/%d: the checkpoint is unchanged.", sub, part)
		}
		if err != nil {
			return err
		}
		return c.record(ctx, tx, p, "checkpoint.set", fmt.Sprintf("%s/%d", sub, part),
			map[string]any{"from": m.Before.Position, "to": m.After.Position, "epoch_from": m.Before.Epoch, "epoch_to": m.After.Epoch,
				"dead_letters_settled": m.DeadLettersSettled})
	})
	if err != nil {
		c.actionError(w, r, err)
		return
	}
	msg := fmt.Sprintf("%s/%d: position %d → %d, epoch %d → %d.",
		sub, part, m.Before.Position, m.After.Position, m.Before.Epoch, m.After.Epoch)
	if m.DeadLettersSettled > 0 {
		msg += fmt.Sprintf(" %d dead letter(s) after position %d settled as resolved: their events are delivered again (one that fails again is open again).",
			m.DeadLettersSettled, m.After.Position)
	}
	c.done(w, r, "/subscribers/"+pathSegment(sub), msg)
}

func (c *Console) taskCommand(w http.ResponseWriter, r *http.Request, p Principal, action string, op func(context.Context, string) error) {
	name := r.PathValue("name")
	ctx := r.Context()
	// The scheduler changes the task in a transaction of its own; the entry
	// follows once it committed (a failed change records nothing).
	if err := op(ctx, name); err != nil {
		c.actionError(w, r, err)
		return
	}
	if err := c.record(ctx, nil, p, action, "cron_task "+name, map[string]any{}); err != nil {
		c.actionError(w, r, err)
		return
	}
	c.done(w, r, "/scheduler", fmt.Sprintf("Task %s: %s done.", name, strings.TrimPrefix(action, "cron.")))
}

func (c *Console) taskPause(w http.ResponseWriter, r *http.Request, p Principal) {
	c.taskCommand(w, r, p, "cron.pause", c.sched.PauseTask)
}

func (c *Console) taskResume(w http.ResponseWriter, r *http.Request, p Principal) {
	c.taskCommand(w, r, p, "cron.resume", c.sched.ResumeTask)
}
