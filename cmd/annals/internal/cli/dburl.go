package cli

import (
	"net/url"
	"regexp"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// dbURLSecrets returns what of a database URL or keyword/value connection
// string must not be printed: its password as written and percent-decoded,
// and every piece of it a parser may have split off. pgx redacts the
// password of the connection strings it quotes in its errors, but only as
// far as it parsed them: a password holding an unescaped "@" (or "/")
// leaves its tail in the URL pgx prints, or in the host it then fails to
// reach ("postgres://u:top@secret@db/app" connects to host "secret@db"),
// and an unquoted password holding a space leaves its second word in a
// keyword/value parse error.
func dbURLSecrets(conn string) []string {
	var regions []string
	if rest, ok := cutScheme(conn); ok {
		// The user information runs up to the last "@" (a password may hold
		// "@", "/", "?" or "#"); a "@" further on, in the query, makes it
		// longer, which only redacts more.
		if at := strings.LastIndex(rest, "@"); at >= 0 {
			if _, pw, ok := strings.Cut(rest[:at], ":"); ok {
				regions = append(regions, pw)
			}
		}
		if u, err := url.Parse(conn); err == nil {
			for _, k := range []string{"password", "sslpassword"} {
				regions = append(regions, u.Query()[k]...)
			}
		}
	} else {
		// password=VALUE up to the next keyword=: an unquoted value with a
		// space runs on into words the parser refuses and quotes.
		for _, m := range kvPassword.FindAllStringSubmatchIndex(conn, -1) {
			end := len(conn)
			if next := kvKey.FindStringIndex(conn[m[1]:]); next != nil {
				end = m[1] + next[0]
			}
			regions = append(regions, strings.TrimSpace(conn[m[1]:end]))
		}
	}
	var secrets []string
	for _, r := range regions {
		pieces := append([]string{r}, strings.FieldsFunc(r, func(c rune) bool { return strings.ContainsRune("@:/?#&= \t\r\n'\\", c) })...)
		for _, p := range pieces {
			secrets = append(secrets, p)
			if d, err := url.PathUnescape(p); err == nil {
				secrets = append(secrets, d)
			}
		}
	}
	slices.SortFunc(secrets, func(a, b string) int { return len(b) - len(a) })
	return slices.Compact(secrets)
}

var (
	// kvPassword matches where a password's value begins in a keyword/value
	// connection string.
	kvPassword = regexp.MustCompile(`(?:^|\s)(?:ssl)?password\s*=\s*`)
	// kvKey matches the next keyword of a keyword/value connection string.
	kvKey = regexp.MustCompile(`\s[A-Za-z_]+\s*=`)
)

// cutScheme returns conn after "postgres://" or "postgresql://", and whether
// it is a URL.
func cutScheme(conn string) (string, bool) {
	for _, s := range []string{"postgres://", "postgresql://"} {
		if len(conn) >= len(s) && strings.EqualFold(conn[:len(s)], s) {
			return conn[len(s):], true
		}
	}
	return "", false
}

// redactDBURL returns err with every piece of conn's password
// (dbURLSecrets) left in its message replaced by "xxxxx", or err itself
// when there is none. The result's chain is err's (errors.Is and As, the
// exit code, see through it); its message is the redacted one.
func redactDBURL(err error, conn string) error {
	if err == nil {
		return nil
	}
	text := err.Error()
	for _, s := range dbURLSecrets(conn) {
		text = replaceSecret(text, s)
	}
	if text == err.Error() {
		return err
	}
	return redactedError{text: text, err: err}
}

// redactedError is an error whose message had secrets taken out.
type redactedError struct {
	text string
	err  error
}

func (r redactedError) Error() string { return r.text }
func (r redactedError) Unwrap() error { return r.err }

// replaceSecret replaces secret in text by "xxxxx": everywhere when it has
// four bytes or more, else only where it stands alone (not inside a word,
// such as the "p" of a password "p@ss" in "postgres"), which is how a
// parser leaves a piece it split off.
func replaceSecret(text, secret string) string {
	if len(secret) >= 4 {
		return strings.ReplaceAll(text, secret, "xxxxx")
	}
	if secret == "" {
		return text
	}
	var b strings.Builder
	for {
		i := strings.Index(text, secret)
		if i < 0 {
			b.WriteString(text)
			return b.String()
		}
		before, _ := utf8.DecodeLastRuneInString(text[:i])
		after, _ := utf8.DecodeRuneInString(text[i+len(secret):])
		b.WriteString(text[:i])
		if i > 0 && wordRune(before) || i+len(secret) < len(text) && wordRune(after) {
			b.WriteString(secret)
		} else {
			b.WriteString("xxxxx")
		}
		text = text[i+len(secret):]
	}
}

func wordRune(r rune) bool { return unicode.IsLetter(r) || unicode.IsDigit(r) }
