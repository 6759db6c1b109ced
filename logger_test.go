package annals_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals"
	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

type lgPoison struct{ N int }

// A client with no Logger tells of a dead letter on slog.Default(), where a
// program's logs go: a failure is not silent by default. Not parallel: it
// sets slog's default.
func TestDeadLetterLoggedByDefault(t *testing.T) {
	var buf annalstest.LogBuffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, nil)))
	t.Cleanup(func() { slog.SetDefault(old) })

	db := annalstest.NewDB(t, nil)
	reg := eventstore.NewRegistry()
	eventstore.MustRegister[lgPoison](reg, "lg.poison")
	c, err := annals.New(db.Pool, &annals.Config{Registry: reg, Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	o := projection.NewObserver("lg.observer", reg)
	projection.Observe(o, func(_ context.Context, e eventstore.Envelope[lgPoison]) error {
		return annals.Permanent(errors.Newf("poison %d", e.Data.N))
	})
	if err := annals.AddObserver(c, o, nil); err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop(context.WithoutCancel(ctx)) })
	if _, err := c.Append(ctx, "lg-1", eventstore.NoStream, eventstore.NewEvent(lgPoison{N: 7})); err != nil {
		t.Fatal(err)
	}
	annalstest.WaitFor(t, 30*time.Second, func() bool {
		got := buf.String()
		return strings.Contains(got, "level=WARN") && strings.Contains(got, "dead-lettering") && strings.Contains(got, "poison 7")
	})
	if got := buf.String(); strings.Contains(got, "level=INFO") || strings.Contains(got, "level=DEBUG") {
		t.Errorf("information or debug records on the default logger:\n%s", got)
	}
}
