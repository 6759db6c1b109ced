package cli

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/annals-dev/annals/deadletter"
)

func (e *env) dlqCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dlq",
		Short: "Inspect dead letters, retry or skip them, purge old ones",
		Long: `A dead letter is an event a subscriber could not process (reason failed: its retry
policy was spent or the error was permanent), or an event held back behind one in the
same stream (reason parked). While a stream has open dead letters it is parked for
that subscriber partition; other streams flow on. A subscriber under the Stop policy
halts until an operator acts.

Statuses: open (waits for an operator), retry (released: the live runner re-delivers
it in position order, then marks it resolved, or open again if it fails), resolved,
skipped (given up: never delivered; also a dead letter whose event no longer exists in
the log, which nothing can deliver).

'retry ID' releases the dead letter's whole stream (every open dead letter of the same
subscriber partition and stream) and resumes a stopped subscriber partition; 'skip ID'
gives up on one event and releases the rest of its stream. Both are idempotent and say
what they changed. Bad arguments exit 2, an unknown ID or subscriber exits 3; both
change nothing.`,
		Annotations: map[string]string{groupAnnotation: ""},
		RunE: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usagef("want a subcommand: list, show, retry, skip or purge")
			}
			return usagef("unknown subcommand %q: want list, show, retry, skip or purge", args[0])
		},
	}
	cmd.AddCommand(e.dlqListCommand(), e.dlqShowCommand(), e.dlqRetryCommand(), e.dlqSkipCommand(), e.dlqPurgeCommand())
	return cmd
}

func (e *env) dlqListCommand() *cobra.Command {
	var f deadletter.Filter
	var status string
	var format *string
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List dead letters, newest first",
		Long: `List dead letters, newest first (by ID, the order they were created in), --limit at
a time (1 to 1000, default 100). The filters match exactly.

Page with --before: the next page is the same command with --before the ID of the
last dead letter listed (the text output ends with it when there are more). It lists
nothing again and misses nothing still there, however many dead letters are added or
purged meanwhile. --offset (pass over that many first) still works, but
shifts when dead letters are added or purged between pages, listing some again or
passing over others; it does not go with --before.

--output jsonl writes one JSON object per dead letter (--output json: one array) with
the dead_letters table's column names as keys (id, subscriber_id, partition, event_id,
global_sequence, stream_id, event_type, reason, error, error_detail, attempts, status,
first_failed_at, last_failed_at, created_at, updated_at; the failure times are null
for a parked event). A script pages the same way: it asks again with --before the id
of the last object until the array (or the output) is empty.`,
		Example: `  annals dlq list --subscriber orders-view --status open
  annals dlq list --subscriber orders-view --status open --before 4711
  annals dlq list --stream order-42 --output jsonl | jq .error`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if status != "" && !deadletter.Status(status).Valid() {
				return usagef("--status %q: want open, retry, resolved or skipped", status)
			}
			if f.Limit < 1 || f.Limit > deadletter.MaxLimit {
				return usagef("--limit %d: want 1 to %d", f.Limit, deadletter.MaxLimit)
			}
			if f.Offset < 0 {
				return usagef("--offset %d: want 0 or more", f.Offset)
			}
			if cmd.Flags().Changed("before") && f.Before < 1 {
				return usagef("--before %d: want a dead letter ID (1 or more)", f.Before)
			}
			if f.Before != 0 && f.Offset != 0 {
				return usagef("--before and --offset: page with --before alone")
			}
			for _, name := range []string{"subscriber", "stream", "type"} {
				if v, _ := cmd.Flags().GetString(name); cmd.Flags().Changed(name) && v == "" {
					return usagef("--%s must not be empty", name)
				}
			}
			f.Status = deadletter.Status(status)
			return e.withDeadLetters(cmd.Context(), func(_ *pgxpool.Pool, store *deadletter.Store) error {
				page, err := store.List(cmd.Context(), f)
				if err != nil {
					return err
				}
				if *format != outputText {
					return writeDeadLettersJSON(e.stdout, *format, page.DeadLetters)
				}
				return writeDeadLettersTable(e.stdout, page, f)
			})
		},
	}
	cmd.Flags().StringVar(&f.Subscriber, "subscriber", "", "only this subscriber's dead letters")
	cmd.Flags().StringVar(&f.Stream, "stream", "", "only dead letters of this stream")
	cmd.Flags().StringVar(&f.Type, "type", "", "only dead letters of this event type")
	cmd.Flags().StringVar(&status, "status", "", "only dead letters with this status: open, retry, resolved or skipped")
	cmd.Flags().IntVar(&f.Limit, "limit", deadletter.DefaultLimit, "how many to list, 1 to 1000")
	cmd.Flags().Int64Var(&f.Before, "before", 0, "only dead letters with IDs below `ID`: the last ID of the page before")
	cmd.Flags().IntVar(&f.Offset, "offset", 0, "how many matching dead letters to pass over first (shifts when dead letters come or go: prefer --before)")
	setWant(cmd, "limit", fmt.Sprintf("1 to %d", deadletter.MaxLimit))
	setWant(cmd, "before", "a dead letter ID (1 or more)")
	setWant(cmd, "offset", "0 or more")
	format = addOutputFlag(cmd, true, outputText, outputJSON, outputJSONL)
	return cmd
}

