package cli

import (
	"fmt"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/spf13/cobra"

	"github.com/annals-dev/annals/eventstore"
)

// streamCommand is `annals stream`: the life cycle of one stream (delete,
// info; retention settings in stream_set.go).
func (e *env) streamCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "stream",
		Short: "Delete a stream, set its retention or show its state",
		Long: `'delete' deletes a stream (soft, or --hard: a tombstone) by appending a
"$stream.deleted" event to it; 'set' sets its retention (maximum age, maximum count,
truncate-before); 'info' shows its version, state and retention.`,
		Annotations: map[string]string{groupAnnotation: ""},
		RunE: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usagef("want a subcommand: delete, set or info")
			}
			return usagef("unknown subcommand %q: want delete, set or info", args[0])
		},
	}
	cmd.AddCommand(e.streamDeleteCommand(), e.streamInfoCommand(), e.streamSetCommand())
	return cmd
}

func (e *env) streamDeleteCommand() *cobra.Command {
	var hard, yes bool
	var expected, reason string
	var format *string
	cmd := &cobra.Command{
		Use:   "delete STREAM",
		Short: "Delete a stream (soft; --hard: forever)",
		Long: `Delete STREAM by appending a "$stream.deleted" event to it (projections and sagas
see it). After a soft delete, reads of the stream fail until an append that expects
exactly the deletion event's version recreates it; after --hard no append is ever
accepted again. The events stay in the log until 'annals scavenge' removes them, and
with them the stream's aggregate snapshots (all of them after --hard; after a soft
delete, those up to the deletion).

--hard cannot be undone: on a terminal it asks for confirmation, otherwise pass --yes.
A stream that does not exist exits 3. One already deleted exits 1, as reading it does:
it exists ('annals stream info' shows it), and only an append expecting its version
recreates it, not one that expects no stream. A soft-deleted stream can be deleted
again with --hard.
--output json writes {"stream_id", "stream_version", "global_sequence", "event_id", "hard"}.`,
		Example: `  annals stream delete order-42
  annals stream delete customer-7 --hard --yes --reason "erasure request 2026-118"`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			stream := args[0]
			if stream == "" {
				return usagef("STREAM must not be empty")
			}
			exp, err := parseExpected(expected)
			if err != nil {
				return err
			}
			if hard && !yes {
				if err := e.confirmed(fmt.Sprintf("hard-delete stream %q: it can never be appended to again", stream), "the stream is unchanged"); err != nil {
					return err
				}
			}
			pool, err := e.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			store, err := eventstore.New(pool, &eventstore.Config{Schema: e.schema, GroupCommit: eventstore.GroupCommit{Disabled: true}})
			if err != nil {
				return err
			}
			opts := &eventstore.DeleteOptions{Hard: hard}
			if reason != "" {
				opts.Metadata.Extra = map[string]any{"reason": reason}
			}
			res, err := store.DeleteStream(cmd.Context(), stream, exp, opts)
			if errors.Is(err, eventstore.ErrStreamNotFound) {
				// A *WrongExpectedVersionError with actual version 0.
				return notFoundf("stream %q does not exist: there is nothing to delete", stream)
			}
			// The library says what a deleted stream means for an append.
			var deleted *eventstore.StreamDeletedError
			if errors.As(err, &deleted) && deleted.Hard {
				return errors.Newf("stream %q is already hard-deleted (version %d): there is nothing to delete", stream, deleted.Version)
			}
			if errors.As(err, &deleted) && !hard {
				return errors.Newf("stream %q is already deleted (version %d): there is nothing to delete (--hard makes it a tombstone)",
					stream, deleted.Version)
			}
			if err != nil {
				return err
			}
			ev := res.Events[0]
			if *format == outputJSON {
				return writeJSON(e.stdout, StreamDeleteJSON{StreamID: stream, StreamVersion: ev.StreamVersion,
					GlobalSequence: ev.GlobalSequence, EventID: ev.ID.String(), Hard: hard})
			}
			kind := "deleted"
			if hard {
				kind = "hard-deleted"
			}
			_, err = fmt.Fprintf(e.stdout, "%s %s at version %d, position %d\n", stream, kind, ev.StreamVersion, ev.GlobalSequence)
			return err
		},
	}
	cmd.Flags().BoolVar(&hard, "hard", false, "delete forever (a tombstone: no append is ever accepted again)")
	cmd.Flags().BoolVar(&yes, "yes", false, "do not ask for confirmation of --hard")
	cmd.Flags().StringVar(&expected, "expected-version", "any", "any, stream-exists (-1) or the stream's current version N")
	cmd.Flags().StringVar(&reason, "reason", "", "stored as metadata \"reason\" on the deletion event")
	format = addOutputFlag(cmd, false, outputText, outputJSON)
	return cmd
}

// StreamDeleteJSON is the output of `annals stream delete --output json`.
type StreamDeleteJSON struct {
	StreamID       string `json:"stream_id"`
	StreamVersion  int64  `json:"stream_version"`
	GlobalSequence int64  `json:"global_sequence"`
	EventID        string `json:"event_id"`
	Hard           bool   `json:"hard"`
}

func (e *env) streamInfoCommand() *cobra.Command {
	var format *string
	cmd := &cobra.Command{
		Use:   "info STREAM",
		Short: "Show a stream's version, state and retention",
		Long: `Show STREAM's version, state (live, deleted, hard-deleted), retention (maximum age
and count, the first version reads return) and when it was created and last appended
to. A stream that does not exist exits 3. --output json writes {"stream_id", "version",
"state", "truncate_before", "max_age_seconds", "max_count", "created_at", "updated_at"}
(max_age_seconds and max_count null when there is no limit).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			stream := args[0]
			if stream == "" {
				return usagef("STREAM must not be empty")
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
			info, err := store.StreamInfo(cmd.Context(), stream)
			if errors.Is(err, eventstore.ErrStreamNotFound) {
				return notFoundError{err}
			}
			if err != nil {
				return err
			}
			out := streamInfoJSON(info)
			if *format == outputJSON {
				return writeJSON(e.stdout, out)
			}
			_, err = fmt.Fprintf(e.stdout, "stream %s: version %d, %s, %s (created %s, updated %s)\n",
				stream, info.Version, info.State, retentionText(info),
				info.CreatedAt.UTC().Format(timeLayout), info.UpdatedAt.UTC().Format(timeLayout))
			return err
		},
	}
	format = addOutputFlag(cmd, false, outputText, outputJSON)
	return cmd
}

// StreamInfoJSON is the output of `annals stream info --output json`.
type StreamInfoJSON struct {
	StreamID       string    `json:"stream_id"`
	Version        int64     `json:"version"`
	State          string    `json:"state"`
	TruncateBefore int64     `json:"truncate_before"`
	MaxAgeSeconds  *float64  `json:"max_age_seconds"`
	MaxCount       *int64    `json:"max_count"`
	CreatedAt      time.Time `json:"created_at"`
	UpdatedAt      time.Time `json:"updated_at"`
}

func streamInfoJSON(i eventstore.StreamInfo) StreamInfoJSON {
	out := StreamInfoJSON{StreamID: i.StreamID, Version: i.Version, State: i.State.String(),
		TruncateBefore: i.TruncateBefore, CreatedAt: i.CreatedAt.UTC(), UpdatedAt: i.UpdatedAt.UTC()}
	if i.MaxAge > 0 {
		s := i.MaxAge.Seconds()
		out.MaxAgeSeconds = &s
	}
	if i.MaxCount > 0 {
		out.MaxCount = &i.MaxCount
	}
	return out
}
