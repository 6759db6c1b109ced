package relay

import (
	"testing"

	"github.com/annals-dev/annals/internal/schemaname"
)

// The checkpoint commands the relay's log suggests paste into a shell as
// they are: the name one word, not read as a flag, with the schema.
func TestCheckpointSetHint(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, schema, want string
	}{
		{"relay", "", "annals checkpoint set relay 4 --yes"},
		{"r3 ", "", "annals checkpoint set 'r3 ' 4 --yes"},
		{"it's", "", `annals checkpoint set 'it'\''s' 4 --yes`},
		{"$(rm -rf ~)", "", "annals checkpoint set '$(rm -rf ~)' 4 --yes"},
		{"-x", "", "annals checkpoint set --yes -- -x 4"},
		{"orders.v2", "acme", "annals checkpoint set orders.v2 4 --yes --schema acme"},
	} {
		r := &Relay{cfg: Config{Name: c.name, Schema: schemaname.Or(c.schema)}}
		if got := r.checkpointSetHint(4); got != c.want {
			t.Errorf("name %q, schema %q: %s, want %s", c.name, c.schema, got, c.want)
		}
	}
}
