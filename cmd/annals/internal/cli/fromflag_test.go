package cli

import (
	"strings"
	"testing"
)

// A malformed --from of read and tail is a usage error in the CLI's words,
// as archive --before's is, not strconv's ('invalid argument "abc" for
// "--from" flag: strconv.ParseInt: parsing "abc": invalid syntax'). No
// database is reached: the flags are checked first.
func TestMalformedFromIsAUsageError(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"read", "--from", "abc"}, {"tail", "--from", "1x"}, {"read", "some-stream", "--from", "1.5"}} {
		r := annals(t, "postgres://127.0.0.1:1/nowhere?connect_timeout=1", args...)
		want := "annals: --from " + `"` + args[len(args)-1] + `"` + ": want a non-negative integer\n"
		if r.code != ExitUsage || !strings.HasPrefix(r.stderr, want) || strings.Contains(r.stderr, "strconv") {
			t.Errorf("%v: exit %d, stderr %q; want exit %d and %q", args, r.code, r.stderr, ExitUsage, want)
		}
	}
}
