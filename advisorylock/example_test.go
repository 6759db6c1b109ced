package advisorylock_test

import (
	"context"
	"fmt"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/advisorylock"
)

// A process competes for leadership of one key: a standby retries, the
// leader does its fenced work on the lock's connection until it loses the
// lock or shuts down.
func ExampleTryAcquire() {
	ctx := context.Background()
	connConfig, err := pgx.ParseConfig("postgres://app@db.internal:5432/app")
	if err != nil {
		panic(err)
	}
	for ctx.Err() == nil {
		lock, err := advisorylock.TryAcquire(ctx, connConfig, "annals:orders:0", nil)
		if errors.Is(err, advisorylock.ErrNotAcquired) {
			time.Sleep(2 * time.Second) // a standby; add jitter in real code
			continue
		}
		if err != nil {
			panic(err)
		}
		lead(ctx, lock)
		_ = lock.Release(ctx)
	}
}

func lead(ctx context.Context, lock *advisorylock.Lock) {
	for {
		err := lock.Do(ctx, func(conn *pgx.Conn) error {
			// Commits only while this session holds the lock.
			return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, "UPDATE order_totals SET total = total + 1 WHERE order_id = 42")
				return err
			})
		})
		if err != nil {
			fmt.Println("stepping down:", err)
			return
		}
		select {
		case <-lock.Lost():
			fmt.Println("lost:", lock.Err())
			return
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}
