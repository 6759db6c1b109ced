package cli

import (
	"strings"
	"testing"
)

// TestDatabaseURLPasswordNeverPrinted: a database URL whose password pgx
// does not parse as one (an unescaped "@" or "/", an unquoted space) left
// pieces of it in the command's error, which goes to a terminal or a CI
// log: pgx redacts only what it parsed as the password, and connects to the
// rest as a host. An audit found "annals: connect to s3cret@127.0.0.1:1"
// for postgres://u:top@s3cret@127.0.0.1:1/db. Each case fails (bad URL, or
// nothing listening on port 1) without printing a piece of the password.
func TestDatabaseURLPasswordNeverPrinted(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		url    string
		code   int
		want   string   // in stderr
		secret []string // none of them in stdout or stderr
	}{
		{"postgres://u:top@s3cret@127.0.0.1:1/db", 1, "connect to xxxxx@127.0.0.1:1", []string{"s3cret"}},
		{"postgres://u:p@ssw0rdS3CRET@h:x/db", 2, "invalid database URL: cannot parse `postgres://u:xxxxx@xxxxx@h:x/db`: invalid port", []string{"ssw0rd", "S3CRET"}},
		{"postgres://u:sl/ash@sec2et@h/db", 2, "invalid database URL", []string{"sec2et", "ash"}},
		{"postgresql://u:a@b@h:x/db", 2, "`postgresql://u:xxxxx@xxxxx@h:x/db`", []string{"@b@"}},
		{"host=h port=x password=two w0rds user=u", 2, "password=xxxxx xxxxx user=u", []string{"w0rds"}},
		{"host=h port=x password='quoted w0rds", 2, "invalid database URL", []string{"w0rds", "quoted"}},
		{"host=127.0.0.1 port=1 user=u sslpassword=tw0 w0rds", 2, "invalid database URL", []string{"w0rds", "tw0"}},
		{"postgres://u@h:x/db?password=s3cret%20two&sslmode=disable", 2, "invalid database URL", []string{"s3cret", "two"}},
		// Well-formed: nothing to take out but what pgx redacts itself.
		{"postgres://u:s3cret@127.0.0.1:1/db", 1, "connect to 127.0.0.1:1: failed to connect to `user=u database=db`", []string{"s3cret"}},
		{"postgres://u:p@127.0.0.1:1/postgres", 1, "connect to 127.0.0.1:1: failed to connect to `user=u database=postgres`", nil},
	} {
		r := annals(t, "", "status", "--database-url", c.url)
		if r.code != c.code || !strings.Contains(r.stderr, c.want) {
			t.Errorf("%s: exit %d, want %d and %q:\n%s%s", c.url, r.code, c.code, c.want, r.stdout, r.stderr)
		}
		for _, s := range c.secret {
			if strings.Contains(r.stdout+r.stderr, s) {
				t.Errorf("%s: prints %q:\n%s%s", c.url, s, r.stdout, r.stderr)
			}
		}
	}
}

func TestReplaceSecret(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ text, secret, want string }{
		{"postgres://u:xxxxx@p@h", "p", "postgres://u:xxxxx@xxxxx@h"},
		{"parse p", "p", "parse xxxxx"},
		{"a s3cret in a word: ans3crets", "s3cret", "a xxxxx in a word: anxxxxxs"},
		{"é@b", "b", "é@xxxxx"},
		{"nothing", "", "nothing"},
	} {
		if got := replaceSecret(c.text, c.secret); got != c.want {
			t.Errorf("replaceSecret(%q, %q) = %q, want %q", c.text, c.secret, got, c.want)
		}
	}
}
