package relay

import (
	"fmt"
	"strings"

	"github.com/annals-dev/annals/internal/schemaname"
)

// shellQuote returns s as one word for a POSIX shell: as it is when it
// holds only characters no shell treats specially, else in single quotes
// (each single quote inside closed, escaped and reopened).
func shellQuote(s string) string {
	safe := s != ""
	for i := 0; i < len(s) && safe; i++ {
		c := s[i]
		safe = c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("-_./:@%+=,", c) >= 0
	}
	if safe {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// checkpointSetHint is the command that sets the relay's checkpoint to
// pos, ready to paste into a shell: the name quoted, after "--" when it
// starts with "-" (it would be read as a flag), and --schema when it is
// not the default.
func (r *Relay) checkpointSetHint(pos int64) string {
	schema := ""
	if r.cfg.Schema != schemaname.Default {
		schema = " --schema " + shellQuote(r.cfg.Schema)
	}
	if strings.HasPrefix(r.cfg.Name, "-") {
		return fmt.Sprintf("annals checkpoint set%s --yes -- %s %d", schema, shellQuote(r.cfg.Name), pos)
	}
	return fmt.Sprintf("annals checkpoint set %s %d --yes%s", shellQuote(r.cfg.Name), pos, schema)
}

// migrateHint is the command that migrates the relay's schema: --schema
// when it is not the default.
func (r *Relay) migrateHint() string {
	if r.cfg.Schema != schemaname.Default {
		return "annals migrate --schema " + shellQuote(r.cfg.Schema)
	}
	return "annals migrate"
}
