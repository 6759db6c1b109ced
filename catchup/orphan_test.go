package catchup_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/internal/lockkey"
)

// TestOrphanedPartitionIsTaken: shares assume every live member takes what
// it is owed, but a member can be live and yet not take its partition (its
// goroutine still inside a batch of a leadership it lost). Here ten member
// slots are held by a session that takes nothing, so the one real instance
// is owed no partition of a one-partition subscriber; it must still lead it
// once the partition has stayed free past the grace, instead of leaving it
// unled for as long as the other members do not come for it.
func TestOrphanedPartitionIsTaken(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	const fake = 10
	// A name whose rotation does not give the one extra partition to the
	// real member: it takes slot 10 and so ranks 10 of 11 (see cycle).
	name := ""
	for i := 0; name == ""; i++ {
		n := fmt.Sprintf("orphan-%d", i)
		k1, _ := lockkey.Pair(n)
		if uint32(k1)%(fake+1) != fake {
			name = n
		}
	}
	conn, err := pgx.Connect(t.Context(), db.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	for i := range fake {
		k1, k2 := lockkey.Pair(fmt.Sprintf("annals:%s:member/%d", name, i))
		if _, err := conn.Exec(t.Context(), `SELECT pg_advisory_lock($1, $2)`, k1, k2); err != nil {
			t.Fatal(err)
		}
	}

	in := startInstance(t, db, "real", catchup.Config{})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		sub := &catchup.Subscription{Name: name, Partition: 0, Partitions: 1, Balance: true, Processor: nopProcessor{}}
		if err := in.engine.Run(ctx, sub); err != nil {
			t.Errorf("Run = %v", err)
		}
	}()
	start := time.Now()
	annalstest.WaitFor(t, 10*time.Second, func() bool {
		var owner string
		err := db.Pool.QueryRow(t.Context(), `SELECT coalesce(owner, '') FROM annals.checkpoints WHERE subscriber_id = $1 AND partition = 0`, name).Scan(&owner)
		return err == nil && owner == "real"
	})
	t.Logf("the orphaned partition was led after %v", time.Since(start).Round(time.Millisecond))
}