func (e *env) dlqShowCommand() *cobra.Command {
	var format *string
	cmd := &cobra.Command{
		Use:   "show ID",
		Short: "Show every field of a dead letter, with its error and stack trace",
		Long: `Show every field of a dead letter, with its error and stack trace. --output json
writes one object with the keys of 'dlq list --output jsonl'.`,
		Annotations: map[string]string{negativeArgAnnotation: badDeadLetterID},
		Args:        cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseDeadLetterID(args[0])
			if err != nil {
				return err
			}
			return e.withDeadLetters(cmd.Context(), func(_ *pgxpool.Pool, store *deadletter.Store) error {
				d, err := store.Get(cmd.Context(), id)
				if err != nil {
					return deadLetterError(err, id)
				}
				if *format == outputJSON {
					return writeJSON(e.stdout, deadLetterJSON(d))
				}
				return writeDeadLetter(e.stdout, d)
			})
		},
	}
	format = addOutputFlag(cmd, false, outputText, outputJSON)
	return cmd
}

func (e *env) dlqRetryCommand() *cobra.Command {
	var subscriber string
	var all bool
	var format *string
	cmd := &cobra.Command{
		Use:   "retry ID | --subscriber SUBSCRIBER --all",
		Short: "Release a parked stream (or all of a subscriber's) for re-delivery",
		Long: `retry ID marks for re-delivery every open dead letter of the stream of dead letter ID
(for the same subscriber partition), so that the subscriber's live runner re-delivers
them in position order, and resumes the subscriber partition if the Stop policy halted
it. A dead letter that is not open changes nothing ("nothing to do").

retry --subscriber SUBSCRIBER --all does so for every open dead letter of the subscriber,
in all its partitions, and resumes every stopped partition of it.

A dead letter whose event no longer exists in the log (a hard delete and scavenge, a
truncation or retention removed it) cannot be re-delivered: it is skipped instead, and
said so (--output json lists it under "gone", and under "skipped").`,
		Example: `  annals dlq retry 12
  annals dlq retry --subscriber orders-view --all`,
		Annotations: map[string]string{negativeArgAnnotation: badDeadLetterID},
		Args:        cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			bySubscriber := cmd.Flags().Changed("subscriber")
			switch {
			case len(args) == 1 && (bySubscriber || all):
				return usagef("give either an ID or --subscriber SUBSCRIBER --all, not both")
			case len(args) == 0 && !bySubscriber && !all:
				return usagef("want a dead letter ID, or --subscriber SUBSCRIBER --all")
			case len(args) == 0 && !all:
				return usagef("--subscriber needs --all (retry every open dead letter of the subscriber)")
			case len(args) == 0 && !bySubscriber:
				return usagef("--all needs --subscriber SUBSCRIBER")
			case len(args) == 0 && subscriber == "":
				return usagef("--subscriber must not be empty")
			}
			var id int64
			if len(args) == 1 {
				var err error
				if id, err = parseDeadLetterID(args[0]); err != nil {
					return err
				}
			}
			return e.withDeadLetters(cmd.Context(), func(pool *pgxpool.Pool, store *deadletter.Store) error {
				ctx := cmd.Context()
				if id == 0 {
					var c deadletter.Change
					err := e.audited(ctx, pool, "dlq.retry_all", func(tx pgx.Tx) (string, any, error) {
						var err error
						c, err = store.RetryAllTx(ctx, tx, subscriber)
						return "subscriber " + subscriber, map[string]any{"retried": c.Retried, "gone": c.Gone, "resumed": len(c.Resumed)}, err
					})
					if errors.Is(err, deadletter.ErrNotFound) {
						return notFoundf("unknown subscriber %q: it has no dead letters and no checkpoint", subscriber)
					}
					if err != nil {
						return err
					}
					if *format == outputJSON {
						return writeJSON(e.stdout, changeJSON(c))
					}
					if !c.Changed() {
						_, err = fmt.Fprintf(e.stdout, "nothing to do: subscriber %s has no open dead letters and is not stopped\n", subscriber)
						return err
					}
					return writeChange(e.stdout, c)
				}
				var c deadletter.Change
				err := e.audited(ctx, pool, "dlq.retry", func(tx pgx.Tx) (string, any, error) {
					var err error
					c, err = store.RetryTx(ctx, tx, id)
					return deadLetterTarget(id), changeDetail(id, c), err
				})
				if err != nil {
					return deadLetterError(err, id)
				}
				if *format == outputJSON {
					return writeJSON(e.stdout, changeJSON(c))
				}
				if !c.Changed() {
					_, err = fmt.Fprintf(e.stdout, "nothing to do: dead letter %d %s\n", id, statusPhrase(c.Was))
					return err
				}
				return writeChange(e.stdout, c)
			})
		},
	}
	format = addOutputFlag(cmd, false, outputText, outputJSON)
	cmd.Flags().StringVar(&subscriber, "subscriber", "", "with --all: the subscriber whose open dead letters to retry")
	cmd.Flags().BoolVar(&all, "all", false, "retry every open dead letter of --subscriber")
	return cmd
}

