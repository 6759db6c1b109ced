package cli

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/annals-dev/annals/annalstest"
)

// TestDlqListPagesByCursor: the "more" line of dlq list gives --before, and
// the page it leads to repeats nothing and passes over nothing while dead
// letters come and go. The line said --offset 100: ten dead letters added
// meanwhile made that page list ten of the first one again, and a purged
// one made it pass over one. Scripts page --output json the same way,
// until the array is empty; the array keeps its shape.
func TestDlqListPagesByCursor(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	var all []string // newest first
	for i := range 25 {
		all = slices.Insert(all, 0, fmt.Sprint(dlqAdd(t, db, dlqRow{seq: int64(i + 1)})))
	}

	r := annals(t, db.URL, "dlq", "list", "--limit", "10")
	ids, more := listedIDs(t, r.stdout)
	if r.code != ExitOK || !slices.Equal(ids, all[:10]) || more != "(more: --before "+all[9]+")" {
		t.Fatalf("first page %v %q, want %v and --before %s:\n%+v", ids, more, all[:10], all[9], r)
	}
	seen := ids
	for i := range 10 {
		dlqAdd(t, db, dlqRow{seq: int64(100 + i)})
	}
	gone := all[12] // not listed yet: purged before its page
	sqlExec(t, db, `DELETE FROM annals.dead_letters WHERE id = ANY($1::bigint[])`, []string{all[2], gone})
	for more != "" {
		cursor := strings.TrimSuffix(strings.TrimPrefix(more, "(more: --before "), ")")
		r = annals(t, db.URL, "dlq", "list", "--limit", "10", "--before", cursor)
		if r.code != ExitOK {
			t.Fatalf("dlq list --before %s: %+v", cursor, r)
		}
		ids, more = listedIDs(t, r.stdout)
		seen = append(seen, ids...)
	}
	want := slices.DeleteFunc(slices.Clone(all), func(id string) bool { return id == gone })
	if !slices.Equal(seen, want) {
		t.Fatalf("paged by the more line: %v\nwant each once, newest first: %v", seen, want)
	}

	t.Run("JSON", func(t *testing.T) {
		var seen []int64
		var before int64
		for pages := 0; ; pages++ {
			args := []string{"dlq", "list", "--limit", "7", "--output", "json"}
			if before != 0 {
				args = append(args, "--before", fmt.Sprint(before))
			}
			r := annals(t, db.URL, args...)
			var page []JSONLDeadLetter
			if r.code != ExitOK || !strings.HasPrefix(r.stdout, "[") || json.Unmarshal([]byte(r.stdout), &page) != nil {
				t.Fatalf("dlq list %v: %+v", args, r)
			}
			if len(page) == 0 {
				if r.stdout != "[]\n" {
					t.Errorf("the empty page: %q, want []", r.stdout)
				}
				break
			}
			if pages > 10 {
				t.Fatal("the pages do not end")
			}
			for _, d := range page {
				seen = append(seen, d.ID)
			}
			before = page[len(page)-1].ID
		}
		var want []int64
		if err := db.Pool.QueryRow(t.Context(), `SELECT array_agg(id ORDER BY id DESC) FROM annals.dead_letters`).Scan(&want); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(seen, want) {
			t.Errorf("paged --output json by --before: %v, want %v", seen, want)
		}
	})
}
