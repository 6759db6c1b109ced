package relay_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/relay"
)

// TestRelayRewoundOverAScavengedEvent: an event scavenged by retention at
// the binary search's first probe (20), far below where the stream and the
// log last agree (30), tells nothing: the search judges by the next
// message. (Taken as not agreeing, it made the answer 19, and stopped
// consumers at 20 to 30, which had handled only events the log kept.)
func TestRelayRewoundOverAScavengedEvent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	appendMany(t, b.store, 40)
	r, err := relay.New(b.db.Pool, b.nc, &relay.Config{RetryBackoff: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL session_replication_role = replica`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `DELETE FROM annals.events WHERE global_sequence = 20`) // scavenged
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	annalstest.RewindLog(t, b.db.Pool, "annals", 30)
	appendMany(t, b.store, 5)
	err = r.CatchUp(ctx)
	if !errors.Is(err, relay.ErrStreamMismatch) || !strings.Contains(err.Error(), "last agree at position 30") {
		_, _, at := recordedRewind(t, b.db.Pool)
		t.Fatalf("recorded at %d; want 30: %v", at, err)
	}
}
