package recovered

import (
	"runtime/debug"

	"github.com/cockroachdb/errors"
)

// Call calls fn and returns its error, or, if fn panics, an error saying
// "<what> panicked: <value>", with the panic's stack as an error detail
// (errors.GetAllDetails; a one-line log leaves it out).
func Call(what string, fn func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = errors.WithDetail(errors.Newf("%s panicked: %v", what, r), string(debug.Stack()))
		}
	}()
	return fn()
}
