package eventstore_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/schemaname"
)

// The schema's inline_stream_lock (migration 0034) takes the key the Go
// client took before it, so that processes of two versions take turns on one
// key during a rolling upgrade: for names with multi-byte characters and
// quotes too.
func TestInlineStreamLockKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, &annalstest.Options{Schema: `Inline "Ü"`})
	for _, stream := range []string{"order-1", "Ünïcode-流", `it's "quoted"`, ""} {
		err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SELECT "+schemaname.Ident(db.Schema)+".inline_stream_lock($1)", stream); err != nil {
				return err
			}
			var k1, k2 uint32
			if err := tx.QueryRow(ctx, `SELECT classid::oid::bigint, objid::oid::bigint FROM pg_locks
				 WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND objsubid = 2`).Scan(&k1, &k2); err != nil {
				return err
			}
			w1, w2 := eventstore.InlineLockKey(db.Schema, stream)
			if k1 != uint32(w1) || k2 != uint32(w2) {
				t.Errorf("stream %q: SQL took key (%d, %d), Go's is (%d, %d)", stream, k1, k2, uint32(w1), uint32(w2))
			}
			return nil
		})
		if err != nil {
			t.Fatalf("stream %q: %v", stream, err)
		}
	}
}
