// Package freshids lets package aggregate tell package eventstore that the
// event IDs of an append were generated for it just now (UUIDv7), so that
// no stored event can have them: the store then skips the look-up that
// caller-chosen IDs cost (an index probe per event, and for a group commit
// the probe of every event of the group), while the IDs still seal personal
// data as caller IDs do. Only a first attempt is fresh: a Save made again
// after an unknown outcome re-sends the same IDs, which the store checks.
package freshids
