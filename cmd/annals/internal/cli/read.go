package cli

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/google/uuid"
	"github.com/spf13/cobra"

	"github.com/annals-dev/annals/eventstore"
)

func (e *env) readCommand() *cobra.Command {
	var from, limit int64
	var format *string
	cmd := &cobra.Command{
		Use:   "read [STREAM]",
		Short: "Read events from the log or one stream",
		Long: `Without STREAM, read the whole log from position --from; with STREAM, read that
stream from version --from. --output jsonl writes one JSON object per event with the
keys global_sequence, event_id, stream_id, stream_version, event_type, data, metadata,
recorded_at; --output json writes them as one JSON array.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
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
			w := newEventWriter(e.stdout, *format)
			var n int64
			for ev, err := range events {
				if errors.Is(err, eventstore.ErrStreamNotFound) {
					return notFoundError{err}
				}
				if err != nil {
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
	cmd.Flags().Int64Var(&from, "from", 0, "first position (log) or version (stream) to read")
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
	tw     *tabwriter.Writer
	header bool // the table header or the array's opening bracket is written
}

func newEventWriter(w io.Writer, format string) *eventWriter {
	ew := &eventWriter{format: format, out: bufio.NewWriter(w)}
	if format == outputText {
		ew.tw = tabwriter.NewWriter(ew.out, 0, 4, 2, ' ', 0)
	}
	return ew
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
		fmt.Fprintln(w.tw, "POSITION\tSTREAM\tVERSION\tTYPE\tRECORDED\tDATA")
		w.header = true
	}
	data := strings.ReplaceAll(string(e.Data), "\n", " ")
	if len(data) > 80 {
		data = data[:77] + "..."
	}
	_, err := fmt.Fprintf(w.tw, "%d\t%s\t%d\t%s\t%s\t%s\n", e.GlobalSequence, e.StreamID, e.StreamVersion, e.Type,
		e.RecordedAt.UTC().Format("2006-01-02 15:04:05.000Z"), data)
	return err
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
	if w.tw != nil {
		if err := w.tw.Flush(); err != nil {
			return err
		}
	}
	return w.out.Flush()
}