func (e *env) dlqSkipCommand() *cobra.Command {
	var format *string
	cmd := &cobra.Command{
		Use:   "skip ID",
		Short: "Give up on a dead letter and let the rest of its stream flow on",
		Long: `skip ID marks dead letter ID skipped: its event is never delivered to the subscriber.
The other open dead letters of its stream (for the same subscriber partition) are
marked for re-delivery, in position order, and the subscriber partition is resumed if
the Stop policy halted it. A dead letter already resolved or skipped changes nothing.`,
		Annotations: map[string]string{negativeArgAnnotation: badDeadLetterID},
		Args:        cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseDeadLetterID(args[0])
			if err != nil {
				return err
			}
			return e.withDeadLetters(cmd.Context(), func(pool *pgxpool.Pool, store *deadletter.Store) error {
				ctx := cmd.Context()
				var c deadletter.Change
				err := e.audited(ctx, pool, "dlq.skip", func(tx pgx.Tx) (string, any, error) {
					var err error
					c, err = store.SkipTx(ctx, tx, id)
					return deadLetterTarget(id), changeDetail(id, c), err
				})
				if err != nil {
					return deadLetterError(err, id)
				}
				if *format == outputJSON {
					return writeJSON(e.stdout, changeJSON(c))
				}
				if !c.Changed() {
					_, err = fmt.Fprintf(e.stdout, "nothing to do: dead letter %d %s\n", id, statusPhrase(c.Was))
					return err
				}
				return writeChange(e.stdout, c)
			})
		},
	}
	format = addOutputFlag(cmd, false, outputText, outputJSON)
	return cmd
}

