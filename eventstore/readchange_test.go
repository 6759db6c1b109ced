package eventstore_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals/eventstore"
)

// TestReadStreamThatChangesWhileRead: ReadStream reads a page per query,
// so a stream may change between two pages. A deletion, a deletion and a
// recreation, and a truncation past the next version end the read with
// ErrStreamChanged. Before, the read silently ended early (deleted), mixed
// the old and the new stream (versions [1 2 7 8] for a recreated one) or
// skipped versions (truncated). Appends meanwhile, and a stream that ends
// on a page's end, read as before.
func TestReadStreamThatChangesWhileRead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, &eventstore.Config{PageSize: 2})
	stream := func(name string, n int) {
		t.Helper()
		for range n {
			if _, err := b.store.Append(ctx, name, eventstore.Any, placed(name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	// read reads name, calling change once after version 2 (the end of
	// the first page): the versions it yielded and the error it ended with.
	read := func(name string, change func()) ([]int64, error) {
		var got []int64
		for e, err := range b.store.ReadStream(ctx, name, 0) {
			if err != nil {
				return got, err
			}
			got = append(got, e.StreamVersion)
			if e.StreamVersion == 2 && change != nil {
				change()
			}
		}
		return got, nil
	}
	del := func(name string) {
		if _, err := b.store.DeleteStream(ctx, name, eventstore.Any, nil); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		name    string
		change  func(name string)
		deleted bool
	}{
		{"deleted", del, true},
		{"recreated", func(name string) {
			del(name) // its "$stream.deleted" event is version 6
			if _, err := b.store.Append(ctx, name, eventstore.Exact(6), placed(name), placed(name)); err != nil {
				t.Fatal(err)
			}
		}, false},
		{"truncated", func(name string) {
			four := int64(4)
			if _, err := b.store.SetStreamRetention(ctx, name, eventstore.RetentionChange{TruncateBefore: &four}); err != nil {
				t.Fatal(err)
			}
		}, false},
	} {
		name := "changed-" + c.name
		stream(name, 5)
		got, err := read(name, func() { c.change(name) })
		if !errors.Is(err, eventstore.ErrStreamChanged) || errors.Is(err, eventstore.ErrStreamDeleted) != c.deleted || fmt.Sprint(got) != "[1 2]" {
			t.Errorf("%s: read %v, ended with %v; want [1 2] and ErrStreamChanged (ErrStreamDeleted %v)", c.name, got, err, c.deleted)
		}
	}
	// Unchanged, or only appended to: read to the end.
	stream("four", 4)
	if got, err := read("four", nil); err != nil || fmt.Sprint(got) != "[1 2 3 4]" {
		t.Errorf("a stream ending on a page's end: %v, %v", got, err)
	}
	stream("growing", 3)
	if got, err := read("growing", func() { stream("growing", 2) }); err != nil || fmt.Sprint(got) != "[1 2 3 4 5]" {
		t.Errorf("a stream appended to while read: %v, %v", got, err)
	}
}
