package projectioncmd

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

// slow is counting whose handler sleeps in SQL on event 50, after saying so.
type slow struct {
	counting
	reached chan struct{}
}

func (p slow) Handle(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	if strings.Contains(string(e.Data), `"i":50}`) || strings.Contains(string(e.Data), `"i": 50}`) {
		select {
		case p.reached <- struct{}{}:
		default:
		}
		if _, err := tx.Exec(ctx, `SELECT pg_sleep(30)`); err != nil {
			return err
		}
	}
	return p.counting.Handle(ctx, tx, e)
}

// Interrupting a rebuild (Ctrl-C: the command's context ends) fails it with
// an error that says it was interrupted, matching context.Canceled. It
// said "advisorylock: key …: advisory lock lost: … timeout: context
// already done: context canceled", the lock's loss being only the
// consequence of the cancelled statement.
func TestRebuildInterrupted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r, err := projection.NewRunner(b.db.Pool, &projection.Config{InstanceID: "inst-3", PollInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	reached := make(chan struct{}, 1)
	if err := r.Register(slow{counting{"slow"}, reached}, nil); err != nil {
		t.Fatal(err)
	}
	b.fill(t, 100)
	c := newCommands(r, b.db.Pool, &Config{ProgressInterval: time.Nanosecond})
	c.terminal = func(any) bool { return false }
	cmd := c.root()
	var out, errOut bytes.Buffer
	cmd.SetArgs([]string{"rebuild", "slow", "--yes"})
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() {
		select {
		case <-reached:
			cancel()
		case <-ctx.Done():
		}
	}()
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()
	select {
	case err = <-done:
	case <-time.After(25 * time.Second):
		t.Fatal("the interrupted rebuild did not return")
	}
	if err == nil || !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted rebuild = %v, want an error matching context.Canceled", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "interrupted") || strings.Contains(msg, "advisory lock lost") {
		t.Fatalf("interrupted rebuild says %q, want it to say it was interrupted", msg)
	}
}