func (e *env) dlqPurgeCommand() *cobra.Command {
	var olderThan string
	var includeUnresolved, yes bool
	var format *string
	cmd := &cobra.Command{
		Use:   "purge --older-than AGE",
		Short: "Delete resolved and skipped dead letters older than AGE",
		Long: `Delete the resolved and skipped dead letters last updated at least AGE ago, by the
database server's clock (the cutoff is inclusive). AGE is a Go duration (90m, 12h)
with an optional leading number of days: 30d, 1d12h, 0s (everything up to now).

--include-unresolved deletes open and retry dead letters too: their events are then
never re-delivered, like a skip that leaves no trace, and their streams flow on. That
cannot be undone: on a terminal it asks for confirmation; otherwise pass --yes (as
checkpoint set, forget and stream delete --hard need it). Purging only resolved and
skipped dead letters, which are settled, asks nothing.`,
		Example: `  annals dlq purge --older-than 30d
  annals dlq purge --older-than 90d --include-unresolved --yes`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !cmd.Flags().Changed("older-than") {
				return usagef("want --older-than AGE (e.g. 30d)")
			}
			age, err := parseAge(olderThan)
			if err != nil {
				return usageError{errors.Wrapf(err, "--older-than %q", olderThan)}
			}
			if includeUnresolved && !yes {
				effect := fmt.Sprintf("delete the open and retry dead letters (and the resolved and skipped ones) last updated at least %s ago: their events are never re-delivered",
					olderThan)
				if err := e.confirmed(effect, "no dead letter was purged"); err != nil {
					return err
				}
			}
			q, err := e.queries()
			if err != nil {
				return err
			}
			return e.withDeadLetters(cmd.Context(), func(pool *pgxpool.Pool, store *deadletter.Store) error {
				var head int64
				var now time.Time
				if err := pool.QueryRow(cmd.Context(), q["Head"]).Scan(&head, &now); err != nil {
					return errors.Wrap(err, "read the server's clock")
				}
				cutoff := now.Add(-age).UTC()
				var n int64
				err := e.audited(cmd.Context(), pool, "dlq.purge", func(tx pgx.Tx) (string, any, error) {
					var err error
					n, err = store.PurgeTx(cmd.Context(), tx, cutoff, includeUnresolved)
					return "dead_letters", map[string]any{"older_than": age.String(), "cutoff": cutoff,
						"include_unresolved": includeUnresolved, "deleted": n}, err
				})
				if err != nil {
					return err
				}
				if *format == outputJSON {
					return writeJSON(e.stdout, PurgeJSON{Purged: n, Cutoff: cutoff, IncludeUnresolved: includeUnresolved})
				}
				which := "resolved or skipped"
				if includeUnresolved {
					which = "of any status"
				}
				if n == 0 {
					_, err = fmt.Fprintf(e.stdout, "nothing to do: no dead letters %s last updated at or before %s\n", which, cutoff.Format(preciseLayout))
					return err
				}
				_, err = fmt.Fprintf(e.stdout, "purged %s %s last updated at or before %s\n", countNoun(int(n), "dead letter"), which, cutoff.Format(preciseLayout))
				return err
			})
		},
	}
	format = addOutputFlag(cmd, false, outputText, outputJSON)
	cmd.Flags().StringVar(&olderThan, "older-than", "", "delete dead letters last updated at least this long ago (30d, 12h, 1d12h)")
	cmd.Flags().BoolVar(&includeUnresolved, "include-unresolved", false, "delete open and retry dead letters too (asks, or needs --yes)")
	cmd.Flags().BoolVar(&yes, "yes", false, "do not ask for confirmation of --include-unresolved")
	return cmd
}

// withDeadLetters connects and runs fn with a deadletter.Store on the
// --schema; a schema without the dead_letters table is reported with a hint.
func (e *env) withDeadLetters(ctx context.Context, fn func(*pgxpool.Pool, *deadletter.Store) error) error {
	if err := e.validSchema(); err != nil {
		return err
	}
	pool, err := e.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	store, err := deadletter.New(pool, &deadletter.Config{Schema: e.schema})
	if err != nil {
		return err
	}
	err = fn(pool, store)
	if errors.Is(err, deadletter.ErrInvalid) {
		return usageError{err}
	}
	return err
}

