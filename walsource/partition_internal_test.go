package walsource

import (
	"fmt"
	"strings"
	"testing"

	"github.com/annals-dev/annals/annalstest"
)

// TestStreamPartitionIsTheSQLs: streamPartition and the category cut give
// what annals.stream_partition and split_part give the engine's read, for
// ASCII, non-ASCII, empty and long keys and several partition counts.
func TestStreamPartitionIsTheSQLs(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	keys := []string{"", "-", "a", "order-1", "-x", "x-", "a-b-c", "é", "日本-東京", "tenant/42", "😀", strings.Repeat("long-", 100)}
	for i := range 300 {
		keys = append(keys, fmt.Sprintf("stream-%d", i), fmt.Sprintf("cat%d-%d", i%17, i))
	}
	for _, n := range []int{2, 3, 5, 16, 100} {
		rows, err := db.Pool.Query(t.Context(), `SELECT k, split_part(k, '-', 1), annals.stream_partition(k, $2), annals.stream_partition(split_part(k, '-', 1), $2)
			FROM unnest($1::text[]) k`, keys, n)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var k, category string
			var byStream, byCategory int
			if err := rows.Scan(&k, &category, &byStream, &byCategory); err != nil {
				t.Fatal(err)
			}
			cut, _, _ := strings.Cut(k, "-")
			if cut != category {
				t.Errorf("category of %q: %q, SQL says %q", k, cut, category)
			}
			if got := streamPartition(k, n); got != byStream {
				t.Errorf("streamPartition(%q, %d) = %d, SQL says %d", k, n, got, byStream)
			}
			if got := streamPartition(cut, n); got != byCategory {
				t.Errorf("streamPartition(%q, %d) = %d, SQL says %d", cut, n, got, byCategory)
			}
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
	}
}
