package failure

import (
	"fmt"

	"github.com/cockroachdb/errors"
)

// ErrPermanent is matched (errors.Is) by errors wrapped with Permanent.
var ErrPermanent = errors.New("permanent failure")

// Permanent marks err as permanent: retrying cannot help (malformed data, a
// violated invariant), so the runner dead-letters the event after this one
// attempt instead of retrying it. Permanent(nil) is nil. The result matches
// ErrPermanent with the standard library's errors.Is as well as with
// cockroachdb/errors, keeps err's message, and unwraps to err.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanent{err}
}

// permanent carries the mark in an Is method, which both errors packages
// consult (errors.Mark is only understood by cockroachdb/errors).
type permanent struct{ error }

func (p *permanent) Unwrap() error                 { return p.error }
func (p *permanent) Is(target error) bool          { return target == ErrPermanent }
func (p *permanent) Format(s fmt.State, verb rune) { errors.FormatError(p, s, verb) }

// IsPermanent reports whether err (or an error it wraps) was marked by Permanent.
func IsPermanent(err error) bool { return errors.Is(err, ErrPermanent) }
