package catchup_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/pgcluster"
)

// committer is nopProcessor that commits each batch's checkpoint.
type committer struct{ nopProcessor }

func (committer) Process(ctx context.Context, lease *catchup.Lease, b catchup.Batch) (int64, error) {
	if err := lease.Do(ctx, func(conn *pgx.Conn) error { return lease.CommitConn(ctx, conn, true, b.Through) }); err != nil {
		return b.After, err
	}
	return b.Through, nil
}

// Through a transaction pooler that lets the lock session's start-up
// parameters through (PgBouncer with ignore_startup_parameters), a batch's
// commit can run on the very server session that holds the partition's
// lock (here the pooler has one): the commit's check that some session
// holds the lock then finds it free (the session's own lock does not stop
// its shared try) and refuses, and the partition stalls. That is a
// misconfiguration, not another leader: the engine says so at WARN, with
// the hint that session locks need a direct connection or a session-mode
// pooler (advisorylock.ErrPooledSession). It logged INFO "stopped leading:
// the partition was claimed by another leader or a rebuild".
func TestStoppedLeadingOnThePooledLockSessionWarns(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	store, err := eventstore.New(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	appendEvents(t, store, 10)
	via, _ := annalstest.PgBouncer(t, db.URL, &pgcluster.PgBouncerOptions{PoolSize: 1, IgnoreStartupParameters: pgcluster.LockSessionParameters})
	pc, err := pgxpool.ParseConfig(via)
	if err != nil {
		t.Fatal(err)
	}
	pc.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec // no statement kept on a session
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var logs annalstest.LogBuffer
	e, err := catchup.NewEngine(pool, nil, &catchup.Config{
		Owner: "pooled", PollInterval: 50 * time.Millisecond, RetryBackoff: time.Minute,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- e.Run(rctx, &catchup.Subscription{Name: "s", Processor: committer{}}) }()
	defer func() {
		stop()
		if err := <-ran; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	var line string
	defer func() {
		if t.Failed() {
			t.Logf("engine log:\n%s", logs.String())
		}
	}()
	annalstest.WaitFor(t, 20*time.Second, func() bool {
		for l := range strings.SplitSeq(logs.String(), "\n") {
			if strings.Contains(l, "stopped leading") {
				line = l
				return true
			}
		}
		return false
	})
	for _, want := range []string{"level=WARN", "session mode", "direct connection"} {
		if !strings.Contains(line, want) {
			t.Errorf("the log line of the stall lacks %q: %s", want, line)
		}
	}
	t.Log(line)
}
