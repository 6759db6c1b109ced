package console

import (
	"bytes"
	"encoding/json"
	"fmt"
	"html/template"
	"io"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/deadletter"
	"github.com/annals-dev/annals/internal/standby"
	"github.com/annals-dev/annals/internal/telemetry"
	"github.com/annals-dev/annals/scheduler"
)

// view is what a page handler returns: the template and its data.
type view struct {
	Tpl   string
	Title string
	Nav   string
	Data  any
}

// httpError is an error with the status to answer.
type httpError struct {
	code int
	msg  string
}

func (e httpError) Error() string { return e.msg }

func badRequest(format string, args ...any) error {
	return httpError{http.StatusBadRequest, errors.Newf(format, args...).Error()}
}

func notFound(format string, args ...any) error {
	return httpError{http.StatusNotFound, errors.Newf(format, args...).Error()}
}

// layout is what every page's frame sees.
type layout struct {
	view
	Base      string
	CSRF      string
	Who       *Principal
	ReadOnly  bool
	TokenAuth bool
	CanWrite  bool
	Done      string
}

func (c *Console) page(fn func(*http.Request) (*view, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		v, err := fn(r)
		if err != nil {
			var he httpError
			if errors.As(err, &he) {
				c.fail(w, r, he.code, he.msg)
				return
			}
			c.cfg.Logger.Error("console: page", "path", r.URL.Path, telemetry.Err(err))
			c.fail(w, r, http.StatusInternalServerError, "The database did not answer as expected: "+err.Error())
			return
		}
		c.render(w, r, http.StatusOK, v)
	}
}

func (c *Console) render(w http.ResponseWriter, r *http.Request, code int, v *view) {
	l := layout{view: *v, Base: c.base(r), CSRF: c.csrfToken(w, r), ReadOnly: c.cfg.ReadOnly,
		TokenAuth: c.cfg.AuthToken != "", Done: c.doneMessage(r)}
	if p, ok := c.principal(r); ok {
		l.Who = &p
		l.CanWrite = p.Operator && !c.cfg.ReadOnly
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	if err := c.tpl.execute(w, v.Tpl, l); err != nil {
		c.cfg.Logger.Error("console: render", "template", v.Tpl, telemetry.Err(err))
	}
}

func (c *Console) fail(w http.ResponseWriter, r *http.Request, code int, msg string) {
	c.render(w, r, code, &view{Tpl: "error", Title: http.StatusText(code), Data: map[string]any{"Code": code, "Message": msg}})
}

// --- overview

type overviewData struct {
	Head        int64
	Now         time.Time
	Rate        []ratePoint
	RateMax     int64
	RatePerMin  float64
	Spark       string
	Partitions  []Partition
	Instances   []Instance
	Live        int
	DeadLetters map[string]map[string]int64
	DLQTotal    map[string]int64
	Timers      [2]int64
}

type ratePoint struct {
	Minute time.Time
	Count  int64
}

// rateWindow is the sparkline's width in minutes; rateSample bounds how many
// of the newest events it counts.
const (
	rateWindow = 60
	rateSample = 100_000
)

func (c *Console) overview(r *http.Request) (*view, error) {
	ctx := r.Context()
	d := overviewData{DLQTotal: map[string]int64{}}
	err := c.readOnlyTx(ctx, func(tx pgx.Tx) error {
		var err error
		if d.Head, d.Now, err = c.head(ctx, tx); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, c.q["RecentRate"], rateWindow, rateSample)
		if err != nil {
			return errors.Wrap(err, "read the append rate")
		}
		counts := map[int64]int64{}
		var m time.Time
		var n int64
		if _, err := pgx.ForEachRow(rows, []any{&m, &n}, func() error { counts[m.Unix()] = n; return nil }); err != nil {
			return errors.Wrap(err, "read the append rate")
		}
		end := d.Now.Truncate(time.Minute)
		var total int64
		for i := rateWindow - 1; i >= 0; i-- {
			t := end.Add(-time.Duration(i) * time.Minute)
			p := ratePoint{Minute: t, Count: counts[t.Unix()]}
			d.Rate = append(d.Rate, p)
			d.RateMax = max(d.RateMax, p.Count)
			total += p.Count
		}
		d.RatePerMin = float64(total) / rateWindow
		d.Spark = sparkline(d.Rate, d.RateMax)
		if d.Partitions, d.Instances, err = c.leadership(ctx, tx, d.Head, nil, lagCountLimit); err != nil {
			return err
		}
		for _, in := range d.Instances {
			if in.Live {
				d.Live++
			}
		}
		if d.DeadLetters, err = c.deadLetterCounts(ctx, tx); err != nil {
			return err
		}
		for _, m := range d.DeadLetters {
			for st, n := range m {
				d.DLQTotal[st] += n
			}
		}
		return errors.Wrap(tx.QueryRow(ctx, c.q["TimerCounts"]).Scan(&d.Timers[0], &d.Timers[1]), "count the timers")
	})
	return &view{Tpl: "overview", Title: "Overview", Nav: "overview", Data: d}, err
}

