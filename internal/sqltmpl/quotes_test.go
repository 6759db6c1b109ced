package sqltmpl

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestNoPlaceholderInsideQuotes reads every .sql file of the module and fails
// when a placeholder sits inside a quoted literal or quoted identifier written
// in the template, e.g. nextval('{{.Schema}}.seq'): a schema name holding a
// quote would end the string there and inject SQL. Placeholders are complete
// tokens (quoted identifiers, literals or constants) and go outside quotes.
// Dollar-quoted function bodies are scanned as SQL, since they are SQL.
func TestNoPlaceholderInsideQuotes(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..", "..")
	n := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".sql") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		n++
		for _, line := range quotedPlaceholders(string(src)) {
			t.Errorf("%s:%d: placeholder inside quotes", path, line)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 10 {
		t.Fatalf("found only %d .sql files under %s", n, root)
	}
}

func TestQuotedPlaceholders(t *testing.T) {
	t.Parallel()
	for src, want := range map[string]int{
		"SELECT nextval('{{.Schema}}.seq');":                     1,
		`SELECT * FROM "{{.Schema}}".t;`:                         1,
		"SELECT E'it\\'s {{.Schema}}';":                          1,
		"BEGIN $fn$ SELECT '{{.Schema}}' $fn$":                   1,
		"SELECT nextval({{.EventsSequence}}); -- don't '{{.X}}'": 0,
		"SELECT 'it''s', {{.Schema}}.f($1) /* '{{.Y}} */;":       0,
		"SELECT E'a\\\\', {{.Schema}};":                          0,
	} {
		if got := len(quotedPlaceholders(src)); got != want {
			t.Errorf("%q: %d placeholders inside quotes, want %d", src, got, want)
		}
	}
}

// quotedPlaceholders returns the lines on which a "{{" occurs inside a
// single- or double-quoted token of src.
func quotedPlaceholders(src string) []int {
	var out []int
	line := 1
	for i := 0; i < len(src); i++ {
		c := src[i]
		switch {
		case c == '\n':
			line++
		case strings.HasPrefix(src[i:], "--"):
			for i < len(src) && src[i] != '\n' {
				i++
			}
			i-- // let the loop see the newline
		case strings.HasPrefix(src[i:], "/*"):
			end := strings.Index(src[i:], "*/")
			if end < 0 {
				end = len(src) - i
			}
			line += strings.Count(src[i:i+end], "\n")
			i += end + 1
		case c == '\'' || c == '"':
			escapes := c == '\'' && i > 0 && (src[i-1] == 'E' || src[i-1] == 'e')
			flagged := false
		scan:
			for i++; i < len(src); i++ {
				switch {
				case src[i] == '\n':
					line++
				case escapes && src[i] == '\\':
					i++
				case src[i] == c && i+1 < len(src) && src[i+1] == c:
					i++
				case src[i] == c:
					break scan
				case strings.HasPrefix(src[i:], "{{") && !flagged:
					out = append(out, line)
					flagged = true
				}
			}
		}
	}
	return out
}
