package console

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// followBatch is the most events one poll of a live follow sends.
const followBatch = 200

// followEvent is the JSON of one server-sent event.
type followEvent struct {
	Position   int64     `json:"position"`
	ID         string    `json:"id"`
	Stream     string    `json:"stream"`
	Version    int64     `json:"version"`
	Type       string    `json:"type"`
	RecordedAt time.Time `json:"recorded_at"`
	// Data is the event's data, or its first listChars characters when
	// DataBytes (its whole size) is more: /events/{position}/data serves it
	// whole.
	Data      string `json:"data"`
	DataBytes int64  `json:"data_bytes"`
}

// follow streams the log after ?after= (filtered by ?type= globs) as
// server-sent events: one "append" message per event, its position as the
// message ID (a reconnecting browser sends it back as Last-Event-ID and
// resumes after it). It polls every FollowInterval, reading at most
// followBatch events at a time, until the client goes away. A poll that
// fails (the database is down) sends a "failure" message with the error,
// and the first poll that succeeds after failures a "recovered" message.
func (c *Console) follow(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	re, err := typeRegex(q.Get("type"))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	after := int64(-1)
	for _, v := range []string{r.Header.Get("Last-Event-ID"), q.Get("after")} {
		if v == "" {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			http.Error(w, fmt.Sprintf("after=%q: want a position (0 or more)", v), http.StatusBadRequest)
			return
		}
		after = n
		break
	}
	ctx := r.Context()
	if after < 0 {
		if after, _, err = c.head(ctx, c.pool); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
	}
	fl, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	fmt.Fprintf(w, "retry: 2000\n: following after %d\n\n", after)
	fl.Flush()
	tick := time.NewTicker(c.cfg.FollowInterval)
	defer tick.Stop()
	lastWrite := time.Now()
	failing := false
	for {
		// Read the head first, then the events up to it: positions are
		// commit order, so every event at or below a visible head is visible,
		// and a follow whose filter matches nothing moves on to the head
		// instead of scanning the same positions at every poll.
		head, _, err := c.head(ctx, c.pool)
		var evs []Event
		if err == nil && head > after {
			evs, err = scanEvents(c.pool.Query(ctx, c.q["LogEvents"], after, followBatch, re, head, listChars))
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			fmt.Fprintf(w, "event: failure\ndata: %s\n\n", jsonString(err.Error()))
			fl.Flush()
			failing, lastWrite = true, time.Now()
		} else if failing {
			fmt.Fprintf(w, "event: recovered\ndata: {\"after\": %d}\n\n", after)
			fl.Flush()
			failing, lastWrite = false, time.Now()
		}
		for _, e := range evs {
			b, _ := json.Marshal(followEvent{Position: e.Position, ID: e.ID.String(), Stream: e.Stream, Version: e.Version,
				Type: e.Type, RecordedAt: e.RecordedAt.UTC(), Data: e.Data, DataBytes: e.DataBytes})
			fmt.Fprintf(w, "id: %d\nevent: append\ndata: %s\n\n", e.Position, b)
			after = e.Position
		}
		if len(evs) == followBatch {
			fl.Flush()
			continue // more waiting: read on at once
		}
		if err == nil && head > after {
			after = head // nothing more matches up to the head
		}
		if len(evs) > 0 {
			fl.Flush()
			lastWrite = time.Now()
		} else if time.Since(lastWrite) > 15*time.Second {
			// A comment line now and then keeps proxies from closing an idle stream.
			fmt.Fprint(w, ":\n\n")
			fl.Flush()
			lastWrite = time.Now()
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