// deadLetterTarget and changeDetail are the audit entry of a retry or skip
// of dead letter id, as the console writes them.
func deadLetterTarget(id int64) string { return "dead_letters " + strconv.FormatInt(id, 10) }

func changeDetail(id int64, c deadletter.Change) map[string]any {
	return map[string]any{"ids": []int64{id}, "retried": c.Retried, "skipped": c.Skipped, "gone": c.Gone, "resumed": len(c.Resumed)}
}

// badDeadLetterID is the message for an ID argument that is no dead-letter
// ID (a format of the argument); also the negativeArgAnnotation of the
// commands that take one, whose negative ID the flag parser takes for a
// shorthand flag.
const badDeadLetterID = "ID %q: want a dead letter ID, a positive integer (see 'annals dlq list')"

// parseDeadLetterID parses a dead-letter ID argument.
func parseDeadLetterID(s string) (int64, error) {
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id < 1 {
		return 0, usagef(badDeadLetterID, s)
	}
	return id, nil
}

// deadLetterError makes an unknown ID a not-found error (exit 3): the
// operator named something that does not exist, and nothing changed.
func deadLetterError(err error, id int64) error {
	if errors.Is(err, deadletter.ErrNotFound) {
		return notFoundf("no dead letter %d (see 'annals dlq list')", id)
	}
	return err
}

// parseAge parses --older-than: deadletter.ParseAge.
func parseAge(s string) (time.Duration, error) { return deadletter.ParseAge(s) }

// JSONLDeadLetter is one line of `annals dlq list --output jsonl` (and the
// object of `annals dlq show --output json`); its keys
// are the dead_letters table's column names.
type JSONLDeadLetter struct {
	ID             int64     `json:"id"`
	SubscriberID   string    `json:"subscriber_id"`
	Partition      int       `json:"partition"`
	EventID        uuid.UUID `json:"event_id"`
	GlobalSequence int64     `json:"global_sequence"`
	StreamID       string    `json:"stream_id"`
	EventType      string    `json:"event_type"`
	Reason         string    `json:"reason"`
	Error          string    `json:"error"`
	ErrorDetail    string    `json:"error_detail"`
	Attempts       int       `json:"attempts"`
	Status         string    `json:"status"`
	// FirstFailedAt and LastFailedAt are null for a parked event.
	FirstFailedAt *time.Time `json:"first_failed_at"`
	LastFailedAt  *time.Time `json:"last_failed_at"`
	CreatedAt     time.Time  `json:"created_at"`
	UpdatedAt     time.Time  `json:"updated_at"`
}

func optionalTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

func deadLetterJSON(d deadletter.DeadLetter) JSONLDeadLetter {
	return JSONLDeadLetter{
		ID: d.ID, SubscriberID: d.Subscriber, Partition: d.Partition, EventID: d.EventID,
		GlobalSequence: d.GlobalSequence, StreamID: d.StreamID, EventType: d.EventType,
		Reason: string(d.Reason), Error: d.Error, ErrorDetail: d.ErrorDetail, Attempts: d.Attempts,
		Status: string(d.Status), FirstFailedAt: optionalTime(d.FirstFailedAt), LastFailedAt: optionalTime(d.LastFailedAt),
		CreatedAt: d.CreatedAt.UTC(), UpdatedAt: d.UpdatedAt.UTC(),
	}
}

// writeDeadLettersJSON writes dead letters as a JSON array or JSON lines.
func writeDeadLettersJSON(w io.Writer, format string, dls []deadletter.DeadLetter) error {
	out := make([]JSONLDeadLetter, len(dls))
	for i, d := range dls {
		out[i] = deadLetterJSON(d)
	}
	return writeJSONList(w, format, out)
}

// errorColumnWidth bounds the ERROR column of the list table.
const errorColumnWidth = 60

