package relay

import (
	"unicode"
	"unicode/utf8"

	"github.com/cockroachdb/errors"
)

// ErrInvalidName is matched by a relay name (Config.Name) the relay could
// not read back from its own messages.
var ErrInvalidName = errors.New("relay: invalid relay name")

// CheckName checks a relay name (Config.Name; New calls it): valid UTF-8
// without control characters other than tab. NATS writes a carriage return
// or line feed in a header value as a space, so a relay named "a\nb" would
// find its stream's newest message published by "a b" and refuse its own
// stream at the next run; PostgreSQL refuses NUL and invalid UTF-8 in the
// checkpoint's name. Tab is kept (at either end, which NATS trims, the name
// also goes in Annals-Relay-Json).
func CheckName(name string) error {
	if !utf8.ValidString(name) {
		return errors.Wrapf(ErrInvalidName, "%q is not valid UTF-8", name)
	}
	for _, r := range name {
		if r != '\t' && unicode.IsControl(r) {
			return errors.Wrapf(ErrInvalidName, "%q holds the control character %U: NATS headers cannot carry it", name, r)
		}
	}
	return nil
}
