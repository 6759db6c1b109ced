package errmark

import (
	"fmt"

	"github.com/cockroachdb/errors"
)

// Mark returns err, unchanged in message and in what it unwraps to, that
// also matches mark under errors.Is (the standard library's and
// cockroachdb's). Mark(nil, m) is nil.
func Mark(err, mark error) error {
	if err == nil {
		return nil
	}
	return &marked{err: err, mark: mark}
}

type marked struct {
	err  error
	mark error
}

func (m *marked) Error() string { return m.err.Error() }

// Unwrap returns the marked error.
func (m *marked) Unwrap() error { return m.err }

// Is reports whether target is the mark (or something the mark matches).
func (m *marked) Is(target error) bool {
	return target == m.mark || errors.Is(m.mark, target)
}

// Format prints the marked error as it prints itself (%+v keeps its stack).
func (m *marked) Format(s fmt.State, verb rune) { errors.FormatError(m, s, verb) }

// FormatError implements errors.Formatter: with %+v it names the mark.
func (m *marked) FormatError(p errors.Printer) error {
	if p.Detail() {
		p.Printf("marked as: %v", m.mark)
	}
	return m.err
}