func writeDeadLettersTable(w io.Writer, page deadletter.Page, f deadletter.Filter) error {
	if len(page.DeadLetters) == 0 {
		var err error
		if f.Subscriber == "" && f.Stream == "" && f.Type == "" && f.Status == "" && f.Offset == 0 && f.Before == 0 {
			_, err = fmt.Fprintln(w, "No dead letters.")
		} else {
			_, err = fmt.Fprintln(w, "No dead letters match.")
		}
		return err
	}
	var tbl textTable
	tbl.add("ID", "SUBSCRIBER", "PARTITION", "STREAM", "POSITION", "TYPE", "REASON", "STATUS", "ATTEMPTS", "CREATED", "ERROR")
	for _, d := range page.DeadLetters {
		tbl.add(strconv.FormatInt(d.ID, 10), textCell(d.Subscriber), strconv.Itoa(d.Partition), textCell(d.StreamID),
			strconv.FormatInt(d.GlobalSequence, 10), textCell(d.EventType), string(d.Reason), string(d.Status),
			strconv.Itoa(d.Attempts), d.CreatedAt.UTC().Format(timeLayout), summary(d.Error))
	}
	if page.More {
		// The cursor, not --offset + the page: dead letters added or purged
		// before the next page would shift an offset (it listed some again).
		hint := fmt.Sprintf("(more: --before %d)", page.DeadLetters[len(page.DeadLetters)-1].ID)
		if f.Offset != 0 {
			hint = fmt.Sprintf("(more: --before %d instead of --offset)", page.DeadLetters[len(page.DeadLetters)-1].ID)
		}
		tbl.add(hint)
	}
	return tbl.write(w)
}

// summary is the first line of an error, shortened for a table cell: to
// errorColumnWidth display columns (it counted runes: a CJK message took
// twice the room), its tabs made spaces (a tab started another cell).
func summary(s string) string {
	s, _, cut := strings.Cut(s, "\n")
	s = textCell(s)
	if displayWidth(s) > errorColumnWidth {
		return truncateWidth(s, errorColumnWidth, "…")
	}
	if cut {
		return s + " …"
	}
	if s == "" {
		return "-"
	}
	return s
}

// preciseLayout shows the microseconds PostgreSQL keeps.
const preciseLayout = "2006-01-02 15:04:05.000000Z"

