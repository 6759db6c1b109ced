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
// Channel (quoted string literal), AppendLockK1 and AppendLockK2.
package sqltmpl
