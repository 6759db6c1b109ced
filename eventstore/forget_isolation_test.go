package eventstore_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
)

// TestForgetUnderRepeatableReadDefault: forget_subject refuses REPEATABLE
// READ and SERIALIZABLE (migration 0026: its delete of the subject's
// snapshots must see those committed while it waited for the forget
// lock). Store.Forget runs it READ COMMITTED itself, so a database or role
// whose default_transaction_isolation is stricter can still forget.
func TestForgetUnderRepeatableReadDefault(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, &annalstest.Options{PoolConfig: func(c *pgxpool.Config) {
		c.ConnConfig.RuntimeParams["default_transaction_isolation"] = "repeatable read"
	}})
	var iso string
	if err := db.Pool.QueryRow(ctx, "SHOW transaction_isolation").Scan(&iso); err != nil || iso != "repeatable read" {
		t.Fatalf("the pool's isolation: %q %v", iso, err)
	}
	s := personalStore(t, db, newKEK(t), nil)
	if _, err := s.Append(ctx, "customer-c-1", eventstore.NoStream, eventstore.NewEvent(ada("c-1"))); err != nil {
		t.Fatal(err)
	}
	res, err := s.Forget(ctx, "c-1")
	if err != nil || !res.HadKey {
		t.Fatalf("Forget under a REPEATABLE READ default: %+v %v", res, err)
	}
}
