package schemaname

import (
	"crypto/md5"
	"encoding/hex"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/internal/lockkey"
)

// Default is the schema used when a config leaves the name empty.
const Default = "annals"

// MaxLen is the longest schema name accepted, in bytes. PostgreSQL truncates
// identifiers at 63 bytes and the NOTIFY channel appends "_events" to the name.
const MaxLen = 56

// ErrInvalid is returned for a schema name that cannot be used.
var ErrInvalid = errors.New("invalid schema name")

// Or returns name, or Default when name is empty.
func Or(name string) string {
	if name == "" {
		return Default
	}
	return name
}

// Resolve returns name, or Default when it is empty, after validating it.
func Resolve(name string) (string, error) {
	name = Or(name)
	return name, Validate(name)
}

// Validate checks that name can be used as the annals schema. It runs before
// any SQL is sent, so a refused name leaves nothing behind. Any character that
// PostgreSQL accepts in a quoted identifier is allowed (quotes, backslashes,
// semicolons, "--", unicode: every use of the name in SQL is a quoted
// identifier or a quoted literal) except NUL, which PostgreSQL cannot store,
// '$': the migrations' function bodies are dollar-quoted ($fn$ ... $fn$),
// and a name holding a dollar-quote tag would end a body early (refusing '$'
// is simpler and safer than choosing a tag per name), and control
// characters: the migrations name the schema in "--" comments too, which a
// line break would end, making the rest of the name SQL.
func Validate(name string) error {
	switch {
	case name == "":
		return errors.Wrap(ErrInvalid, "schema name is empty")
	case len(name) > MaxLen:
		return errors.Wrapf(ErrInvalid, "schema name %q is %d bytes; at most %d are allowed", name, len(name), MaxLen)
	case !utf8.ValidString(name):
		return errors.Wrapf(ErrInvalid, "schema name %q is not valid UTF-8", name)
	case strings.ContainsRune(name, 0):
		return errors.Wrap(ErrInvalid, "schema name contains a NUL byte")
	case strings.ContainsRune(name, '$'):
		return errors.Wrapf(ErrInvalid, "schema name %q contains '$', which annals does not allow", name)
	case strings.ContainsFunc(name, unicode.IsControl):
		return errors.Wrapf(ErrInvalid, "schema name %q contains a control character (a line break, a tab, ...), which annals does not allow", name)
	}
	return nil
}

// Ident returns name quoted as a SQL identifier, e.g. "annals" or "My ""Schema""".
func Ident(name string) string { return pgx.Identifier{name}.Sanitize() }

// Literal returns s quoted as a SQL string literal that means s whatever the
// session's standard_conforming_strings: an escape string in which
// backslashes and apostrophes are doubled:
//
//	Literal(`it's a\b`) == `E'it''s a\\b'`
func Literal(s string) string { return "E'" + literalReplacer.Replace(s) + "'" }

var literalReplacer = strings.NewReplacer(`\`, `\\`, "'", "''")

// QualifiedLiteral returns the quoted literal of the quoted, schema-qualified
// name of object, e.g. E'"annals"."events_global_sequence"', for functions
// that take a name as text or regclass (nextval, setval, to_regclass).
func QualifiedLiteral(schema, object string) string {
	return Literal(pgx.Identifier{schema, object}.Sanitize())
}

// Channel returns the NOTIFY channel on which appends to the schema announce
// the new head position: the schema name followed by "_events".
func Channel(name string) string { return name + "_events" }

// CheckpointChannel returns the NOTIFY channel of checkpoint moves in schema
// name (payload "position:partition:subscriber"), which projection.Await
// listens to: the name followed by "_checkpoints", or, when that is longer
// than a channel name may be (63 bytes: a schema name over 51 bytes),
// "annals_checkpoints_" and the md5 of the name in hex. pg_notify refuses
// a longer name, and LISTEN would truncate it, so the notices were lost.
func CheckpointChannel(name string) string {
	if c := name + "_checkpoints"; len(c) <= maxChannelLen {
		return c
	}
	sum := md5.Sum([]byte(name))
	return "annals_checkpoints_" + hex.EncodeToString(sum[:])
}

// maxChannelLen is the longest NOTIFY channel name PostgreSQL takes, in
// bytes (NAMEDATALEN - 1).
const maxChannelLen = 63

// FenceChannel returns the NOTIFY channel on which the statements that
// fence a subscriber partition's leader announce it (checkpoint.FenceChannel
// says more): the name followed by "_fences", at most 63 bytes for the
// longest name allowed.
func FenceChannel(name string) string { return name + "_fences" }

// AppendLockKey returns the transaction-scoped advisory-lock key that
// serializes the numbering of appends in the schema.
func AppendLockKey(name string) (int32, int32) { return lockkey.Pair(name + ":append") }

// MigrateLockKey returns the advisory-lock key Up holds (for its transaction) while migrating the schema.
func MigrateLockKey(name string) (int32, int32) { return lockkey.Pair(name + ":migrate") }
