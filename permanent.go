package annals

import (
	"github.com/cockroachdb/errors"
)

// ErrPermanent is matched (errors.Is) by errors wrapped with Permanent.
var ErrPermanent = errors.New("permanent failure")

// Permanent marks err as permanent: retrying cannot help (malformed data, a
// violated invariant), so the runner dead-letters the event after this one
// attempt instead of retrying it. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return errors.Mark(err, ErrPermanent)
}

// IsPermanent reports whether err (or an error it wraps) was marked by Permanent.
func IsPermanent(err error) bool { return errors.Is(err, ErrPermanent) }
