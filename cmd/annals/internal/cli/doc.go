// Package cli implements the annals command line (cmd/annals). It lives
// under internal so that the command tree can be tested in-process: Run takes
// the arguments and streams and returns the exit code.
//
// Conventions every command follows: the database comes from --database-url
// or $DATABASE_URL and the schema from --schema; output goes to stdout and
// errors to stderr as one line without a stack trace; bad flags or arguments
// (including malformed JSON and out-of-range values), an unknown command and
// an invalid event or schema name exit 2 and change nothing; a named dead
// letter, cron task, timer, subscriber or stream that does not exist exits 3
// and changes nothing; failures exit 1 (see ExitNotFound and the root help).
//
// Every command that prints data takes --output (output.go): text, the
// default, for people; json for one document (a list as one array); jsonl
// for one object a line, flushed at once (lists and tail). Each command
// offers only the formats that make sense for it, and a value it does not
// offer is a usage error naming those it does. The old --format (table,
// json, jsonl) stays as a hidden alias. The JSON shapes are the exported
// *JSON types and are documented in each command's help. No output has
// colour, so NO_COLOR and terminals need no special case; a command that
// adds colour must print it only on a terminal and never when NO_COLOR is
// set.
//
// annals --version and annals version print the module version ((devel)
// from a checkout) and the schema version 'annals migrate' brings a schema
// to. annals completion bash|zsh|fish|powershell is cobra's completion
// script.
package cli
