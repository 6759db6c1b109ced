package schemaname

import (
	"strings"
	"testing"

	"github.com/cockroachdb/errors"
)

func TestValidate(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"annals", "My Schema", `we"ird`, "ünï-cøde", strings.Repeat("a", MaxLen)} {
		if err := Validate(ok); err != nil {
			t.Errorf("Validate(%q) = %v, want nil", ok, err)
		}
	}
	for _, bad := range []string{"", strings.Repeat("a", MaxLen+1), "a$b", "a\x00b", "\xff", "t1\nCREATE TABLE injected(who text);--", "a\rb", "a\tb", "a\u0085b"} {
		if err := Validate(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("Validate(%q) = %v, want ErrInvalid", bad, err)
		}
	}
}

func TestIdentAndLiteral(t *testing.T) {
	t.Parallel()
	if got := Ident(`a"b`); got != `"a""b"` {
		t.Errorf("Ident = %s", got)
	}
	if got := Literal(`it's a\b`); got != `E'it''s a\\b'` {
		t.Errorf("Literal = %s", got)
	}
	if got := QualifiedLiteral(`we"ird's`, "seq"); got != `E'"we""ird''s"."seq"'` {
		t.Errorf("QualifiedLiteral = %s", got)
	}
	if Channel("annals") != "annals_events" {
		t.Errorf("Channel = %s", Channel("annals"))
	}
}
