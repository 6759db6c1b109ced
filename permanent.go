package annals

import "github.com/annals-dev/annals/failure"

// ErrPermanent is matched (errors.Is) by errors wrapped with Permanent. It
// is failure.ErrPermanent.
var ErrPermanent = failure.ErrPermanent

// Permanent marks err as permanent: retrying cannot help, so the runner
// dead-letters the event after this one attempt. Permanent(nil) is nil. It
// is failure.Permanent, re-exported for handlers that import only annals.
func Permanent(err error) error { return failure.Permanent(err) }

// IsPermanent reports whether err (or an error it wraps) was marked by
// Permanent. It is failure.IsPermanent.
func IsPermanent(err error) bool { return failure.IsPermanent(err) }
