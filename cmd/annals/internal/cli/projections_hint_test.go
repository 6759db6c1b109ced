package cli

import (
	"strings"
	"testing"
)

// The generic CLI cannot rebuild a projection (that runs the service's
// code), but it is where a user looks first: `annals projection rebuild
// NAME` says where the commands are instead of "unknown command".
func TestProjectionsCommandSaysWhereTheyAre(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"projection", "rebuild", "loans"},
		{"projections", "rebuild", "loans", "--yes"},
		{"projections", "list"},
		{"projections", "--help"},
		{"rebuild", "loans"},
	} {
		r := annals(t, "", args...)
		if r.code != ExitUsage || r.stdout != "" || !strings.Contains(r.stderr, "projectioncmd.New") || !strings.Contains(r.stderr, "client.Rebuild") ||
			!strings.HasSuffix(r.stderr, "Run 'annals --help' for usage.\n") {
			t.Errorf("annals %q: %+v; want exit %d pointing to projectioncmd and client.Rebuild", args, r, ExitUsage)
		}
	}
}
