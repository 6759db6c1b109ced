// Package failure holds the error marks a handler returns to steer the
// runner's failure handling, in a package that imports nothing of annals,
// so that every layer (projection, saga, the root package annals) can use
// them without an import cycle.
//
// Permanent(err) marks an error that retrying cannot fix (malformed data, a
// violated invariant): the runner records one failed attempt and
// dead-letters the event at once instead of spending its retry policy.
// The mark is an Is method, so both the standard library's errors.Is and
// cockroachdb/errors see it through any wrapping. The root package re-exports
// it as annals.Permanent, annals.IsPermanent and annals.ErrPermanent.
package failure
