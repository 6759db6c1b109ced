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
	cmd := &cobra.Command{
		Use:   "append STREAM TYPE JSON",
		Short: "Append one event to a stream",
		Long: `Append one event of type TYPE with data JSON (an object or array) to STREAM.
--expected-version is any (default), no-stream (or 0), stream-exists (or -1), or a version N >= 1.
Prints the event's ID, position and stream version.`,
		Example: `  annals append order-42 order.placed '{"total": 100}' --expected-version no-stream`,
		Args:    cobra.ExactArgs(3),
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
				if err := json.Unmarshal([]byte(metadata), &ev.Metadata); err != nil {
					return usagef("--metadata is not a JSON object: %v", err)
				}
			}
			if eventID != "" {
				if ev.ID, err = uuid.Parse(eventID); err != nil {
					return usagef("--event-id is not a UUID: %v", err)
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
			a := res.Events[0]
			_, err = fmt.Fprintf(e.stdout, "appended %s to %s at version %d, position %d\n", a.ID, res.StreamID, a.StreamVersion, a.GlobalSequence)
			return err
		},
	}
	cmd.Flags().StringVar(&expected, "expected-version", "any", "any, no-stream (0), stream-exists (-1) or a version N")
	cmd.Flags().StringVar(&metadata, "metadata", "", "metadata as a JSON object")
	cmd.Flags().StringVar(&eventID, "event-id", "", "event ID (UUID); re-appending the same event with it is a no-op (default: generated)")
	return cmd
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
