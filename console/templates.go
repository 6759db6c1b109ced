package console

import (
	"embed"
	"html/template"
	"io"
	"io/fs"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/cockroachdb/errors"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// templates holds one template set per page: the layout and the page.
type templates struct {
	pages map[string]*template.Template
}

var funcs = template.FuncMap{
	"ts": func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return t.UTC().Format("2006-01-02 15:04:05Z")
	},
	"tsp": func(t *time.Time) string {
		if t == nil || t.IsZero() {
			return "-"
		}
		return t.UTC().Format("2006-01-02 15:04:05Z")
	},
	"secs": formatSeconds,
	// The nil-able cells (a standby's details, hidden from a role without
	// pg_read_all_stats): "-" for nil, as `annals status` shows them.
	"secsp": func(sec *float64) string {
		if sec == nil {
			return "-"
		}
		return formatSeconds(*sec)
	},
	"bytesp": func(n *int64) string {
		if n == nil {
			return "-"
		}
		return formatBytes(*n)
	},
	"visp": func(s *string) string {
		if s == nil || *s == "" {
			return "-"
		}
		return visible(*s)
	},
	"pathq": pathSegment,
	// vis shows stored text on one line, visl on several (it keeps tab and
	// newline): every character that could disguise it escaped.
	"vis":      visible,
	"visl":     visibleLines,
	"bytes":    formatBytes,
	"itoa":     func(n int64) string { return strconv.FormatInt(n, 10) },
	"add":      func(a, b int64) int64 { return a + b },
	"upper":    strings.ToUpper,
	"truncate": truncate,
	"pretty":   pretty,
	"lag": func(p Partition) string {
		s := strconv.FormatInt(p.LagEvents, 10)
		if !p.LagExact {
			s = "~" + s
		}
		return s
	},
	"dict": func(kv ...any) map[string]any {
		m := map[string]any{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	},
}

// truncate cuts s to at most n bytes, at a character's start, and marks
// the cut with an ellipsis.
func truncate(n int, s string) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// formatBytes prints a size in bytes with thousands separators.
func formatBytes(n int64) string {
	s := strconv.FormatInt(n, 10)
	var b strings.Builder
	for i, r := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(r)
	}
	return b.String() + " bytes"
}

// formatSeconds prints an age rounded to a precision that suits its size.
func formatSeconds(sec float64) string {
	d := time.Duration(sec * float64(time.Second))
	switch {
	case d <= 0:
		return "0s"
	case d < 10*time.Second:
		return d.Round(10 * time.Millisecond).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	}
	return d.Round(time.Minute).String()
}

func parseTemplates() (*templates, error) {
	names, err := fs.Glob(templateFS, "templates/*.html")
	if err != nil {
		return nil, errors.Wrap(err, "console: list templates")
	}
	t := &templates{pages: map[string]*template.Template{}}
	for _, n := range names {
		base := strings.TrimSuffix(strings.TrimPrefix(n, "templates/"), ".html")
		if base == "layout" || strings.HasPrefix(base, "_") {
			continue
		}
		set, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/_*.html", n)
		if err != nil {
			return nil, errors.Wrapf(err, "console: parse %s", n)
		}
		t.pages[base] = set
	}
	return t, nil
}

func (t *templates) execute(w io.Writer, page string, data any) error {
	set, ok := t.pages[page]
	if !ok {
		return errors.Newf("console: no template %q", page)
	}
	return set.ExecuteTemplate(w, "layout.html", data)
}

func staticHandler() http.Handler {
	sub, err := fs.Sub(staticFS, "static")
	if err != nil {
		panic(err) // the embedded directory exists: a build error otherwise
	}
	return http.FileServerFS(sub)
}
