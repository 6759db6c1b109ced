package cli

import (
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// A malformed value of an integer (or boolean) flag is a usage error in the CLI's words,
// as a malformed position is, not strconv's ('invalid argument "abc" for
// "--before" flag: strconv.ParseInt: parsing "abc": invalid syntax'). No
// database is reached: the flags are checked first.
func TestMalformedIntegerFlagIsAUsageError(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"dlq", "list", "--before", "abc"}, `--before "abc": want a dead letter ID (1 or more)`},
		{[]string{"dlq", "list", "--before", "99999999999999999999"}, `--before "99999999999999999999": want a dead letter ID (1 or more)`},
		{[]string{"dlq", "list", "--limit", "ten"}, `--limit "ten": want 1 to 1000`},
		{[]string{"dlq", "list", "--offset", "1.5"}, `--offset "1.5": want 0 or more`},
		{[]string{"read", "--limit", "1x"}, `--limit "1x": want an integer`},
		{[]string{"checkpoint", "get", "balances", "--partition", "p1"}, `--partition "p1": want an integer`},
		{[]string{"dlq", "purge", "--include-unresolved=maybe"}, `--include-unresolved "maybe": want true or false`},
		{[]string{"bench", "--writers", "1,x"}, `--writers "1,x": want integers separated by commas`},
		{[]string{"archive", "--before", "3", "--batch", "99999999999999999999"}, `--batch "99999999999999999999": want an integer, this one is out of range`},
	} {
		r := annals(t, "postgres://127.0.0.1:1/nowhere?connect_timeout=1", c.args...)
		want := "annals: " + c.want + "\n"
		if r.code != ExitUsage || !strings.HasPrefix(r.stderr, want) {
			t.Errorf("%q: exit %d, stderr %q; want exit %d and %q", c.args, r.code, r.stderr, ExitUsage, want)
		}
	}

	// Every integer flag of every command, found by walking the tree.
	e := &env{stdin: strings.NewReader(""), stdout: io.Discard, stderr: io.Discard, getenv: func(string) string { return "" }}
	checked := 0
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		path := strings.Fields(c.CommandPath())[1:]
		c.LocalFlags().VisitAll(func(f *pflag.Flag) {
			if !strings.HasPrefix(f.Value.Type(), "int") && !strings.HasPrefix(f.Value.Type(), "uint") {
				return
			}
			checked++
			args := append(slices.Clone(path), "--"+f.Name, "abc")
			r := annals(t, "postgres://127.0.0.1:1/nowhere?connect_timeout=1", args...)
			if r.code != ExitUsage || !strings.HasPrefix(r.stderr, "annals: --"+f.Name+` "abc": want `) || strings.Contains(r.stderr, "strconv") {
				t.Errorf("%q: exit %d, stderr %q; want exit %d and a usage error in the CLI's words", args, r.code, r.stderr, ExitUsage)
			}
		})
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(e.rootCommand())
	if checked < 20 {
		t.Fatalf("checked %d integer flags, want at least 20", checked)
	}
}
