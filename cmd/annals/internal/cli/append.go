package cli

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/google/uuid"
	"github.com/spf13/cobra"

	"github.com/annals-dev/annals/eventstore"
)

func (e *env) appendCommand() *cobra.Command {
	var expected, metadata, eventID string
	var format *string
	cmd := &cobra.Command{
		Use:   "append STREAM TYPE JSON",
		Short: "Append one event to a stream",
		Long: `Append one event of type TYPE with data JSON (an object or array) to STREAM.
--expected-version is any (default), no-stream (or 0), stream-exists (or -1), or a version N >= 1.
Prints the event's ID, position and stream version; --output json writes one object:
{"stream_id", "stream_version", "events": [{"event_id", "global_sequence", "stream_version"}]}.`,
		Example: `  annals append order-42 order.placed '{"total": 100}' --expected-version no-stream
  annals append order-42 order.shipped '{}' --output json`,
		Args: cobra.ExactArgs(3),
		RunE: func(cmd *cobra.Command, args []string) error {
			exp, err := parseExpected(expected)
			if err != nil {
				return err
			}
			if !json.Valid([]byte(args[2])) {
				return usagef("JSON argument is not valid JSON: %s", args[2])
			}
			ev := eventstore.EventData{Type: args[1], Data: json.RawMessage(args[2])}
			if args[1] == "" {
				return usagef("TYPE must not be empty")
			}
			if metadata != "" {
				// Said in the CLI's words: the decoder's name Go types
				// ("cannot unmarshal array into Go value of type
				// map[string]interface {}").
				if !json.Valid([]byte(metadata)) {
					return usagef("--metadata is not valid JSON: %s", metadata)
				}
				if err := json.Unmarshal([]byte(metadata), &ev.Metadata); err != nil {
					return usagef(`--metadata %s: want a JSON object, such as '{"correlation_id": "c-1"}'`, metadata)
				}
			}
			if eventID != "" {
				if ev.ID, err = uuid.Parse(eventID); err != nil {
					return usagef("--event-id %q: want a UUID (omit --event-id for a generated one)", eventID)
				}
				if ev.ID == uuid.Nil {
					return usagef("--event-id must not be the nil UUID (omit --event-id for a generated one)")
				}
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
			res, err := store.Append(cmd.Context(), args[0], exp, ev)
			if err != nil {
				return err
			}
			if *format == outputJSON {
				out := AppendJSON{StreamID: res.StreamID, StreamVersion: res.StreamVersion, Events: []AppendedEventJSON{}}
				for _, a := range res.Events {
					out.Events = append(out.Events, AppendedEventJSON{EventID: a.ID.String(), GlobalSequence: a.GlobalSequence, StreamVersion: a.StreamVersion})
				}
				return writeJSON(e.stdout, out)
			}
			a := res.Events[0]
			_, err = fmt.Fprintf(e.stdout, "appended %s to %s at version %d, position %d\n", a.ID, res.StreamID, a.StreamVersion, a.GlobalSequence)
			return err
		},
	}
	cmd.Flags().StringVar(&expected, "expected-version", "any", "any, no-stream (0), stream-exists (-1) or a version N")
	cmd.Flags().StringVar(&metadata, "metadata", "", "metadata as a JSON object")
	cmd.Flags().StringVar(&eventID, "event-id", "", "event ID (UUID); re-appending the same event with it is a no-op (default: generated)")
	format = addOutputFlag(cmd, false, outputText, outputJSON)
	return cmd
}

// AppendJSON is the output of `annals append --output json`.
type AppendJSON struct {
	StreamID string `json:"stream_id"`
	// StreamVersion is the stream's version after the append (for a
	// re-append of stored events, the stored version of the last one).
	StreamVersion int64 `json:"stream_version"`
	// Events are the appended events, in order.
	Events []AppendedEventJSON `json:"events"`
}

// AppendedEventJSON is one appended event in AppendJSON.
type AppendedEventJSON struct {
	EventID        string `json:"event_id"`
	GlobalSequence int64  `json:"global_sequence"`
	StreamVersion  int64  `json:"stream_version"`
}

func parseExpected(s string) (eventstore.ExpectedVersion, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "any", "":
		return eventstore.Any, nil
	case "no-stream", "0":
		return eventstore.NoStream, nil
	case "stream-exists", "-1":
		return eventstore.StreamExists, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 1 {
		return 0, usagef("--expected-version %q: want any, no-stream, stream-exists or a version >= 1", s)
	}
	return eventstore.Exact(n), nil
}
