package projectioncmd

import (
	"bytes"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/projection"
)

// mounted runs args under a root that silences nothing, as the package
// documentation mounts the tree, and returns what it printed (stdout and
// stderr together) and its error.
func mounted(t *testing.T, runner *projection.Runner, b *annalstest.DB, args ...string) (string, error) {
	t.Helper()
	root := &cobra.Command{Use: "myservice"}
	c := newCommands(runner, b.Pool, nil)
	c.terminal = func(any) bool { return false }
	root.AddCommand(c.root())
	var out bytes.Buffer
	root.SetArgs(args)
	root.SetIn(strings.NewReader(""))
	root.SetOut(&out)
	root.SetErr(&out)
	err := root.ExecuteContext(t.Context())
	return out.String(), err
}

// TestRuntimeErrorsPrintNoUsage: a command that fails while it runs (here:
// the runner's schema is not migrated) prints its error without the usage
// text, which would bury it; a mistake in the command line still prints the
// usage.
func TestRuntimeErrorsPrintNoUsage(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	r, err := projection.NewRunner(db.Pool, &projection.Config{Schema: "not_migrated"})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Register(counting{"balances"}, nil); err != nil {
		t.Fatal(err)
	}
	if err := r.Register(perStream{1}, &projection.Options{BlueGreen: &projection.BlueGreen{Version: 1}}); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"projections", "list"},
		{"projections", "status"},
		{"projections", "status", "balances", "-o", "json"},
		{"projections", "rebuild", "balances", "--yes"},
		{"projections", "rebuild", "counts", "--yes"},
		{"projections", "generations", "counts"},
		{"projections", "rollback", "counts", "--yes"},
	} {
		out, err := mounted(t, r, db, args...)
		if err == nil || !strings.Contains(out, "Error: ") || strings.Contains(out, "Usage:") {
			t.Errorf("%v: err %v; want the error without the usage, got:\n%s", args, err, out)
		}
	}
	for _, args := range [][]string{
		{"projections", "status", "a", "b"},
		{"projections", "rebuild"},
		{"projections", "list", "--nope"},
		{"projections", "bogus"},
	} {
		out, err := mounted(t, r, db, args...)
		if err == nil || !strings.Contains(out, "Error: ") || !strings.Contains(out, "Usage:") {
			t.Errorf("%v: err %v; want the error and the usage, got:\n%s", args, err, out)
		}
	}
}

// TestExamplesNameTheRealCommand: the examples in help and usage show the
// command as the operator types it, under the service's own root, not a
// made-up "myservice".
func TestExamplesNameTheRealCommand(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	r, err := projection.NewRunner(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	run := func(root *cobra.Command, args ...string) string {
		t.Helper()
		var out bytes.Buffer
		root.SetArgs(args)
		root.SetOut(&out)
		root.SetErr(&out)
		_ = root.ExecuteContext(t.Context())
		return out.String()
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"projections", "rebuild", "--help"}, "  bankd projections rebuild balances --yes --batch-size 10000\n"},
		{[]string{"help", "projections", "rebuild"}, "  bankd projections rebuild balances\n"},
		{[]string{"projections", "rollback", "-h"}, "  bankd projections rollback balances --yes"},
		{[]string{"projections", "rebuild"}, "  bankd projections rebuild balances\n"}, // the usage after a usage error
	} {
		root := &cobra.Command{Use: "bankd"}
		root.AddCommand(New(r, db.Pool, &Config{Use: "projections"}))
		if out := run(root, tc.args...); !strings.Contains(out, tc.want) || strings.Contains(out, "myservice") {
			t.Errorf("%v: want %q in:\n%s", tc.args, tc.want, out)
		}
	}
	// Not mounted, the projections command is the root.
	if out := run(New(r, db.Pool, nil), "rebuild", "--help"); !strings.Contains(out, "\n  projections rebuild balances\n") {
		t.Errorf("unmounted rebuild --help:\n%s", out)
	}
}
