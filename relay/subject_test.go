package relay

import (
	"testing"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals/eventstore"
)

func TestEscapeToken(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"order-placed_v2":   "order-placed_v2",
		"order.placed":      "order%2Eplaced",
		"a b*c>d%e":         "a%20b%2Ac%3Ed%25e",
		"café":              "caf%C3%A9",
		"tenant/42:acct\t1": "tenant%2F42%3Aacct%091",
	} {
		if got := EscapeToken(in); got != want {
			t.Errorf("EscapeToken(%q) = %q, want %q", in, got, want)
		}
		back, err := UnescapeToken(want)
		if err != nil || back != in {
			t.Errorf("UnescapeToken(%q) = %q, %v; want %q", want, back, err, in)
		}
	}
	for _, bad := range []string{"a%", "a%4", "a%zz"} {
		if _, err := UnescapeToken(bad); err == nil {
			t.Errorf("UnescapeToken(%q) did not fail", bad)
		}
	}
}

func TestSubjectTemplate(t *testing.T) {
	t.Parallel()
	e := eventstore.Event{Type: "order.placed", StreamID: "order-1.a"}
	for _, c := range []struct{ prefix, tmpl, subject, filter string }{
		{"annals", "", "annals.order%2Eplaced.order-1%2Ea", "annals.*.*"},
		{"acme.events", "{prefix}.{stream}.{type}", "acme.events.order-1%2Ea.order%2Eplaced", "acme.events.*.*"},
		{"x", "{prefix}.v1.{type}", "x.v1.order%2Eplaced", "x.v1.*"},
	} {
		s, err := parseSubject(c.prefix, c.tmpl)
		if err != nil {
			t.Fatalf("%q %q: %v", c.prefix, c.tmpl, err)
		}
		if got := s.render(e); got != c.subject {
			t.Errorf("%q %q: subject %q, want %q", c.prefix, c.tmpl, got, c.subject)
		}
		if s.filter != c.filter {
			t.Errorf("%q %q: filter %q, want %q", c.prefix, c.tmpl, s.filter, c.filter)
		}
	}
	for _, c := range []struct{ prefix, tmpl string }{
		{"", ""}, {"a..b", ""}, {"a*", ""}, {"annals", "{prefix}.{type}{stream}"},
		{"annals", "{prefix}.{nope}"}, {"annals", "{prefix}.{type"}, {"annals", "{prefix}..{type}"},
		{"annals", "{prefix}.>"},
	} {
		if _, err := parseSubject(c.prefix, c.tmpl); !errors.Is(err, ErrInvalidSubject) {
			t.Errorf("parseSubject(%q, %q) = %v, want ErrInvalidSubject", c.prefix, c.tmpl, err)
		}
	}
}

// TestSubjectCovers: a stream subject takes the relay's filter only when
// it covers every subject the filter matches, token by token ("*" one
// token, a final ">" the rest), not by comparing strings.
func TestSubjectCovers(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		sub, filter string
		want        bool
	}{
		{"annals.*.*", "annals.*.*", true},
		{"annals.>", "annals.*.*", true},
		{">", "annals.*.*", true},
		{"annals.*.>", "annals.*.*", true},
		{"*.*.*", "annals.*.*", true},
		{"annals.*.*.>", "annals.*.*", false},
		{"wide.>", "orders.*.*", false},
		{"annals.x.*", "annals.*.*", false},
		{"annals.*", "annals.*.*", false},
		{"annals.*.*.*", "annals.*.*", false},
		{"annals", "annals.*.*", false},
		{"acme.orders.>", "acme.orders.*.*", true},
		{"acme.*.*.*", "acme.orders.*.*", true},
		{"acme.orders.placed.*", "acme.orders.*.*", false},
		{"x.>", "x.*", true},
		{"x.*.>", "x.*", false},
	} {
		if got := subjectCovers(c.sub, c.filter); got != c.want {
			t.Errorf("subjectCovers(%q, %q) = %v, want %v", c.sub, c.filter, got, c.want)
		}
	}
}
