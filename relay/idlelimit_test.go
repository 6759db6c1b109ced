package relay_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/advisorylock"
	"github.com/annals-dev/annals/relay"
)

// The relay's checkpoint commits, which hold the checkpoint's row, may
// idle between their statements for the lock's FreezeTimeout at most
// (idle_in_transaction_session_timeout, local to each): a relay frozen in
// the middle of one has that transaction ended by the server when its lock
// session is, so the next leader's claim of the row does not wait for the
// frozen process. FreezeTimeout -1 sets nothing. A trigger on relay_acks,
// which every commit writes, records the setting each commit runs under.
func TestRelayCommitsIdleLimit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		freeze time.Duration
		want   string
	}{
		{"freeze timeout", 7 * time.Second, "7s"},
		{"default", 0, "30s"},
		{"none", -1, "0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			if _, err := b.db.Pool.Exec(ctx, `
				CREATE TABLE commit_settings (setting text NOT NULL);
				CREATE FUNCTION record_setting() RETURNS trigger LANGUAGE plpgsql AS $$
				BEGIN
				    INSERT INTO commit_settings VALUES (current_setting('idle_in_transaction_session_timeout'));
				    RETURN NEW;
				END $$;
				CREATE TRIGGER record_setting BEFORE INSERT OR UPDATE ON annals.relay_acks
				    FOR EACH ROW EXECUTE FUNCTION record_setting();`); err != nil {
				t.Fatal(err)
			}
			appendMany(t, b.store, 20)
			r, err := relay.New(b.db.Pool, b.nc, &relay.Config{BatchSize: 7, Lock: &advisorylock.Config{FreezeTimeout: tc.freeze}})
			if err != nil {
				t.Fatal(err)
			}
			if err := r.CatchUp(ctx); err != nil {
				t.Fatal(err)
			}
			rows, err := b.db.Pool.Query(ctx, `SELECT setting FROM commit_settings`)
			if err != nil {
				t.Fatal(err)
			}
			got, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				t.Fatal(err)
			}
			if len(got) == 0 {
				t.Fatal("no checkpoint commit wrote relay_acks")
			}
			for i, s := range got {
				if s != tc.want {
					t.Errorf("commit %d ran with idle_in_transaction_session_timeout %q, want %q", i+1, s, tc.want)
				}
			}
		})
	}
}
