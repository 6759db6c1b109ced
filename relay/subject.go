package relay

import (
	"strings"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals/eventstore"
)

// DefaultSubject is the default subject template: the prefix, the event
// type and the stream ID, each value one escaped token.
const DefaultSubject = "{prefix}.{type}.{stream}"

// ErrInvalidSubject is matched by a subject template or prefix that cannot
// make valid NATS subjects.
var ErrInvalidSubject = errors.New("relay: invalid subject template")

// EscapeToken makes s one NATS subject token: every byte other than ASCII
// letters, digits, "-" and "_" becomes "%" and two upper-case hex digits
// (so ".", "*", ">", spaces, "%" and non-ASCII UTF-8 bytes are escaped, and
// "order.placed" becomes "order%2Eplaced"). The escaping is reversible
// (UnescapeToken) and stable, so consumers can filter on escaped values.
func EscapeToken(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' {
			b.WriteByte(c)
			continue
		}
		const hex = "0123456789ABCDEF"
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&15])
	}
	return b.String()
}

// UnescapeToken reverses EscapeToken.
func UnescapeToken(s string) (string, error) {
	if !strings.Contains(s, "%") {
		return s, nil
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			b.WriteByte(s[i])
			continue
		}
		if i+2 >= len(s) {
			return "", errors.Newf("relay: truncated escape in %q", s)
		}
		hi, lo := unhex(s[i+1]), unhex(s[i+2])
		if hi < 0 || lo < 0 {
			return "", errors.Newf("relay: bad escape in %q", s)
		}
		b.WriteByte(byte(hi<<4 | lo))
		i += 2
	}
	return b.String(), nil
}

func unhex(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'A' && c <= 'F':
		return int(c-'A') + 10
	case c >= 'a' && c <= 'f':
		return int(c-'a') + 10
	}
	return -1
}

// subjects renders the subject template.
type subjects struct {
	parts []string // literal text and placeholders, alternating as parsed
	// filter is the stream's subject filter: placeholders as "*".
	filter string
}

func parseSubject(prefix, tmpl string) (subjects, error) {
	if tmpl == "" {
		tmpl = DefaultSubject
	}
	if prefix == "" {
		return subjects{}, errors.Wrap(ErrInvalidSubject, "empty prefix")
	}
	for _, tok := range strings.Split(prefix, ".") {
		if tok == "" || tok != EscapeToken(tok) {
			return subjects{}, errors.Wrapf(ErrInvalidSubject, "prefix %q: tokens must be non-empty letters, digits, - and _", prefix)
		}
	}
	var s subjects
	rest := tmpl
	for rest != "" {
		i := strings.IndexByte(rest, '{')
		if i < 0 {
			s.parts = append(s.parts, rest)
			break
		}
		if i > 0 {
			s.parts = append(s.parts, rest[:i])
		}
		j := strings.IndexByte(rest[i:], '}')
		if j < 0 {
			return subjects{}, errors.Wrapf(ErrInvalidSubject, "%q: unclosed {", tmpl)
		}
		ph := rest[i : i+j+1]
		switch ph {
		case "{prefix}":
			s.parts = append(s.parts, prefix)
		case "{type}", "{stream}":
			s.parts = append(s.parts, ph)
		default:
			return subjects{}, errors.Wrapf(ErrInvalidSubject, "%q: unknown placeholder %s (want {prefix}, {type}, {stream})", tmpl, ph)
		}
		rest = rest[i+j+1:]
	}
	var f strings.Builder
	for _, p := range s.parts {
		if p == "{type}" || p == "{stream}" {
			f.WriteString("*")
		} else {
			f.WriteString(p)
		}
	}
	s.filter = f.String()
	for _, tok := range strings.Split(s.filter, ".") {
		if tok != "*" && (tok == "" || tok != EscapeToken(tok)) {
			return subjects{}, errors.Wrapf(ErrInvalidSubject, "%q: placeholders must be whole tokens between literal tokens of letters, digits, - and _", tmpl)
		}
	}
	return s, nil
}

func (s subjects) render(e eventstore.Event) string {
	var b strings.Builder
	for _, p := range s.parts {
		switch p {
		case "{type}":
			b.WriteString(EscapeToken(e.Type))
		case "{stream}":
			b.WriteString(EscapeToken(e.StreamID))
		default:
			b.WriteString(p)
		}
	}
	return b.String()
}

// subjectCovers reports whether every subject that filter matches is one
// that the stream subject sub takes, by NATS wildcard rules applied token by
// token: in sub, "*" takes any one token and a final ">" one or more; in
// filter (made by parseSubject: literal tokens and "*"), a "*" is covered
// only by "*" or ">" in sub, a literal token also by the same literal.
func subjectCovers(sub, filter string) bool {
	st, ft := strings.Split(sub, "."), strings.Split(filter, ".")
	for i, s := range st {
		if s == ">" && i == len(st)-1 {
			return len(ft) > i
		}
		if i >= len(ft) {
			return false
		}
		switch f := ft[i]; {
		case s == "*":
			if f == ">" {
				return false
			}
		case s != f || f == "*" || f == ">":
			return false
		}
	}
	return len(ft) == len(st)
}
