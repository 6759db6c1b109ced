package cli

import (
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// A wrong number of arguments is a usage error (exit 2) in the CLI's words,
// naming the arguments the command takes, not cobra's ("accepts 2 arg(s),
// received 1"), for every command however deep (archive status, under a
// command that is not a group, exited 1). No database is reached.
func TestWrongArgumentCountIsAUsageError(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"grant", "reader"}, "annals: grant takes writer|reader|runner|operator ROLE, got 1 argument\nRun 'annals grant --help' for usage.\n"},
		{[]string{"append", "s", "t"}, "annals: append takes STREAM TYPE JSON, got 2 arguments\n"},
		{[]string{"read", "a", "b"}, "annals: read takes [STREAM], got 2 arguments\n"},
		{[]string{"checkpoint", "get"}, "annals: checkpoint get takes SUBSCRIBER, got 0 arguments\n"},
		{[]string{"dlq", "retry", "1", "2"}, "annals: dlq retry takes ID | --subscriber SUBSCRIBER --all, got 2 arguments\n"},
		{[]string{"archive", "status", "extra"}, `annals: unknown command "extra" for "annals archive status"` + "\n"},
	} {
		r := annals(t, "postgres://127.0.0.1:1/nowhere?connect_timeout=1", c.args...)
		if r.code != ExitUsage || !strings.HasPrefix(r.stderr, c.want) {
			t.Errorf("annals %q: exit %d, stderr %q; want exit %d and %q", c.args, r.code, r.stderr, ExitUsage, c.want)
		}
	}

	// Every command, found by walking the tree, given more arguments than
	// any takes. dev runs its arguments as a command (and starts a cluster
	// first); the completion scripts and help are cobra's own.
	e := &env{stdin: strings.NewReader(""), stdout: io.Discard, stderr: io.Discard, getenv: func(string) string { return "" }}
	checked := 0
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		path := strings.Fields(c.CommandPath())[1:]
		if len(path) > 0 && (path[0] == "dev" || path[0] == "completion" || path[0] == "help" || c.Hidden) {
			return
		}
		if len(path) > 0 && c.Runnable() {
			checked++
			args := append(slices.Clone(path), "x1", "x2", "x3", "x4", "x5")
			r := annals(t, "postgres://127.0.0.1:1/nowhere?connect_timeout=1", args...)
			if r.code != ExitUsage || !strings.HasPrefix(r.stderr, "annals: ") || strings.Contains(r.stderr, "arg(s)") {
				t.Errorf("annals %q: exit %d, stderr %q; want exit %d and a usage error in the CLI's words", args, r.code, r.stderr, ExitUsage)
			}
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(e.rootCommand())
	if checked < 35 {
		t.Fatalf("checked %d commands, want at least 35", checked)
	}
}

// A negative dead-letter ID is refused as any other malformed ID is, not
// as an unknown shorthand flag ("unknown shorthand flag: '1' in -1").
func TestNegativeDeadLetterID(t *testing.T) {
	t.Parallel()
	for _, cmd := range []string{"show", "retry", "skip"} {
		r := annals(t, "postgres://127.0.0.1:1/nowhere?connect_timeout=1", "dlq", cmd, "-1")
		want := `annals: ID "-1": want a dead letter ID, a positive integer (see 'annals dlq list')` + "\n"
		if r.code != ExitUsage || !strings.HasPrefix(r.stderr, want) {
			t.Errorf("dlq %s -1: exit %d, stderr %q; want exit %d and %q", cmd, r.code, r.stderr, ExitUsage, want)
		}
	}
}
