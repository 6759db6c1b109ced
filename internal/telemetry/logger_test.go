package telemetry

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// DefaultLogger sends warnings and errors to slog.Default() as it is at each
// record (a SetDefault after the logger was made included), with the
// attributes and groups added to the logger, and drops information and
// debug records. Not parallel: it sets slog's default.
func TestDefaultLogger(t *testing.T) {
	old := slog.Default()
	t.Cleanup(func() { slog.SetDefault(old) })

	l := DefaultLogger().With("subscriber", "s1").WithGroup("g")
	var buf bytes.Buffer
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	l.Debug("debug line")
	l.Info("info line")
	l.Warn("dead-lettering an event", "position", 7)
	l.Error("error line")
	got := buf.String()
	for _, want := range []string{`level=WARN msg="dead-lettering an event" subscriber=s1 g.position=7`, `level=ERROR msg="error line" subscriber=s1`} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "debug line") || strings.Contains(got, "info line") {
		t.Errorf("information or debug records passed:\n%s", got)
	}

	// A default that wants errors only gets errors only.
	buf.Reset()
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelError})))
	l.Warn("a warning")
	if buf.Len() != 0 {
		t.Errorf("a warning passed a default that wants errors only: %s", buf.String())
	}
	// A logger made before the sibling's With is not changed by it.
	base := DefaultLogger()
	_ = base.With("x", 1)
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, nil)))
	base.Warn("plain")
	if got := buf.String(); strings.Contains(got, "x=1") || !strings.Contains(got, `msg=plain`) {
		t.Errorf("base logger's record = %q", got)
	}
}
