package cli

import (
	"strings"
	"testing"
)

// A malformed UUID or metadata is refused in the CLI's words, not in the
// words of the uuid package ("invalid UUID length: 2") or of the JSON
// decoder ("cannot unmarshal array into Go value of type map[string]interface
// {}"), and so is an unknown grant kind (whose error ended in the migrations
// package's sentinel: "...: migrations: invalid role kind"). No database is
// reached: the arguments are checked first.
func TestMalformedUUIDAndMetadata(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"schedule", "cancel", "99"}, `annals: timer ID "99": want a UUID (see 'annals schedule list')`},
		{[]string{"append", "s", "t", "{}", "--event-id", "nope"}, `annals: --event-id "nope": want a UUID (omit --event-id for a generated one)`},
		{[]string{"append", "s", "t", "{}", "--metadata", "[1]"}, `annals: --metadata [1]: want a JSON object, such as '{"correlation_id": "c-1"}'`},
		{[]string{"append", "s", "t", "{}", "--metadata", `"x"`}, `annals: --metadata "x": want a JSON object, such as '{"correlation_id": "c-1"}'`},
		{[]string{"append", "s", "t", "{}", "--metadata", `{"a":`}, `annals: --metadata is not valid JSON: {"a":`},
		{[]string{"grant", "bogus", "r"}, `annals: "bogus": want reader, writer, runner or operator`},
	} {
		r := annals(t, "postgres://127.0.0.1:1/nowhere?connect_timeout=1", c.args...)
		if r.code != ExitUsage || !strings.HasPrefix(r.stderr, c.want+"\n") {
			t.Errorf("annals %q: exit %d, stderr %q; want exit %d and %q", c.args, r.code, r.stderr, ExitUsage, c.want)
		}
	}
}
