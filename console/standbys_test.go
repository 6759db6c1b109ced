package console_test

import (
	"fmt"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/console"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/pgcluster"
	"github.com/annals-dev/annals/migrations"
)

// TestStandbysShown: the instances page lists the physical standbys
// streaming from the server (the read replica of a runner's ReadPool) with
// how far behind each has replayed, as `annals status` does, and /metrics
// has them; a logical walsender (what annals' WAL sources run) is no
// standby; a role without pg_read_all_stats sees that there is one, its
// details hidden, and is told why. A cluster of its own: a replica of the
// shared test cluster would replay every other test's WAL.
func TestStandbysShown(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	cluster, pool := annalstest.PrivateCluster(t, ctx, nil)
	if _, err := migrations.Up(ctx, pool, nil); err != nil {
		t.Fatal(err)
	}
	serve := func(p *pgxpool.Pool) (*client, string) {
		con, err := console.New(p, nil)
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(con)
		t.Cleanup(srv.Close)
		return &client{t: t, base: srv.URL, hc: srv.Client()}, srv.URL + "/metrics"
	}
	c, metricsURL := serve(pool)
	if _, body := c.get("/instances"); strings.Contains(body, "Standbys") || strings.Contains(body, `id="standbys"`) {
		t.Errorf("/instances lists standbys before there is one:\n%s", body)
	}
	if v, ok := value(scrape(t, metricsURL), "annals_standbys", nil); !ok || v != 0 {
		t.Errorf("annals_standbys before any: %v (%v), want 0", v, ok)
	}

	replica, err := pgcluster.StartReplica(ctx, cluster.URL(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = replica.Stop(t.Context()) })
	store, err := eventstore.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Append(ctx, "s-1", eventstore.NoStream, eventstore.EventData{Type: "t.x", Data: map[string]int{"n": 1}}); err != nil {
		t.Fatal(err)
	}
	var (
		app, addr string
		pid       int32
	)
	annalstest.WaitFor(t, 30*time.Second, func() bool {
		err := pool.QueryRow(ctx, `SELECT application_name, host(client_addr), pid FROM pg_stat_replication
			WHERE state = 'streaming' AND replay_lsn = pg_current_wal_lsn()`).Scan(&app, &addr, &pid)
		return err == nil
	})
	// The lag may have moved since (PostgreSQL's own background WAL).
	// Its lag time is "-" for a moment when new WAL follows an idle spell
	// (PostgreSQL has not measured it yet).
	want := regexp.MustCompile(fmt.Sprintf(`^%s %d %s streaming async [0-9,]+ bytes ([0-9.a-z]+|-)$`,
		regexp.QuoteMeta(app), pid, regexp.QuoteMeta(addr)))
	if r := c.row("/instances", app, strconv.Itoa(int(pid))); !want.MatchString(r) {
		t.Errorf("/instances standby row %q, want %s", r, want)
	}
	_, body := c.get("/instances")
	for _, w := range []string{"<h2>Standbys</h2>", `id="standbys"`, "<th>Replay lag</th><th>Replay lag time</th>"} {
		if !strings.Contains(body, w) {
			t.Errorf("/instances lacks %q", w)
		}
	}
	if strings.Contains(body, "pg_read_all_stats") {
		t.Errorf("/instances says details are hidden from a superuser")
	}
	standby := map[string]string{"standby": app, "pid": strconv.Itoa(int(pid))}
	// The lag time is absent for a moment when new WAL follows an idle
	// spell (not measured yet): poll until a scrape has both.
	annalstest.WaitForErr(t, 30*time.Second, func() error {
		fams := scrape(t, metricsURL)
		if v, ok := value(fams, "annals_standbys", nil); !ok || v != 1 {
			return fmt.Errorf("annals_standbys: %v (%v), want 1", v, ok)
		}
		if v, ok := value(fams, "annals_standby_replay_lag_bytes", standby); !ok || v < 0 {
			return fmt.Errorf("annals_standby_replay_lag_bytes%v: %v (%v), want >= 0", standby, v, ok)
		}
		if _, ok := value(fams, "annals_standby_replay_lag_seconds", standby); !ok {
			return fmt.Errorf("no annals_standby_replay_lag_seconds%v", standby)
		}
		return nil
	})

	// A logical walsender (what annals' WAL sources run) is no standby.
	bin, err := pgcluster.FindBinaries()
	if err != nil {
		t.Fatal(err)
	}
	recv := exec.CommandContext(ctx, filepath.Join(bin, "pg_recvlogical"), "-d", cluster.URL(), "-S", "console_logical",
		"--create-slot", "--start", "-P", "test_decoding", "--if-not-exists", "-f", os.DevNull)
	if err := recv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = recv.Process.Kill(); _ = recv.Wait() })
	// Once its walsender streams from the slot (pg_recvlogical creates the
	// slot first, which no walsender holds for a moment after).
	annalstest.WaitFor(t, 30*time.Second, func() bool {
		var n, logical int
		err := pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE EXISTS (SELECT FROM pg_replication_slots s
			WHERE s.active_pid = r.pid AND s.slot_type = 'logical' AND r.state = 'streaming'))
			FROM pg_stat_replication r`).Scan(&n, &logical)
		return err == nil && n == 2 && logical == 1
	})
	if _, body := c.get("/instances"); strings.Count(body, "<tr>")-1 != 1 {
		t.Errorf("/instances with a logical walsender streaming too: want one standby row:\n%s", body)
	}
	if v, _ := value(scrape(t, metricsURL), "annals_standbys", nil); v != 1 {
		t.Errorf("annals_standbys with a logical walsender streaming too: %v, want 1", v)
	}

	// A reader role: it sees a standby, not its details, and is told why.
	if _, err := pool.Exec(ctx, `CREATE ROLE console_standby_reader LOGIN`); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Grant(ctx, pool, "console_standby_reader", migrations.Reader, nil); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(cluster.URL())
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User("console_standby_reader")
	rpool, err := pgxpool.New(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rpool.Close)
	rc, rmetrics := serve(rpool)
	// PostgreSQL shows every role a backend's application_name, not its
	// address or the walsender's state.
	// (The row's text runs on to the note under the table.)
	if r, w := rc.row("/instances", app, strconv.Itoa(int(pid))), fmt.Sprintf("%s %d - - - - -", app, pid); r != w && !strings.HasPrefix(r, w+" A standby's") {
		t.Errorf("/instances standby row as a reader: %q", r)
	}
	if _, body := rc.get("/instances"); !strings.Contains(body, "hidden from this role: grant it pg_read_all_stats") {
		t.Errorf("/instances as a reader does not say why the details are hidden:\n%s", body)
	}
	fams := scrape(t, rmetrics)
	if v, ok := value(fams, "annals_standbys", nil); !ok || v != 1 {
		t.Errorf("annals_standbys as a reader: %v (%v), want 1", v, ok)
	}
	if v, ok := value(fams, "annals_standby_replay_lag_bytes", nil); ok {
		t.Errorf("annals_standby_replay_lag_bytes as a reader: %v, want none (hidden)", v)
	}
}
