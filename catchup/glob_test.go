package catchup_test

import (
	"context"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/catchup"
)

// globCase is one filter and the event types it must and must not select.
type globCase struct {
	name     string
	patterns []string
	match    []string
	noMatch  []string
}

var globCases = []globCase{
	{
		name:     "TrailingStar",
		patterns: []string{"order.*"},
		match:    []string{"order.placed", "order.item.added", "order.a.b.c", "order.a\nb"},
		noMatch:  []string{"order", "orders.x", "order.", "order..x", "xorder.placed", "porder.placed", "Order.placed", "orderXplaced", ""},
	},
	{
		name:     "LeadingStar",
		patterns: []string{"*.shipped"},
		match:    []string{"order.shipped", "a.b.shipped", "x-y.shipped"},
		noMatch:  []string{"shipped", ".shipped", "order.unshipped", "order.shipped.late", "order.shippedx", "order..shipped"},
	},
	{
		name:     "MiddleStar",
		patterns: []string{"order.*.shipped"},
		match:    []string{"order.x.shipped", "order.x.y.shipped", "order.item-1.shipped"},
		noMatch:  []string{"order.shipped", "order..shipped", "order.x.shipped.y", "orders.x.shipped", "order.x.unshipped", "xorder.x.shipped"},
	},
	{
		name:     "TwoStars",
		patterns: []string{"*.*"},
		match:    []string{"a.b", "a.b.c", "order.placed"},
		noMatch:  []string{"a", "a.", ".b", ""},
	},
	{
		name:     "StarMatchesEverything",
		patterns: []string{"*"},
		match:    []string{"order", "order.placed", "a.b.c.d", "x[1]", "é", "a\nb"},
	},
	{
		name:     "StarAmongOthers",
		patterns: []string{"order.placed", "*"},
		match:    []string{"order", "payment.received", "a.b.c"},
	},
	{
		name:     "NoPatterns",
		patterns: nil,
		match:    []string{"order", "order.placed"},
	},
	{
		name:     "Literal",
		patterns: []string{"order.placed"},
		match:    []string{"order.placed"},
		noMatch:  []string{"order.placedx", "xorder.placed", "orderXplaced", "order.placed.x", "order", "ORDER.PLACED"},
	},
	{
		name:     "SeveralPatterns",
		patterns: []string{"order.placed", "payment.*", "*.refunded"},
		match:    []string{"order.placed", "payment.received", "payment.card.declined", "order.refunded", "a.b.refunded"},
		noMatch:  []string{"order.shipped", "payment", "payment.", "refunded", "order.placed.x"},
	},
	{
		name:     "RegexMetacharactersAreLiteral",
		patterns: []string{"a+b.c", "x[1]", `v(1|2).e{2}^$`, `a\d.x`, "q?.s"},
		match:    []string{"a+b.c", "x[1]", `v(1|2).e{2}^$`, `a\d.x`, "q?.s"},
		noMatch:  []string{"aab.c", "ab.c", "aaab.c", "a+bxc", "x1", "x[", "v1.ee", "v2.e{2}", "a1.x", `a\dXx`, "q.s", "s"},
	},
	{
		name:     "OtherCharacters",
		patterns: []string{"billing-v2.invoice_sent", "ordér.*", "ns/x:y.*"},
		match:    []string{"billing-v2.invoice_sent", "ordér.placé", "ns/x:y.z"},
		noMatch:  []string{"billing-v2.invoice-sent", "order.placé", "ordér", "ns/x:y"},
	},
}

func TestParseFilter(t *testing.T) {
	t.Parallel()

	t.Run("Matches", func(t *testing.T) {
		t.Parallel()
		for _, c := range globCases {
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				f, err := catchup.ParseFilter(c.patterns)
				if err != nil {
					t.Fatalf("ParseFilter(%q): %v", c.patterns, err)
				}
				if !slices.Equal(f.Patterns(), c.patterns) {
					t.Errorf("Patterns() = %q, want %q", f.Patterns(), c.patterns)
				}
				wantAll := len(c.patterns) == 0 || slices.Contains(c.patterns, "*")
				if f.All() != wantAll {
					t.Errorf("All() = %v, want %v", f.All(), wantAll)
				}
				if wantAll != (f.Regex() == "") {
					t.Errorf("Regex() = %q with All() = %v", f.Regex(), f.All())
				}
				var re *regexp.Regexp
				if f.Regex() != "" {
					re = regexp.MustCompile(f.Regex())
				}
				check := func(typ string, want bool) {
					if got := f.Match(typ); got != want {
						t.Errorf("%q matches %q: %v, want %v", c.patterns, typ, got, want)
					}
					if re != nil && re.MatchString(typ) != want {
						t.Errorf("Regex() %q matches %q: %v, want %v", f.Regex(), typ, !want, want)
					}
				}
				for _, typ := range c.match {
					check(typ, true)
				}
				for _, typ := range c.noMatch {
					check(typ, false)
				}
			})
		}
	})

	t.Run("Invalid", func(t *testing.T) {
		t.Parallel()
		for _, patterns := range [][]string{
			{""}, {"a..b"}, {".a"}, {"a."}, {"."}, {"ord*"}, {"*x"}, {"a.*b"}, {"**"}, {"a.b*.c"},
			{"order.*", ""}, {"order.*", "a..b"}, {"ord*", "*"},
			// A "*" elsewhere in the list must not hide an invalid pattern.
			{"*", "ord*"}, {"*", ""},
		} {
			f, err := catchup.ParseFilter(patterns)
			if !errors.Is(err, catchup.ErrInvalidGlob) {
				t.Errorf("ParseFilter(%q) = %v (regex %q), want ErrInvalidGlob", patterns, err, f.Regex())
				continue
			}
			for _, p := range patterns {
				if p != "" && p != "*" && !strings.Contains(err.Error(), p) && !validGlob(p) {
					t.Errorf("ParseFilter(%q): error %q does not name the pattern %q", patterns, err, p)
				}
			}
		}
	})

	// The engine filters in SQL (event_type ~ regex): PostgreSQL must read
	// every regex as Go does. One query evaluates the whole table.
	t.Run("PostgreSQLAgrees", func(t *testing.T) {
		t.Parallel()
		db := annalstest.NewDB(t, nil)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var regexes, types []string
		var want []bool
		for _, c := range globCases {
			f, err := catchup.ParseFilter(c.patterns)
			if err != nil {
				t.Fatalf("ParseFilter(%q): %v", c.patterns, err)
			}
			if f.Regex() == "" {
				continue // selects everything: the engine sends no regex
			}
			for _, typ := range slices.Concat(c.match, c.noMatch) {
				regexes = append(regexes, f.Regex())
				types = append(types, typ)
				want = append(want, f.Match(typ))
			}
		}
		rows, err := db.Pool.Query(ctx, `SELECT t ~ r FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS x(r, t, i) ORDER BY i`, regexes, types)
		if err != nil {
			t.Fatal(err)
		}
		var got []bool
		var m bool
		for rows.Next() {
			if err := rows.Scan(&m); err != nil {
				t.Fatal(err)
			}
			got = append(got, m)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		if len(got) != len(want) || len(want) < 50 {
			t.Fatalf("%d results for %d cases", len(got), len(want))
		}
		for i := range want {
			if got[i] != want[i] {
				t.Errorf("%q ~ %q: PostgreSQL says %v, Go says %v", types[i], regexes[i], got[i], want[i])
			}
		}
	})
}

// validGlob reports whether p alone parses.
func validGlob(p string) bool {
	_, err := catchup.ParseFilter([]string{p})
	return err == nil
}
