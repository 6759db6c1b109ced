package catchup

import (
	"regexp"
	"strings"

	"github.com/cockroachdb/errors"
)

// ErrInvalidGlob is matched by an event-type pattern that is not a valid glob.
var ErrInvalidGlob = errors.New("invalid event type glob")

// Filter selects events by type with glob patterns. Patterns are
// dot-separated segments; a segment is a literal or '*', and '*' matches one
// or more whole segments:
//
//	order.*          order.placed, order.item.added         (not "order")
//	*.shipped        order.shipped, a.b.shipped
//	order.*.shipped  order.x.shipped, order.x.y.shipped
//	*                every type
//
// '*' inside a segment ("ord*"), empty segments ("a..b", ".a") and empty
// patterns are invalid. An event matches the filter if it matches any pattern.
type Filter struct {
	patterns []string
	re       *regexp.Regexp // nil: everything
}

// ParseFilter validates patterns. No patterns (or "*" among them) selects every type.
func ParseFilter(patterns []string) (Filter, error) {
	if len(patterns) == 0 {
		return Filter{}, nil
	}
	alts := make([]string, 0, len(patterns))
	all := false
	for _, p := range patterns {
		if p == "*" {
			all = true // still validate the other patterns
			continue
		}
		re, err := globRegex(p)
		if err != nil {
			return Filter{}, err
		}
		alts = append(alts, re)
	}
	if all {
		return Filter{patterns: patterns}, nil
	}
	src := "^(?:" + strings.Join(alts, "|") + ")$"
	return Filter{patterns: patterns, re: regexp.MustCompile(src)}, nil
}

func globRegex(p string) (string, error) {
	if p == "" {
		return "", errors.Wrap(ErrInvalidGlob, "empty pattern")
	}
	segs := strings.Split(p, ".")
	parts := make([]string, len(segs))
	for i, s := range segs {
		switch {
		case s == "":
			return "", errors.Wrapf(ErrInvalidGlob, "%q has an empty segment", p)
		case s == "*":
			parts[i] = `[^.]+(?:\.[^.]+)*`
		case strings.Contains(s, "*"):
			return "", errors.Wrapf(ErrInvalidGlob, "%q: '*' must be a whole segment", p)
		default:
			parts[i] = regexp.QuoteMeta(s)
		}
	}
	return strings.Join(parts, `\.`), nil
}

// All reports whether the filter selects every type.
func (f Filter) All() bool { return f.re == nil }

// Match reports whether an event type is selected.
func (f Filter) Match(eventType string) bool { return f.re == nil || f.re.MatchString(eventType) }

// Regex returns the filter as a regular expression that Go and PostgreSQL
// (~ operator) read the same way, or "" when it selects everything.
func (f Filter) Regex() string {
	if f.re == nil {
		return ""
	}
	return f.re.String()
}

// Patterns returns the patterns the filter was parsed from.
func (f Filter) Patterns() []string { return f.patterns }
