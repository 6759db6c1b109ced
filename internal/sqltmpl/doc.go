// Package sqltmpl renders the embedded .sql files: it substitutes the schema
// (and other values) into text/template placeholders and splits a file into
// named statements.
//
// A file holds one or more statements, each introduced by a line
//
//	-- name: InsertThing
//
// Placeholders use text/template syntax; the data always has the fields
// Schema (quoted identifier), SchemaLiteral (quoted string literal),
// Channel (quoted string literal), EventsSequence (regclass constant),
// AppendLockK1 and AppendLockK2. Every one is complete SQL syntax: a
// placeholder never goes inside quotes written in the template, where a name
// holding a quote would end the string (TestNoPlaceholderInsideQuotes).
package sqltmpl
