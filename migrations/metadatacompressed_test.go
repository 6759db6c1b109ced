package migrations_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
)

// metadata_ok's short cut (no key listing for metadata of 256 bytes or
// less) measures the value as passed: a jsonb read from a table may be
// compressed, and 3 KB holding a 300-byte key then measures 65 bytes. Such
// metadata (delete_stream takes jsonb) must still be refused for its key.
func TestMetadataOKCompressed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	tbl := pgx.Identifier{db.Schema, "compressed_md"}.Sanitize()
	for _, s := range []string{
		"CREATE TABLE " + tbl + " (j jsonb)",
		"INSERT INTO " + tbl + " SELECT jsonb_build_object(repeat('k', 300), repeat('a', 3000))",
	} {
		if _, err := db.Pool.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	var compression *string
	var size int
	var ok bool
	if err := db.Pool.QueryRow(ctx, "SELECT pg_column_compression(j), pg_column_size(j), "+
		pgx.Identifier{db.Schema}.Sanitize()+".metadata_ok(j) FROM "+tbl).Scan(&compression, &size, &ok); err != nil {
		t.Fatal(err)
	}
	if compression == nil || size > 256 {
		t.Fatalf("the test's metadata is not stored compressed under 256 bytes (compression %v, %d bytes): it proves nothing", compression, size)
	}
	if ok {
		t.Error("metadata_ok accepts a compressed jsonb with a 300-byte key")
	}
}
