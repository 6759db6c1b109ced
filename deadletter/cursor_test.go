package deadletter_test

import (
	"slices"
	"testing"
	"time"

	"github.com/annals-dev/annals/deadletter"
)

// TestDeadLetterListCursor: paging with Before lists every dead letter that
// was there at the first page exactly once, newest first, while dead letters
// are added and purged between the pages. Paged by Offset, the ten added
// after the first page pushed the ones it had shown onto the second page
// again, and a purged one pulled an unseen one back onto a page already read.
func TestDeadLetterListCursor(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	var all []int64 // newest first
	for i := range 30 {
		d := deadletter.DeadLetter{GlobalSequence: int64(i%50 + 1)}
		if i%3 == 0 {
			d.Subscriber = "mailer"
		}
		if i == 12 {
			// A creation time out of line with the ID (a clock stepped back):
			// the ID alone orders the list, so the cursor passes over nothing.
			d.CreatedAt = time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
		}
		all = slices.Insert(all, 0, b.add(t, d))
	}
	list := func(f deadletter.Filter) deadletter.Page {
		t.Helper()
		page, err := b.store.List(ctx, f)
		if err != nil {
			t.Fatalf("List(%+v): %v", f, err)
		}
		return page
	}

	t.Run("Everything", func(t *testing.T) {
		// Not parallel: it adds and deletes dead letters.
		page := list(deadletter.Filter{Limit: 10})
		if got := ids(page); !slices.Equal(got, all[:10]) || !page.More {
			t.Fatalf("first page %v more=%v, want %v more=true", got, page.More, all[:10])
		}
		seen := ids(page)
		// Meanwhile: 10 new dead letters, one already listed is purged, and
		// so is one not listed yet (it cannot be listed).
		var added []int64
		for i := range 10 {
			added = append(added, b.add(t, deadletter.DeadLetter{GlobalSequence: int64(i + 31)}))
		}
		gone := all[15]
		if _, err := b.db.Pool.Exec(ctx, `DELETE FROM annals.dead_letters WHERE id = ANY($1)`, []int64{all[3], gone}); err != nil {
			t.Fatal(err)
		}
		for page.More {
			page = list(deadletter.Filter{Limit: 10, Before: page.DeadLetters[len(page.DeadLetters)-1].ID})
			seen = append(seen, ids(page)...)
		}
		want := slices.DeleteFunc(slices.Clone(all), func(id int64) bool { return id == gone })
		if !slices.Equal(seen, want) {
			t.Fatalf("paged with Before: %v\nwant every dead letter there at the first page once, newest first: %v", seen, want)
		}
		// The newer pages from the first page's top reach the added ones.
		page = list(deadletter.Filter{Limit: 10, After: all[0]})
		slices.Reverse(added)
		if got := ids(page); !slices.Equal(got, added) || page.More {
			t.Fatalf("After the first page's top: %v more=%v, want %v more=false", got, page.More, added)
		}
	})

	t.Run("Filtered", func(t *testing.T) {
		var want []int64
		for _, d := range list(deadletter.Filter{Subscriber: "mailer", Limit: deadletter.MaxLimit}).DeadLetters {
			want = append(want, d.ID)
		}
		if len(want) < 5 {
			t.Fatalf("only %d dead letters of mailer", len(want))
		}
		var seen []int64
		f := deadletter.Filter{Subscriber: "mailer", Limit: 2}
		for {
			page := list(f)
			seen = append(seen, ids(page)...)
			if !page.More {
				break
			}
			f.Before = page.DeadLetters[len(page.DeadLetters)-1].ID
		}
		if !slices.Equal(seen, want) {
			t.Fatalf("mailer paged with Before: %v, want %v", seen, want)
		}
		// And back up with After from the oldest.
		seen = nil
		f = deadletter.Filter{Subscriber: "mailer", Limit: 2, After: want[len(want)-1]}
		for {
			page := list(f)
			seen = append(ids(page), seen...)
			if !page.More {
				break
			}
			f.After = page.DeadLetters[0].ID
		}
		if !slices.Equal(seen, want[:len(want)-1]) {
			t.Fatalf("mailer paged with After: %v, want %v", seen, want[:len(want)-1])
		}
	})
}
