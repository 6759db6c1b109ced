package pgcluster

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
)

// startCluster starts a cluster that is stopped when the test ends.
func startCluster(t *testing.T, opts *Options) *Cluster {
	t.Helper()
	c, err := Start(t.Context(), opts)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Stop(context.Background()); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
	return c
}

func connect(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

func show(t *testing.T, conn *pgx.Conn, setting string) string {
	t.Helper()
	var v string
	if err := conn.QueryRow(t.Context(), "SELECT current_setting($1)", setting).Scan(&v); err != nil {
		t.Fatalf("current_setting(%s): %v", setting, err)
	}
	return v
}

// waitUntil polls cond with a deadline; the package cannot use annalstest,
// which imports it.
func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for delay := 5 * time.Millisecond; !cond(); delay = min(delay*2, 100*time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not true after %v", what, timeout)
		}
		time.Sleep(delay)
	}
}

func TestFindBinaries(t *testing.T) {
	t.Parallel()
	dir, err := FindBinaries()
	if err != nil {
		t.Fatalf("FindBinaries: %v", err)
	}
	if !hasServerBinaries(dir) {
		t.Fatalf("FindBinaries returned %s, which lacks initdb or postgres", dir)
	}
}

func TestVersionLess(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		a, b string
		want bool
	}{
		{"/usr/lib/postgresql/9.6/bin", "/usr/lib/postgresql/10/bin", true},
		{"/usr/lib/postgresql/15/bin", "/usr/lib/postgresql/9.6/bin", false},
		{"/usr/lib/postgresql/15/bin", "/usr/lib/postgresql/17/bin", true},
		{"/usr/lib/postgresql/17/bin", "/usr/lib/postgresql/17/bin", false},
	} {
		if got := versionLess(tc.a, tc.b); got != tc.want {
			t.Errorf("versionLess(%s, %s) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}

func TestStartDefaults(t *testing.T) {
	t.Parallel()
	c := startCluster(t, &Options{Settings: map[string]string{"work_mem": "7MB"}})
	if want := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.Port()); c.URL() != want {
		t.Errorf("URL() = %s, want %s", c.URL(), want)
	}
	conn := connect(t, c.URL())
	var one int
	if err := conn.QueryRow(t.Context(), "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("SELECT 1 = %d, %v", one, err)
	}
	for setting, want := range map[string]string{
		"wal_level":          "logical",
		"max_connections":    "300",
		"listen_addresses":   "127.0.0.1",
		"fsync":              "off",
		"synchronous_commit": "off",
		"full_page_writes":   "off",
		"work_mem":           "7MB",
		"server_encoding":    "UTF8",
		"lc_collate":         "C",
	} {
		if got := show(t, conn, setting); got != want {
			t.Errorf("SHOW %s = %q, want %q", setting, got, want)
		}
	}
	if got := show(t, conn, "unix_socket_directories"); got != filepath.Dir(c.DataDir()) {
		t.Errorf("unix_socket_directories = %q, want the cluster's directory %q", got, filepath.Dir(c.DataDir()))
	}
	if _, err := os.Stat(filepath.Join(c.DataDir(), "PG_VERSION")); err != nil {
		t.Errorf("DataDir() %s is not a data directory: %v", c.DataDir(), err)
	}
	reapStale(testLogger(t))
	if _, err := os.Stat(c.DataDir()); err != nil {
		t.Errorf("reapStale removed a live cluster: %v", err)
	}
}

func TestStartFsyncOnFixedPort(t *testing.T) {
	t.Parallel()
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	c := startCluster(t, &Options{Fsync: true, Port: port})
	if c.Port() != port {
		t.Errorf("Port() = %d, want %d", c.Port(), port)
	}
	conn := connect(t, c.URL())
	for setting, want := range map[string]string{"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on"} {
		if got := show(t, conn, setting); got != want {
			t.Errorf("SHOW %s = %q, want %q", setting, got, want)
		}
	}
}

func TestRestartKeepsData(t *testing.T) {
	t.Parallel()
	c := startCluster(t, nil)
	ctx := t.Context()
	before := connect(t, c.URL())
	if _, err := before.Exec(ctx, "CREATE TABLE kept (v text); INSERT INTO kept VALUES ('still here')"); err != nil {
		t.Fatal(err)
	}
	port := c.Port()
	if err := c.Restart(ctx); err != nil {
		t.Fatalf("Restart: %v", err)
	}
	if c.Port() != port {
		t.Errorf("port changed across Restart: %d -> %d", port, c.Port())
	}
	if err := before.Ping(ctx); err == nil {
		t.Error("a connection from before the restart still works")
	}
	var v string
	if err := connect(t, c.URL()).QueryRow(ctx, "SELECT v FROM kept").Scan(&v); err != nil || v != "still here" {
		t.Fatalf("after Restart: v = %q, err = %v", v, err)
	}
}

func TestStopIsIdempotentAndConcurrent(t *testing.T) {
	t.Parallel()
	c, err := Start(t.Context(), nil)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	dir := filepath.Dir(c.DataDir())
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Go(func() { errs[i] = c.Stop(context.Background()) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("Stop #%d: %v", i, err)
		}
	}
	if err := c.Stop(context.Background()); err != nil {
		t.Errorf("Stop after Stop: %v", err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("directory %s still exists after Stop (stat: %v)", dir, err)
	}
	if err := c.Restart(t.Context()); !errors.Is(err, ErrStopped) {
		t.Errorf("Restart after Stop = %v, want ErrStopped", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	if conn, err := pgx.Connect(ctx, c.URL()); err == nil {
		_ = conn.Close(ctx)
		t.Error("the server still accepts connections after Stop")
	}
}

func TestStopWithCancelledContext(t *testing.T) {
	t.Parallel()
	c, err := Start(t.Context(), nil)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := c.Stop(ctx); err != nil {
		t.Fatalf("Stop(cancelled ctx): %v", err)
	}
	if _, err := os.Stat(c.DataDir()); !os.IsNotExist(err) {
		t.Errorf("data directory still exists after Stop (stat: %v)", err)
	}
}

func TestStartBadBinDir(t *testing.T) {
	t.Parallel()
	_, err := Start(t.Context(), &Options{BinDir: t.TempDir()})
	if !errors.Is(err, ErrNoBinaries) {
		t.Fatalf("Start with an empty BinDir = %v, want ErrNoBinaries", err)
	}
}

func TestStartFailureShowsServerLog(t *testing.T) {
	t.Parallel()
	_, err := Start(t.Context(), &Options{Settings: map[string]string{"no_such_setting": "1"}})
	if err == nil {
		t.Fatal("Start with an unknown setting succeeded")
	}
	t.Logf("error: %v", err)
	if !strings.Contains(err.Error(), "no_such_setting") {
		t.Errorf("error does not quote the server log: %v", err)
	}
}

func TestStartPortTaken(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	_, err = Start(t.Context(), &Options{Port: l.Addr().(*net.TCPAddr).Port})
	if !errors.Is(err, errAddrInUse) {
		t.Fatalf("Start on a taken port = %v, want errAddrInUse", err)
	}
}

// A port on which another PostgreSQL answers is taken too: the startup
// fails with errAddrInUse when the new server cannot bind it, instead of
// reporting the other server, which answers first, as ready.
func TestStartPortTakenByAnotherServer(t *testing.T) {
	t.Parallel()
	other := startCluster(t, nil)
	_, err := Start(t.Context(), &Options{Port: other.Port()})
	if !errors.Is(err, errAddrInUse) {
		t.Fatalf("Start on the port of a running cluster = %v, want errAddrInUse", err)
	}
}