func writeDeadLetter(w io.Writer, d deadletter.DeadLetter) error {
	at := func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return t.UTC().Format(preciseLayout)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, f := range [][2]string{
		{"id", strconv.FormatInt(d.ID, 10)},
		{"subscriber_id", d.Subscriber},
		{"partition", strconv.Itoa(d.Partition)},
		{"event_id", d.EventID.String()},
		{"global_sequence", strconv.FormatInt(d.GlobalSequence, 10)},
		{"stream_id", d.StreamID},
		{"event_type", d.EventType},
		{"reason", string(d.Reason)},
		{"status", string(d.Status)},
		{"attempts", strconv.Itoa(d.Attempts)},
		{"first_failed_at", at(d.FirstFailedAt)},
		{"last_failed_at", at(d.LastFailedAt)},
		{"created_at", at(d.CreatedAt)},
		{"updated_at", at(d.UpdatedAt)},
	} {
		fmt.Fprintf(tw, "%s\t%s\n", f[0], f[1])
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	block := func(name, text string) {
		fmt.Fprintf(w, "\n%s:\n", name)
		if text == "" {
			fmt.Fprintln(w, "(none)")
			return
		}
		fmt.Fprint(w, text)
		if !strings.HasSuffix(text, "\n") {
			fmt.Fprintln(w)
		}
	}
	block("error", d.Error)
	block("error_detail", d.ErrorDetail)
	return nil
}

// statusPhrase says why a dead letter with status s needs nothing done.
func statusPhrase(s deadletter.Status) string {
	switch s {
	case deadletter.StatusRetry:
		return "is already marked for retry"
	case deadletter.StatusSkipped:
		return "is already skipped"
	}
	return "is " + string(s)
}

// maxListedIDs bounds how many IDs a change message lists.
const maxListedIDs = 20

// ChangeJSON is what `annals dlq retry` and `dlq skip` print with
// --output json: what changed (Changed false: nothing to do).
type ChangeJSON struct {
	Changed bool `json:"changed"`
	// Was is the status the named dead letter had before ("" for retry --all).
	Was     string  `json:"was,omitempty"`
	Retried []int64 `json:"retried"`
	Skipped []int64 `json:"skipped"`
	// Gone are the dead letters of Skipped that were skipped instead of
	// marked for retry: their events no longer exist in the log.
	Gone    []int64    `json:"gone"`
	Resumed []HaltJSON `json:"resumed"`
}

// HaltJSON is a subscriber partition whose Stop-policy halt was cleared.
type HaltJSON struct {
	Subscriber string     `json:"subscriber"`
	Partition  int        `json:"partition"`
	Since      *time.Time `json:"since,omitempty"`
	Reason     string     `json:"reason"`
}

// PurgeJSON is what `annals dlq purge --output json` prints.
type PurgeJSON struct {
	Purged            int64     `json:"purged"`
	Cutoff            time.Time `json:"cutoff"`
	IncludeUnresolved bool      `json:"include_unresolved"`
}

func changeJSON(c deadletter.Change) ChangeJSON {
	out := ChangeJSON{Changed: c.Changed(), Was: string(c.Was), Retried: c.Retried, Skipped: c.Skipped, Gone: c.Gone, Resumed: []HaltJSON{}}
	if out.Retried == nil {
		out.Retried = []int64{}
	}
	if out.Skipped == nil {
		out.Skipped = []int64{}
	}
	if out.Gone == nil {
		out.Gone = []int64{}
	}
	for _, h := range c.Resumed {
		hj := HaltJSON{Subscriber: h.Subscriber, Partition: h.Partition, Reason: h.Reason}
		if !h.Since.IsZero() {
			since := h.Since.UTC()
			hj.Since = &since
		}
		out.Resumed = append(out.Resumed, hj)
	}
	return out
}

// writeChange prints what Retry, RetryAll or Skip changed, a line each.
func writeChange(w io.Writer, c deadletter.Change) error {
	var b strings.Builder
	gone := map[int64]bool{}
	for _, id := range c.Gone {
		gone[id] = true
	}
	for _, id := range c.Skipped {
		if !gone[id] {
			fmt.Fprintf(&b, "skipped dead letter %d\n", id)
		}
	}
	const removed = "(removed by a hard delete and scavenge, a truncation or retention)"
	switch {
	case len(c.Gone) == 1:
		fmt.Fprintf(&b, "skipped dead letter %d: its event no longer exists in the log %s, so it cannot be retried\n", c.Gone[0], removed)
	case len(c.Gone) > 1:
		fmt.Fprintf(&b, "skipped %d dead letters whose events no longer exist in the log %s, so they cannot be retried: %s\n",
			len(c.Gone), removed, idList(c.Gone))
	}
	if len(c.Retried) > 0 {
		fmt.Fprintf(&b, "marked %s for retry: %s\n", countNoun(len(c.Retried), "dead letter"), idList(c.Retried))
	}
	for _, h := range c.Resumed {
		since := ""
		if !h.Since.IsZero() {
			since = " since " + h.Since.UTC().Format(timeLayout)
		}
		reason := strings.ReplaceAll(strings.TrimSpace(h.Reason), "\n", " ")
		fmt.Fprintf(&b, "resumed %s/%d (stopped%s: %s)\n", h.Subscriber, h.Partition, since, reason)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// countNoun is n and noun, in the plural unless n is 1: "1 step", "0 steps".
func countNoun[N ~int | ~int64](n N, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// idList joins IDs with commas, eliding all but the first maxListedIDs.
func idList(ids []int64) string {
	parts := make([]string, 0, min(len(ids), maxListedIDs)+1)
	for i, id := range ids {
		if i == maxListedIDs {
			parts = append(parts, fmt.Sprintf("… (%d more)", len(ids)-maxListedIDs))
			break
		}
		parts = append(parts, strconv.FormatInt(id, 10))
	}
	return strings.Join(parts, ", ")
}
