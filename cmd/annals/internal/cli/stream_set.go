package cli

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/spf13/cobra"

	"github.com/annals-dev/annals/eventstore"
)

// parseMaxAge parses --max-age: a Go duration (90m, 12h) or a number of days
// (30d); 0 means no limit.
func parseMaxAge(s string) (time.Duration, error) {
	if d, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.ParseFloat(d, 64)
		// !(n >= 0 && …) also refuses NaN; a fraction of a day below 1s
		// is refused as the plain form's is.
		if err != nil || !(n >= 0 && n <= 106000) || (n > 0 && n*float64(24*time.Hour) < float64(time.Second)) {
			return 0, usagef("--max-age %q: want a duration of at least 1s such as 30d, 12h or 90m (0: no limit)", s)
		}
		return time.Duration(n * float64(24*time.Hour)), nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 || (d > 0 && d < time.Second) {
		return 0, usagef("--max-age %q: want a duration of at least 1s such as 30d, 12h or 90m (0: no limit)", s)
	}
	return d, nil
}

func (e *env) streamSetCommand() *cobra.Command {
	var maxAge string
	var maxCount, truncateBefore int64
	var format *string
	cmd := &cobra.Command{
		Use:   "set STREAM",
		Short: "Set a stream's retention: maximum age, maximum count, truncate-before",
		Long: `Set STREAM's retention. Stream reads (and aggregate loads) stop returning the events
it excludes at once; 'annals scavenge' removes their rows later, and subscribers that had
not processed them by then never will. Each change appends a "$stream.truncated" event
to the stream "$$STREAM". Flags left out keep their value. A call that sets only what is
set already changes nothing, appends nothing and says "unchanged" (exit 0).

  --max-age D          hide events older than D (30d, 12h, 90m; 0: no limit)
  --max-count N        keep only the newest N versions (0: no limit)
  --truncate-before V  hide versions below V (it can only grow: a V below the current
                       one exits 2; at most the stream's version + 1, which hides
                       every version)

A stream that does not exist exits 3. --output json writes what 'stream info' writes,
and "unchanged": true when the call changed nothing.`,
		Example: `  annals stream set audit-2026 --max-age 30d
  annals stream set sensor-7 --max-count 1000
  annals stream set order-42 --truncate-before 10`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			stream := args[0]
			if stream == "" {
				return usagef("STREAM must not be empty")
			}
			var c eventstore.RetentionChange
			if cmd.Flags().Changed("max-age") {
				d, err := parseMaxAge(maxAge)
				if err != nil {
					return err
				}
				c.MaxAge = &d
			}
			if cmd.Flags().Changed("max-count") {
				if maxCount < 0 {
					return usagef("--max-count must not be negative (0: no limit)")
				}
				c.MaxCount = &maxCount
			}
			if cmd.Flags().Changed("truncate-before") {
				if truncateBefore < 0 {
					return usagef("--truncate-before must not be negative")
				}
				c.TruncateBefore = &truncateBefore
			}
			if c == (eventstore.RetentionChange{}) {
				return usagef("nothing to set: give --max-age, --max-count or --truncate-before")
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
			if c.TruncateBefore != nil {
				// The SQL function caps V at version + 1 (every version
				// hidden): a V beyond that is a typo, not a wish to hide
				// versions that do not exist yet, and would hide the whole
				// stream (and its next scavenge delete it).
				cur, err := store.StreamInfo(cmd.Context(), stream)
				if errors.Is(err, eventstore.ErrStreamNotFound) {
					return notFoundError{err}
				}
				if err != nil {
					return err
				}
				if *c.TruncateBefore > cur.Version+1 {
					return usagef("--truncate-before %d: stream %s is at version %d, so at most %d (which hides every version)",
						*c.TruncateBefore, stream, cur.Version, cur.Version+1)
				}
				// The SQL function refuses it too since migration 0040
				// (and ignored it before): 0 and 1 both mean every version.
				if max(*c.TruncateBefore, 1) < max(cur.TruncateBefore, 1) {
					return usagef("--truncate-before %d: the truncate-before of stream %s is %d already, and it can only grow",
						*c.TruncateBefore, stream, cur.TruncateBefore)
				}
			}
			res, err := store.SetStreamRetention(cmd.Context(), stream, c)
			if errors.Is(err, eventstore.ErrStreamNotFound) {
				return notFoundError{err}
			}
			if err != nil {
				return err
			}
			if *format == outputJSON {
				return writeJSON(e.stdout, StreamSetJSON{StreamInfoJSON: streamInfoJSON(res.StreamInfo), Unchanged: res.Unchanged})
			}
			what := ""
			if res.Unchanged {
				what = "unchanged (nothing recorded): "
			}
			_, err = fmt.Fprintf(e.stdout, "stream %s: %s%s\n", stream, what, retentionText(res.StreamInfo))
			return err
		},
	}
	cmd.Flags().StringVar(&maxAge, "max-age", "", "hide events older than this (30d, 12h, 90m; 0: no limit)")
	cmd.Flags().Int64Var(&maxCount, "max-count", 0, "keep only the newest N versions (0: no limit)")
	cmd.Flags().Int64Var(&truncateBefore, "truncate-before", 0, "hide versions below V")
	format = addOutputFlag(cmd, false, outputText, outputJSON)
	return cmd
}

// StreamSetJSON is the output of `annals stream set --output json`: what
// `stream info` writes, and whether the call changed nothing (no
// "$stream.truncated" record was appended).
type StreamSetJSON struct {
	StreamInfoJSON
	Unchanged bool `json:"unchanged"`
}

// retentionText describes a stream's retention in one line.
func retentionText(i eventstore.StreamInfo) string {
	age, count := "none", "none"
	if i.MaxAge > 0 {
		age = i.MaxAge.String()
	}
	if i.MaxCount > 0 {
		count = strconv.FormatInt(i.MaxCount, 10)
	}
	// The first version reads return: past truncate-before and, with a
	// maximum count, the newest count versions (a maximum age may hide
	// more, by time).
	first := max(i.TruncateBefore, 1)
	if i.MaxCount > 0 {
		first = max(first, i.Version-i.MaxCount+1)
	}
	byAge := ""
	if i.MaxAge > 0 {
		byAge = " (those younger than the max age)"
	}
	return fmt.Sprintf("max age %s, max count %s, reads from version %d%s", age, count, first, byAge)
}
