package projection_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/projection"
)

// TestBlueGreenCheckFailureWarnsOnceAMinute: a runner's blue/green rounds
// that keep failing the same way (here its role lost SELECT on
// read_model_generations while it ran) logged "blue/green check failed" at
// WARN every CheckInterval (a second by default), for as long as it
// lasted. It is a WARN once, DEBUG for the rounds within the minute, and an
// INFO once the rounds work again.
func TestBlueGreenCheckFailureWarnsOnceAMinute(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	pool := squatterPool(t, db)
	var role string
	if err := pool.QueryRow(ctx, `SELECT current_user`).Scan(&role); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `CREATE SCHEMA warnreads AUTHORIZATION `+pgx.Identifier{role}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = db.Pool.Exec(context.Background(), `DROP SCHEMA warnreads CASCADE`) })
	logs := &annalstest.LogBuffer{}
	r, err := projection.NewRunner(pool, &projection.Config{
		InstanceID: "checkwarn", Schema: db.Schema, PollInterval: 50 * time.Millisecond, RetryBackoff: 100 * time.Millisecond,
		ShutdownTimeout: 5 * time.Second, Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Register(statsProjection(1), &projection.Options{BlueGreen: &projection.BlueGreen{
		Version: 1, ReaderSchema: "warnreads", CheckInterval: 20 * time.Millisecond}}); err != nil {
		t.Fatal(err)
	}
	log := &bgLog{db: db}
	if err := log.add(ctx, 2, 2); err != nil {
		t.Fatal(err)
	}
	bgRunInBackground(t, r)
	annalstest.WaitFor(t, 20*time.Second, func() bool {
		m, err := readStats(ctx, pool, "warnreads.stats")
		return err == nil && len(m) == 2
	})

	gens := pgx.Identifier{db.Schema}.Sanitize() + `.read_model_generations`
	if _, err := db.Pool.Exec(ctx, `REVOKE SELECT ON `+gens+` FROM `+pgx.Identifier{role}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	count := func(msg string) int { return strings.Count(logs.String(), `msg="annals: `+msg) }
	// Many failed rounds: one WARN, the others at DEBUG.
	annalstest.WaitFor(t, 20*time.Second, func() bool {
		return count("blue/green check failed (the same failure") >= 10
	})
	if n := count(`blue/green check failed"`); n != 1 {
		t.Fatalf("%d WARNs of the failing rounds within the minute, want 1:\n%s", n, logs.String())
	}
	if _, err := db.Pool.Exec(ctx, `GRANT SELECT ON `+gens+` TO `+pgx.Identifier{role}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	annalstest.WaitFor(t, 20*time.Second, func() bool { return count("blue/green checks work again") == 1 })
	if err := log.add(ctx, 1, 2); err != nil {
		t.Fatal(err)
	}
	annalstest.WaitFor(t, 20*time.Second, func() bool {
		m, err := readStats(ctx, pool, "warnreads.stats")
		return err == nil && len(m) == 3
	})
}
