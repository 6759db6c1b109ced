// Package errmark marks an error as matching a sentinel in a way that both
// the standard library's errors.Is and cockroachdb/errors' Is see.
//
// cockroachdb/errors.Mark records the mark where only cockroachdb's Is
// looks, so a caller of annals who writes errors.Is from the standard
// library (most do) would not see ErrInvalidTimer, ErrNoKEK and the like on
// errors annals returns. Mark here wraps the error in a type with an Is
// method, which the standard library calls and cockroachdb delegates to.
package errmark
