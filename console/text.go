package console

import (
	"fmt"
	"net/url"
	"strings"
	"unicode/utf8"

	"github.com/annals-dev/annals/internal/plaintext"
)

// visible returns s as the console shows stored text (stream IDs, event
// types, errors, names, data): every character that can drive a terminal or
// disguise text (plaintext.Disguising: the control characters, among them
// line breaks, the bidirectional formatting characters such as U+202E, and
// U+2028/U+2029) written as \uXXXX, and a byte that is not UTF-8 as \xXX,
// the rule of the command line's output. So "order-1\u202Egnp.exe" shows as
// that, not as "order-1exe.png", and a name cannot break a line. Inside a
// JSON string \uXXXX is the same character, so shown data means the same.
// Links and form values keep the real text: only what is shown passes here
// (the template function vis).
func visible(s string) string { return escapeDisguising(s, false) }

// visibleLines is visible for text shown on several lines (an error with
// its stack, pretty-printed JSON): tab and newline are kept.
func visibleLines(s string) string { return escapeDisguising(s, true) }

func escapeDisguising(s string, lines bool) string {
	clean := true
	for i := 0; i < len(s); i++ {
		if b := s[i]; b >= 0x80 || b < 0x20 || b == 0x7f {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 16)
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case lines && (r == '\n' || r == '\t'):
			b.WriteRune(r)
		case plaintext.Disguising(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// pathSegment escapes s as one segment of a URL path: url.PathEscape, and
// a segment that is "." or ".." as %2E or %2E%2E, which url.PathEscape
// leaves (dots are unreserved) and which a browser would resolve as the
// directory itself or its parent (href="/streams/.." is "/"). The console's
// routes decode %2E back to the stream ID ".".
func pathSegment(s string) string {
	switch e := url.PathEscape(s); e {
	case ".":
		return "%2E"
	case "..":
		return "%2E%2E"
	default:
		return e
	}
}
