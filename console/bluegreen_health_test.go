package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/console"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

// counter counts events in table counted; a blue/green read model.
type counter struct{}

func (counter) Name() string { return "counted" }
func (counter) Handle(ctx context.Context, tx pgx.Tx, _ eventstore.Event) error {
	_, err := tx.Exec(ctx, `UPDATE counted SET n = n + 1`)
	return err
}
func (counter) SetupVersion() int { return 1 }
func (counter) Setup(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, `CREATE TABLE counted (n int NOT NULL); INSERT INTO counted VALUES (0)`)
	return err
}

// TestRunnerHealthBlueGreen: a blue/green projection runs as its live
// generation's subscriber ("counted#g1"), whose checkpoint it keeps; the
// registered name has none. RunnerHealth checked the registered name and
// answered 503 ("no checkpoint yet") for ever, however well the live
// generation was led. It checks the live generation, named in the report.
func TestRunnerHealthBlueGreen(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	store, err := eventstore.New(db.Pool, &eventstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Append(ctx, "s-1", eventstore.NoStream, eventstore.EventData{Type: "ticked", Data: map[string]int{"n": 1}}); err != nil {
		t.Fatal(err)
	}
	runner, err := projection.NewRunner(db.Pool, &projection.Config{Schema: db.Schema, PollInterval: 50 * time.Millisecond, HeartbeatInterval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := runner.Register(counter{}, &projection.Options{BlueGreen: &projection.BlueGreen{Version: 1, CheckInterval: 100 * time.Millisecond}}); err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- runner.Run(rctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	h := console.RunnerHealth(runner, db.Pool, nil)
	var rep console.HealthReport
	var code int
	annalstest.WaitForErr(t, 30*time.Second, func() error {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		code = rec.Code
		rep = console.HealthReport{}
		if err := json.Unmarshal(rec.Body.Bytes(), &rep); err != nil {
			return err
		}
		if code != http.StatusOK {
			return fmt.Errorf("readiness %d: %s", code, rec.Body.String())
		}
		return nil
	})
	if len(rep.Partitions) != 1 || rep.Partitions[0].Subscriber != "counted#g1" || rep.Partitions[0].ReadModel != "counted" || rep.Partitions[0].Leader == "" {
		t.Fatalf("report %+v: want the live generation counted#g1 of read model counted, led", rep)
	}
}