// sparkline returns the points of an SVG polyline 300×40 for the counts.
func sparkline(pts []ratePoint, peak int64) string {
	if len(pts) < 2 {
		return ""
	}
	var b strings.Builder
	for i, p := range pts {
		x := float64(i) * 300 / float64(len(pts)-1)
		y := 38.0
		if peak > 0 {
			y = 38 - 36*float64(p.Count)/float64(peak)
		}
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(strconv.FormatFloat(x, 'f', 1, 64) + "," + strconv.FormatFloat(y, 'f', 1, 64))
	}
	return b.String()
}

// --- streams and events

const pageSize = 50

type streamsData struct {
	Prefix  string
	Streams []streamRow
	Next    string
}

type streamRow struct {
	ID        string
	Version   int64
	CreatedAt time.Time
	UpdatedAt time.Time
}

func likePrefix(p string) string {
	r := strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`)
	return r.Replace(p) + "%"
}

func (c *Console) streams(r *http.Request) (*view, error) {
	q := r.URL.Query()
	d := streamsData{Prefix: q.Get("prefix")}
	rows, err := c.pool.Query(r.Context(), c.q["Streams"], likePrefix(d.Prefix), q.Get("after"), pageSize+1)
	if err != nil {
		return nil, errors.Wrap(err, "read the streams")
	}
	var s streamRow
	_, err = pgx.ForEachRow(rows, []any{&s.ID, &s.Version, &s.CreatedAt, &s.UpdatedAt}, func() error {
		d.Streams = append(d.Streams, s)
		return nil
	})
	if err != nil {
		return nil, errors.Wrap(err, "read the streams")
	}
	if len(d.Streams) > pageSize {
		d.Streams = d.Streams[:pageSize]
		d.Next = d.Streams[pageSize-1].ID
	}
	return &view{Tpl: "streams", Title: "Streams", Nav: "streams", Data: d}, nil
}

type streamData struct {
	ID     string
	From   int64
	Events []Event
	Next   int64
	Prev   int64
}

func (c *Console) stream(r *http.Request) (*view, error) {
	d := streamData{ID: r.PathValue("id"), From: 1}
	if f := r.URL.Query().Get("from"); f != "" {
		v, err := strconv.ParseInt(f, 10, 64)
		if err != nil || v < 1 {
			return nil, badRequest("from=%q: want a stream version from 1", f)
		}
		d.From = v
	}
	evs, err := scanEvents(c.pool.Query(r.Context(), c.q["StreamEvents"], d.ID, d.From, pageSize+1, listChars))
	if err != nil {
		return nil, err
	}
	if len(evs) == 0 && d.From == 1 {
		return nil, notFound("No stream %q.", d.ID)
	}
	if len(evs) > pageSize {
		evs = evs[:pageSize]
		d.Next = evs[pageSize-1].Version + 1
	}
	if d.From > 1 {
		d.Prev = max(1, d.From-pageSize)
	}
	d.Events = evs
	return &view{Tpl: "stream", Title: "Stream " + d.ID, Nav: "streams", Data: d}, nil
}

type logData struct {
	After  int64
	Before int64
	Type   string
	Head   int64
	Events []Event
	Next   int64
	Prev   int64
	Follow string
}

// scanWindow bounds how many positions one page of the log filtered by type
// reads past its start.
const scanWindow = 100_000

// typeRegex turns the comma-separated globs of a type filter into the
// regular expression the query matches, or nil for every type.
func typeRegex(globs string) (*string, error) {
	var pats []string
	for _, p := range strings.Split(globs, ",") {
		if p = strings.TrimSpace(p); p != "" {
			pats = append(pats, p)
		}
	}
	f, err := catchup.ParseFilter(pats)
	if err != nil {
		return nil, badRequest("type=%q: %v", globs, err)
	}
	if f.All() {
		return nil, nil
	}
	re := f.Regex()
	return &re, nil
}

func (c *Console) log(r *http.Request) (*view, error) {
	q := r.URL.Query()
	d := logData{Type: q.Get("type")}
	re, err := typeRegex(d.Type)
	if err != nil {
		return nil, err
	}
	for name, dst := range map[string]*int64{"after": &d.After, "before": &d.Before} {
		if v := q.Get(name); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 {
				return nil, badRequest("%s=%q: want a position (0 or more)", name, v)
			}
			*dst = n
		}
	}
	ctx := r.Context()
	if d.Head, _, err = c.head(ctx, c.pool); err != nil {
		return nil, err
	}
	// The window a page scans, clamped to the positions a bigint holds
	// (after=9223372036854700000 is a page past the head, not an error); a
	// page before a position past the head is the log's last page.
	d.Before = min(d.Before, d.Head+1)
	upper := d.After + scanWindow
	if upper < d.After {
		upper = math.MaxInt64
	}
	if d.Before > 0 {
		evs, err := scanEvents(c.pool.Query(ctx, c.q["LogEventsBefore"], d.Before, pageSize, re, max(d.Before-scanWindow, 0), listChars))
		if err != nil {
			return nil, err
		}
		slices.Reverse(evs)
		d.Events = evs
	} else {
		if d.Events, err = scanEvents(c.pool.Query(ctx, c.q["LogEvents"], d.After, pageSize, re, upper, listChars)); err != nil {
			return nil, err
		}
	}
	if n := len(d.Events); n > 0 {
		if d.Events[n-1].Position < d.Head {
			d.Next = d.Events[n-1].Position
		}
		if d.Events[0].Position > 1 {
			d.Prev = d.Events[0].Position
		}
	} else if d.Before == 0 && upper < d.Head {
		d.Next = upper // nothing of the type in this window: look further
	}
	last := d.Head
	if n := len(d.Events); n > 0 {
		last = d.Events[n-1].Position
	}
	d.Follow = url.Values{"after": {strconv.FormatInt(last, 10)}, "type": {d.Type}}.Encode()
	return &view{Tpl: "log", Title: "Log", Nav: "log", Data: d}, nil
}

type eventData struct {
	Event      Event
	PrettyData string
	PrettyMeta string
}

// pretty indents a JSON document as stored: json.Indent keeps its numbers
// and strings byte for byte (decoding into any and encoding again turned
// integers above 2^53 into other numbers, and < > & into \u escapes).
func pretty(raw string) string {
	if raw == "" {
		return ""
	}
	var b bytes.Buffer
	if err := json.Indent(&b, []byte(raw), "", "  "); err != nil {
		return raw
	}
	return b.String()
}

func (c *Console) event(r *http.Request) (*view, error) {
	pos, err := strconv.ParseInt(r.PathValue("pos"), 10, 64)
	if err != nil || pos < 1 {
		return nil, badRequest("%q: want a position from 1", r.PathValue("pos"))
	}
	evs, err := scanEvents(c.pool.Query(r.Context(), c.q["Event"], pos, eventChars))
	if err != nil {
		return nil, err
	}
	if len(evs) == 0 {
		return nil, notFound("No event at position %d.", pos)
	}
	d := eventData{Event: evs[0], PrettyData: pretty(evs[0].Data), PrettyMeta: pretty(evs[0].Metadata)}
	return &view{Tpl: "event", Title: "Event " + strconv.FormatInt(pos, 10), Nav: "log", Data: d}, nil
}

// eventRaw serves one event's data (or metadata) whole, as stored, as
// application/json: what a page shows cut short (an event bigger than
// eventChars characters), for a download or a script.
func (c *Console) eventRaw(metadata bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		pos, err := strconv.ParseInt(r.PathValue("pos"), 10, 64)
		if err != nil || pos < 1 {
			c.fail(w, r, http.StatusBadRequest, fmt.Sprintf("%q: want a position from 1", r.PathValue("pos")))
			return
		}
		var text *string
		err = c.pool.QueryRow(r.Context(), c.q["EventRaw"], pos, metadata).Scan(&text)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			c.fail(w, r, http.StatusNotFound, fmt.Sprintf("No event at position %d.", pos))
			return
		case err != nil:
			c.cfg.Logger.Error("console: raw event", "path", r.URL.Path, telemetry.Err(err))
			c.fail(w, r, http.StatusInternalServerError, "The database did not answer as expected: "+err.Error())
			return
		case text == nil:
			c.fail(w, r, http.StatusNotFound, fmt.Sprintf("The event at position %d has no metadata.", pos))
			return
		}
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("Content-Length", strconv.Itoa(len(*text)))
		_, _ = io.WriteString(w, *text)
	}
}

// --- subscribers

type failureRow struct {
	Partition int
	EventID   uuid.UUID
	Position  int64
	Attempts  int
	First     time.Time
	Last      time.Time
	Error     string
	NextRetry *time.Time
	Stream    string
	Type      string
}

type subscriberData struct {
	Name string
	// Kind is the kind the runner recorded for the subscriber
	// (Partition.KindText: "-" when unknown).
	Kind       string
	Head       int64
	Partitions []Partition
	Failures   []failureRow
	DLQ        map[string]int64
}

func (c *Console) subscriber(r *http.Request) (*view, error) {
	ctx := r.Context()
	name := r.PathValue("name")
	d := subscriberData{Name: name}
	err := c.readOnlyTx(ctx, func(tx pgx.Tx) error {
		var err error
		if d.Head, _, err = c.head(ctx, tx); err != nil {
			return err
		}
		if d.Partitions, err = c.partitions(ctx, tx, d.Head, &name); err != nil {
			return err
		}
		if len(d.Partitions) == 0 {
			return notFound("No subscriber %q: it has no checkpoint.", name)
		}
		d.Kind = d.Partitions[0].KindText()
		counts, err := c.deadLetterCounts(ctx, tx)
		if err != nil {
			return err
		}
		d.DLQ = counts[name]
		rows, err := tx.Query(ctx, c.q["Failures"], name, 200)
		if err != nil {
			return errors.Wrap(err, "read the failures")
		}
		var f failureRow
		_, err = pgx.ForEachRow(rows, []any{&f.Partition, &f.EventID, &f.Position, &f.Attempts, &f.First, &f.Last, &f.Error, &f.NextRetry, &f.Stream, &f.Type}, func() error {
			d.Failures = append(d.Failures, f)
			f = failureRow{} // the pointer must not be shared
			return nil
		})
		return errors.Wrap(err, "read the failures")
	})
	if err != nil {
		return nil, err
	}
	return &view{Tpl: "subscriber", Title: "Subscriber " + name, Nav: "overview", Data: d}, nil
}

// --- dead letters

type deadLettersData struct {
	Filter deadletter.Filter
	Page   deadletter.Page
	// Query is the page's filter as an encoded query string, for links:
	// template.URL, so that html/template does not escape its = and & again.
	Query template.URL
	// Older and Newer are the cursors of the next pages (before= the last
	// ID of this one, after= its first), 0 for none. A cursor, not an
	// offset: dead letters added or purged between two pages shifted an
	// offset, so that "Older" listed some of this page again or passed
	// over some.
	Older    int64
	Newer    int64
	Statuses []deadletter.Status
}

func (c *Console) deadLetters(r *http.Request) (*view, error) {
	q := r.URL.Query()
	f := deadletter.Filter{Subscriber: q.Get("subscriber"), Stream: q.Get("stream"), Type: q.Get("type"),
		Status: deadletter.Status(q.Get("status")), Limit: 100}
	if f.Status != "" && !f.Status.Valid() {
		return nil, badRequest("status=%q: want open, retry, resolved or skipped", f.Status)
	}
	for name, dst := range map[string]*int64{"before": &f.Before, "after": &f.After} {
		if v := q.Get(name); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 1 {
				return nil, badRequest("%s=%q: want a dead letter ID", name, v)
			}
			*dst = n
		}
	}
	if f.Before != 0 && f.After != 0 {
		return nil, badRequest("before and after: want one of them")
	}
	page, err := c.dlq.List(r.Context(), f)
	if err == nil && f.After != 0 && !page.More && len(page.DeadLetters) < f.Limit {
		// Newer ones than this short page there are none: it is the first
		// page, shown whole.
		f.After = 0
		page, err = c.dlq.List(r.Context(), f)
	}
	if err != nil {
		return nil, err
	}
	keep := url.Values{}
	for _, k := range []string{"subscriber", "stream", "type", "status"} {
		if v := q.Get(k); v != "" {
			keep.Set(k, v)
		}
	}
	d := deadLettersData{Filter: f, Page: page, Query: template.URL(keep.Encode()),
		Statuses: []deadletter.Status{deadletter.StatusOpen, deadletter.StatusRetry, deadletter.StatusResolved, deadletter.StatusSkipped}}
	if n := len(page.DeadLetters); n > 0 {
		// More is about the direction the page was asked for: older ones
		// for the first page and a before= page, newer ones for an after=
		// page. The other way there are some if the page came from there.
		if page.More || f.After != 0 {
			d.Older = page.DeadLetters[n-1].ID
		}
		if (f.After != 0 && page.More) || f.Before != 0 {
			d.Newer = page.DeadLetters[0].ID
		}
	}
	return &view{Tpl: "deadletters", Title: "Dead letters", Nav: "dlq", Data: d}, nil
}

type deadLetterData struct {
	DL     deadletter.DeadLetter
	Event  *Event
	Pretty string
}

func (c *Console) deadLetter(r *http.Request) (*view, error) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id < 1 {
		return nil, badRequest("%q: want a dead letter ID from 1", r.PathValue("id"))
	}
	dl, err := c.dlq.Get(r.Context(), id)
	if errors.Is(err, deadletter.ErrNotFound) {
		return nil, notFound("No dead letter %d.", id)
	}
	if err != nil {
		return nil, err
	}
	d := deadLetterData{DL: dl}
	evs, err := scanEvents(c.pool.Query(r.Context(), c.q["EventByID"], dl.EventID, eventChars))
	if err != nil {
		return nil, err
	}
	if len(evs) == 1 {
		d.Event = &evs[0]
		d.Pretty = pretty(evs[0].Data)
	}
	return &view{Tpl: "deadletter", Title: "Dead letter " + strconv.FormatInt(id, 10), Nav: "dlq", Data: d}, nil
}

// --- scheduler, instances, audit

type schedulerData struct {
	Tasks  []scheduler.TaskInfo
	Timers []scheduler.TimerInfo
	Stats  scheduler.TimerStats
	Now    time.Time
}

func (c *Console) scheduler(r *http.Request) (*view, error) {
	ctx := r.Context()
	var d schedulerData
	var err error
	if d.Tasks, err = c.sched.Tasks(ctx); err != nil {
		return nil, err
	}
	if d.Timers, err = c.sched.Timers(ctx, 200); err != nil {
		return nil, err
	}
	if d.Stats, err = c.sched.TimerStats(ctx); err != nil {
		return nil, err
	}
	d.Now = c.cfg.Now()
	return &view{Tpl: "scheduler", Title: "Scheduler", Nav: "scheduler", Data: d}, nil
}

type instancesData struct {
	Instances []Instance
	// Standbys are the physical standbys streaming from the server (a
	// runner's read replica), shown when there are any; StandbysHidden
	// reports that PostgreSQL hides their details from the console's role
	// (it lacks pg_read_all_stats).
	Standbys       []Standby
	StandbysHidden bool
}

func (c *Console) instances(r *http.Request) (*view, error) {
	var d instancesData
	err := c.readOnlyTx(r.Context(), func(tx pgx.Tx) error {
		var err error
		if d.Instances, err = c.instanceList(r.Context(), tx); err != nil {
			return err
		}
		d.Standbys, err = standby.List(r.Context(), tx)
		return err
	})
	if err != nil {
		return nil, err
	}
	for _, sb := range d.Standbys {
		d.StandbysHidden = d.StandbysHidden || sb.Hidden()
	}
	return &view{Tpl: "instances", Title: "Instances", Nav: "instances", Data: d}, nil
}

// AuditEntry is one row of the audit log.
type AuditEntry struct {
	ID     int64
	At     time.Time
	Actor  string
	DBRole string
	Action string
	Target string
	Detail string
}

func (c *Console) audit(r *http.Request) (*view, error) {
	before := int64(1<<63 - 1)
	if v := r.URL.Query().Get("before"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 1 {
			return nil, badRequest("before=%q: want an entry ID", v)
		}
		before = n
	}
	rows, err := c.pool.Query(r.Context(), c.q["AuditList"], before, 100)
	if err != nil {
		return nil, errors.Wrap(err, "read the audit log")
	}
	var out []AuditEntry
	var e AuditEntry
	_, err = pgx.ForEachRow(rows, []any{&e.ID, &e.At, &e.Actor, &e.DBRole, &e.Action, &e.Target, &e.Detail}, func() error {
		out = append(out, e)
		return nil
	})
	if err != nil {
		return nil, errors.Wrap(err, "read the audit log")
	}
	d := struct {
		Entries []AuditEntry
		Older   int64
	}{Entries: out}
	if len(out) == 100 {
		d.Older = out[len(out)-1].ID
	}
	return &view{Tpl: "audit", Title: "Audit log", Nav: "audit", Data: d}, nil
}

func (c *Console) loginForm(*http.Request) (*view, error) {
	return &view{Tpl: "login", Title: "Sign in", Data: nil}, nil
}
