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
package cli
