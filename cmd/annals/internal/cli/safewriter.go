package cli

import (
	"fmt"
	"io"
	"unicode/utf8"

	"github.com/annals-dev/annals/internal/plaintext"
)

// safeWriter passes what annals prints on to w with every character that
// could drive a terminal or disguise text written as \uXXXX (or \xXX for a
// byte that is not UTF-8): the C0 controls but tab and newline (ESC starts
// the sequences that clear a screen, recolour text or retitle a window),
// DEL, the C1 controls (U+0080-U+009F; some terminals read the lone byte
// 0x9B as a control sequence too), and the bidirectional formatting
// characters (U+202E would show "order-1\u202Egnp.exe" as "order-1exe.png").
// Stored data reaches the output in stream IDs, event types, payloads and
// handler errors, so it is not trusted. In JSON output such characters can
// only stand inside strings, where \uXXXX is the same character: JSON stays
// valid and means the same.
//
// A character split across two writes (a bufio.Writer flushing mid-way)
// is held until the rest arrives; Flush writes what is held at the end.
type safeWriter struct {
	w       io.Writer
	pending []byte
	buf     []byte
}

func newSafeWriter(w io.Writer) *safeWriter { return &safeWriter{w: w} }

// Write implements io.Writer.
func (s *safeWriter) Write(p []byte) (int, error) {
	data := p
	if len(s.pending) > 0 {
		data = append(s.pending, p...)
		s.pending = nil
	}
	cut := incompleteTail(data)
	s.buf = appendSafe(s.buf[:0], data[:cut])
	if cut < len(data) {
		s.pending = append([]byte(nil), data[cut:]...)
	}
	if len(s.buf) > 0 {
		if _, err := s.w.Write(s.buf); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// Flush writes what a write left held (the start of a character that never
// ended), escaped.
func (s *safeWriter) Flush() error {
	if len(s.pending) == 0 {
		return nil
	}
	out := appendSafe(nil, s.pending)
	s.pending = nil
	_, err := s.w.Write(out)
	return err
}

// incompleteTail returns where a UTF-8 sequence that data ends in the
// middle of starts, or len(data).
func incompleteTail(data []byte) int {
	for i := len(data) - 1; i >= 0 && i >= len(data)-3; i-- {
		b := data[i]
		if b < 0x80 {
			break
		}
		if b >= 0xC0 { // a start byte
			need := 2
			switch {
			case b >= 0xF0:
				need = 4
			case b >= 0xE0:
				need = 3
			}
			if len(data)-i < need {
				return i
			}
			break
		}
	}
	return len(data)
}

// unsafeRune reports the characters safeWriter escapes: tab and newline
// are the output's own; every other character that can drive a terminal or
// disguise text (plaintext.Disguising) is escaped.
func unsafeRune(r rune) bool {
	return r != '\t' && r != '\n' && plaintext.Disguising(r)
}

// appendSafe appends p to dst with unsafe characters and bytes that are not
// UTF-8 escaped.
func appendSafe(dst, p []byte) []byte {
	clean := true
	for _, b := range p {
		if b >= 0x80 || (b < 0x20 && b != '\t' && b != '\n') || b == 0x7F {
			clean = false
			break
		}
	}
	if clean {
		return append(dst, p...)
	}
	for i := 0; i < len(p); {
		r, size := utf8.DecodeRune(p[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			dst = fmt.Appendf(dst, `\x%02x`, p[i])
		case unsafeRune(r):
			dst = fmt.Appendf(dst, `\u%04x`, r)
		default:
			dst = append(dst, p[i:i+size]...)
		}
		i += size
	}
	return dst
}
