// Package plaintext says which characters can drive a terminal or disguise
// text: what the CLI escapes in its output, and what an audit log's actor
// may not contain.
package plaintext
