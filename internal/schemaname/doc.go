// Package schemaname validates the configurable schema name and derives the
// names built from it: the quoted identifier used in SQL, the NOTIFY channel
// and the advisory-lock keys.
package schemaname
