package aggregate_test

import (
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/archive"
	"github.com/annals-dev/annals/eventstore"
)

// forget_subject reads only the events of streams that have a snapshot
// (migration 0031): a Forget on a large log does not scan all of it while
// it holds the forget lock. Its result stays the same: the snapshots of the
// subject's streams go, those in the archive included, and no other.
func TestForgetReadsOnlySnapshottedStreams(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	p := setupPersonal(t, 1)
	const secret = "Grace Hopper Secret"
	p.register(t, "c-1", secret) // position 1, snapshotted
	// c-1's registration goes to the archive: the scan must look there too.
	a, err := archive.New(p.db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.RunOnce(ctx, 2); err != nil {
		t.Fatal(err)
	}
	p.register(t, "c-2", "Kept Customer") // snapshotted, another subject
	// Many streams with personal data and no snapshot.
	const others = 2000
	for i := range others / 100 {
		evs := make([]eventstore.EventData, 0, 100)
		for j := range 100 {
			evs = append(evs, eventstore.NewEvent(Registered{CustomerID: fmt.Sprintf("o-%d", j%10), Name: "Someone"}))
		}
		if _, err := p.store.Append(ctx, fmt.Sprintf("bulk-%d", i), eventstore.NoStream, evs...); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := p.db.Pool.Exec(ctx, "ANALYZE annals.events; ANALYZE annals.events_archive; ANALYZE annals.snapshots"); err != nil {
		t.Fatal(err)
	}
	if n := p.inSnapshots(t, secret); n != 1 {
		t.Fatalf("c-1's name in %d snapshots before the Forget, want 1", n)
	}

	var had bool
	var deleted, read int64
	err = pgx.BeginTxFunc(ctx, p.db.Pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, "SELECT had_key, snapshots_deleted FROM annals.forget_subject('c-1')").Scan(&had, &deleted); err != nil {
			return err
		}
		// The tuples this transaction read from the hot events table.
		return tx.QueryRow(ctx, `SELECT coalesce(sum(coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0)), 0)
			FROM pg_stat_xact_user_tables WHERE schemaname = 'annals' AND relname = 'events'`).Scan(&read)
	})
	if err != nil {
		t.Fatal(err)
	}
	if !had || deleted != 1 {
		t.Fatalf("forget_subject: had_key %v, snapshots_deleted %d; want true, 1", had, deleted)
	}
	if read > 100 {
		t.Fatalf("forget_subject read %d rows of events (the log holds %d): it scanned streams without snapshots", read, others+1)
	}
	if n := p.inSnapshots(t, secret); n != 0 {
		t.Fatalf("c-1's name in %d snapshots after the Forget", n)
	}
	if n := p.inSnapshots(t, "Kept Customer"); n != 1 {
		t.Fatalf("c-2's snapshot: %d rows hold its name, want 1", n)
	}
}
