package cli

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/google/uuid"
	"github.com/spf13/cobra"

	"github.com/annals-dev/annals/eventstore"
)

func (e *env) readCommand() *cobra.Command {
	var (
		limit    int64
		fromFlag *positionFlag
	)
	var format *string
	cmd := &cobra.Command{
		Use:   "read [STREAM]",
		Short: "Read events from the log or one stream",
		Long: `Without STREAM, read the whole log from position --from; with STREAM, read that
stream from version --from. --output jsonl writes one JSON object per event with the
keys global_sequence, event_id, stream_id, stream_version, event_type, data, metadata,
recorded_at; --output json writes them as one JSON array.

A STREAM that does not exist exits 3 (not found). A deleted one exits 1 and says so:
it exists ('annals stream info' shows it), and only an append expecting its version
recreates it, not one that expects no stream; 'annals stream delete' of it again exits
1 too.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			from := fromFlag.v
			if from < 0 {
				return usagef("--from must not be negative")
			}
			if limit < 0 {
				return usagef("--limit must not be negative (0 means no limit)")
			}
			pool, err := e.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			store, err := eventstore.New(pool, &eventstore.Config{Schema: e.schema})
			if err != nil {
				return err
			}
			var events func(func(eventstore.Event, error) bool)
			if len(args) == 1 {
				if args[0] == "" {
					return usagef("STREAM must not be empty")
				}
				events = store.ReadStream(cmd.Context(), args[0], from)
			} else {
				events = store.ReadAll(cmd.Context(), from)
			}
			w := newEventWriter(e.stdout, *format, false)
			var n int64
			for ev, err := range events {
				if errors.Is(err, eventstore.ErrStreamNotFound) {
					return notFoundError{err}
				}
				if err != nil {
					// The events read before it are printed, as
					// --output jsonl prints them as they come: the
					// table and the JSON array are written at the end.
					_ = w.finish()
					return err
				}
				if err := w.write(ev); err != nil {
					return err
				}
				if n++; limit > 0 && n >= limit {
					break
				}
			}
			return w.finish()
		},
	}
	fromFlag = addPositionFlag(cmd, "from", "first position (log) or version (stream) to read")
	cmd.Flags().Int64Var(&limit, "limit", 0, "stop after this many events (0: no limit)")
	format = addOutputFlag(cmd, true, outputText, outputJSON, outputJSONL)
	return cmd
}

// JSONLEvent is the shape of one line of --output jsonl (and of one element
// of --output json); its keys are the
// events table's column names.
type JSONLEvent struct {
	GlobalSequence int64           `json:"global_sequence"`
	EventID        uuid.UUID       `json:"event_id"`
	StreamID       string          `json:"stream_id"`
	StreamVersion  int64           `json:"stream_version"`
	EventType      string          `json:"event_type"`
	Data           json.RawMessage `json:"data"`
	Metadata       json.RawMessage `json:"metadata"`
	RecordedAt     time.Time       `json:"recorded_at"`
}

// eventWriter prints events as a table, a JSON array or JSON lines. JSON
// lines are flushed one by one so that a pipe sees each event at once.
type eventWriter struct {
	format string
	out    *bufio.Writer
	// table aligns the table of a command that ends (read, tail without
	// --follow): it holds the rows until the end, so each column is as wide
	// as its widest value.
	table *textTable
	// widths are the column widths of a followed tail's table, which prints
	// each row as it comes (a tabwriter flushed at each row aligned each
	// row on its own): eventColumns at first, a column widening for the
	// rows after one whose value does not fit.
	widths []int
	header bool // the table header or the array's opening bracket is written
}

// eventColumns are the first widths of a followed tail's columns but the
// last (POSITION, STREAM, VERSION, TYPE, RECORDED; DATA is not padded):
// room for ten-digit positions, most stream IDs and event types, and the
// time as printed.
var eventColumns = []int{10, 24, 7, 24, len(eventTimeLayout)}

// eventTimeLayout is how the table prints an event's time.
const eventTimeLayout = "2006-01-02 15:04:05.000Z"

// eventDataWidth is how many columns of an event's data the table shows.
const eventDataWidth = 80

// newEventWriter prints events to w in format; followed is true when rows
// are printed as they come and never all together (tail --follow).
func newEventWriter(w io.Writer, format string, followed bool) *eventWriter {
	ew := &eventWriter{format: format, out: bufio.NewWriter(w)}
	if format == outputText && followed {
		ew.widths = slices.Clone(eventColumns)
	} else if format == outputText {
		ew.table = &textTable{}
	}
	return ew
}

// row writes one row of the text table.
func (w *eventWriter) row(cells ...string) error {
	if w.table != nil {
		w.table.add(cells...)
		return nil
	}
	var b strings.Builder
	for i, c := range cells {
		b.WriteString(c)
		if i == len(cells)-1 {
			break
		}
		cw := displayWidth(c)
		w.widths[i] = max(w.widths[i], cw)
		b.WriteString(strings.Repeat(" ", w.widths[i]-cw+2))
	}
	b.WriteByte('\n')
	_, err := w.out.WriteString(b.String())
	return err
}

func (w *eventWriter) write(e eventstore.Event) error {
	meta := json.RawMessage("null")
	if !e.Metadata.IsZero() {
		b, err := json.Marshal(e.Metadata)
		if err != nil {
			return errors.Wrap(err, "encode metadata")
		}
		meta = b
	}
	if w.format != outputText {
		line, err := json.Marshal(JSONLEvent{
			GlobalSequence: e.GlobalSequence, EventID: e.ID, StreamID: e.StreamID,
			StreamVersion: e.StreamVersion, EventType: e.Type, Data: e.Data,
			Metadata: meta, RecordedAt: e.RecordedAt.UTC(),
		})
		if err != nil {
			return errors.Wrap(err, "encode event")
		}
		if w.format == outputJSON {
			sep := ",\n"
			if !w.header {
				sep, w.header = "[\n", true
			}
			w.out.WriteString(sep)
			_, err = w.out.Write(line)
			return err
		}
		w.out.Write(line)
		w.out.WriteByte('\n')
		return w.out.Flush()
	}
	if !w.header {
		if err := w.row("POSITION", "STREAM", "VERSION", "TYPE", "RECORDED", "DATA"); err != nil {
			return err
		}
		w.header = true
	}
	// Cut by display width between characters: cut by bytes, it split
	// a multi-byte character and printed half of it.
	// Compacted, as --output jsonl writes it: the records annals writes
	// itself ("$stream.truncated", built by PostgreSQL's json functions)
	// are stored as `{"stream_id" : "x", ...}`.
	data := string(e.Data)
	var compact bytes.Buffer
	if json.Compact(&compact, e.Data) == nil {
		data = compact.String()
	}
	data = truncateWidth(textCell(data), eventDataWidth, "...")
	return w.row(strconv.FormatInt(e.GlobalSequence, 10), textCell(e.StreamID), strconv.FormatInt(e.StreamVersion, 10),
		textCell(e.Type), e.RecordedAt.UTC().Format(eventTimeLayout), data)
}

// finish closes the JSON array, if any, and flushes.
func (w *eventWriter) finish() error {
	if w.format == outputJSON {
		if w.header {
			w.out.WriteString("\n]\n")
		} else {
			w.out.WriteString("[]\n")
		}
	}
	return w.flush()
}

func (w *eventWriter) flush() error {
	if w.table != nil {
		if err := w.table.write(w.out); err != nil {
			return err
		}
	}
	return w.out.Flush()
}
