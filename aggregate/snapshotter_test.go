package aggregate_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/annals-dev/annals/aggregate"
	"github.com/annals-dev/annals/annalstest"
)

// tally keeps its state in an unexported field, which encoding/json would
// leave out of a snapshot: it encodes it itself (aggregate.Snapshotter).
type tally struct {
	aggregate.Base
	sum int
	// binary makes MarshalSnapshot return bytes that are not JSON.
	binary bool
}

func (a *tally) Apply(event any) error {
	switch e := event.(type) {
	case Opened:
	case Deposited:
		a.sum += e.Amount
	default:
		return aggregate.ErrUnhandledEvent
	}
	return nil
}

func (a *tally) MarshalSnapshot() ([]byte, error) {
	if a.binary {
		return []byte{0x01, byte(a.sum)}, nil
	}
	return json.Marshal(map[string]int{"sum": a.sum})
}

func (a *tally) UnmarshalSnapshot(data []byte) error {
	var s struct{ Sum int }
	if err := json.Unmarshal(data, &s); err != nil {
		return err
	}
	a.sum = s.Sum
	return nil
}

// A Snapshotter's state is written and read back through its own methods,
// and must be JSON (the snapshots table stores json): other bytes fail the
// snapshot write, which is logged, the save standing, and loads replay.
func TestSnapshotter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, binary := range []bool{false, true} {
		name := map[bool]string{false: "JSON", true: "NotJSON"}[binary]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			l := &loads{}
			logs := &annalstest.LogBuffer{}
			r, err := aggregate.NewRepository(b.store, "tally", func() *tally { return &tally{binary: binary} }, &aggregate.Config{
				Snapshots: &aggregate.SnapshotConfig{Every: 3},
				OnLoad:    l.hook,
				Logger:    slog.New(slog.NewTextHandler(logs, nil)),
			})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := r.Create(ctx, "1", func(a *tally) error {
				if err := aggregate.Record(a, Opened{Owner: "ada"}); err != nil {
					return err
				}
				if err := aggregate.Record(a, Deposited{Amount: 4}); err != nil {
					return err
				}
				return aggregate.Record(a, Deposited{Amount: 5})
			}); err != nil {
				t.Fatalf("the save failed with the snapshot write: %v", err)
			}
			var rows int
			if err := b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM annals.snapshots WHERE aggregate_type = 'tally'`).Scan(&rows); err != nil {
				t.Fatal(err)
			}
			a, err := r.Load(ctx, "1")
			if err != nil {
				t.Fatal(err)
			}
			if a.sum != 9 || a.Version() != 3 {
				t.Fatalf("loaded sum %d at version %d, want 9 at 3", a.sum, a.Version())
			}
			s := l.last(t)
			if !binary {
				if rows != 1 || s.SnapshotVersion != 3 || s.EventsRead != 0 {
					t.Fatalf("%d snapshot row(s), load %+v; want 1 row and a load from the snapshot at 3", rows, s)
				}
				if strings.Contains(logs.String(), "snapshot") {
					t.Fatalf("unexpected snapshot warnings:\n%s", logs)
				}
				return
			}
			if rows != 0 || s.SnapshotVersion != 0 || s.EventsRead != 3 {
				t.Fatalf("%d snapshot row(s), load %+v; want none and a replay of 3 events", rows, s)
			}
			if !strings.Contains(logs.String(), "writing a snapshot failed") || !strings.Contains(logs.String(), "not valid JSON") {
				t.Fatalf("the failed write was not logged as not JSON:\n%s", logs)
			}
		})
	}
}
