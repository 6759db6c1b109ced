package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
)

// annals dev --output json prints, once the cluster is ready and migrated,
// one line holding a JSON object whose database_url connects to it; the
// cluster stops when the command's context ends. With a COMMAND, --output
// is a usage error.
func TestDevOutputJSON(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	pr, pw := io.Pipe()
	var errOut strings.Builder
	done := make(chan int, 1)
	go func() {
		code := run(runCtx, []string{"dev", "--fsync=false", "--output", "json"}, strings.NewReader(""), pw, &errOut, func(string) string { return "" })
		pw.Close()
		done <- code
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatalf("read the first line: %v (stderr %q)", err, errOut.String())
	}
	var ready struct {
		DatabaseURL string `json:"database_url"`
		Port        int    `json:"port"`
		DataDir     string `json:"data_dir"`
		Fsync       *bool  `json:"fsync"`
	}
	if err := json.Unmarshal([]byte(line), &ready); err != nil {
		t.Fatalf("first line %q is not a JSON object: %v", line, err)
	}
	if ready.DatabaseURL == "" || ready.Port == 0 || ready.DataDir == "" || ready.Fsync == nil || *ready.Fsync {
		t.Fatalf("dev --output json = %s", line)
	}
	conn, err := pgx.Connect(ctx, ready.DatabaseURL)
	if err != nil {
		t.Fatalf("connect to %s: %v", ready.DatabaseURL, err)
	}
	var n int
	err = conn.QueryRow(ctx, `SELECT count(*) FROM annals.events`).Scan(&n)
	conn.Close(ctx)
	if err != nil || n != 0 {
		t.Fatalf("the cluster is not migrated: %d events, %v", n, err)
	}
	stop()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("dev exited %d: %s", code, errOut.String())
		}
	case <-ctx.Done():
		t.Fatal("dev did not stop after its context ended")
	}
	if _, err := pgx.Connect(ctx, ready.DatabaseURL); err == nil {
		t.Fatal("the cluster still accepts connections after dev stopped")
	}

	r := annals(t, "", "dev", "--output", "json", "--", "true")
	if r.code != ExitUsage || !strings.Contains(r.stderr, "--output applies without COMMAND") {
		t.Fatalf("dev --output json -- true: %+v", r)
	}
}

// annals dev --replica starts a streaming replica of the migrated cluster
// beside it: --output json gives its URL as read_url, the replica is in
// recovery, has the schema and replays what the primary commits, and it
// stops with the command. --replica-port without --replica is a usage
// error.
func TestDevReplica(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	pr, pw := io.Pipe()
	var errOut lockedBuilder
	done := make(chan int, 1)
	go func() {
		code := run(runCtx, []string{"dev", "--fsync=false", "--replica", "--output", "json"}, strings.NewReader(""), pw, &errOut, func(string) string { return "" })
		pw.Close()
		done <- code
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatalf("read the first line: %v (stderr %q)", err, errOut.String())
	}
	var ready struct {
		DatabaseURL string `json:"database_url"`
		ReadURL     string `json:"read_url"`
		ReadPort    int    `json:"read_port"`
	}
	if err := json.Unmarshal([]byte(line), &ready); err != nil {
		t.Fatalf("first line %q is not a JSON object: %v", line, err)
	}
	if ready.ReadURL == "" || ready.ReadPort == 0 || ready.ReadURL == ready.DatabaseURL {
		t.Fatalf("dev --replica --output json = %s", line)
	}
	primary, err := pgx.Connect(ctx, ready.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	defer primary.Close(context.Background())
	replica, err := pgx.Connect(ctx, ready.ReadURL)
	if err != nil {
		t.Fatalf("connect to the replica %s: %v", ready.ReadURL, err)
	}
	var inRecovery bool
	if err := replica.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&inRecovery); err != nil || !inRecovery {
		t.Fatalf("the replica is not a standby: in recovery %v, %v", inRecovery, err)
	}
	if _, err := primary.Exec(ctx, `SELECT annals.append_events('dev-replica', NULL, '[{"type": "t", "data": {}}]'::jsonb)`); err != nil {
		t.Fatal(err)
	}
	annalstest.WaitFor(t, 30*time.Second, func() bool {
		var n int
		if err := replica.QueryRow(ctx, `SELECT count(*) FROM annals.events WHERE stream_id = 'dev-replica'`).Scan(&n); err != nil {
			t.Fatalf("read the replica: %v", err)
		}
		return n == 1
	})
	replica.Close(ctx)
	stop()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("dev exited %d: %s", code, errOut.String())
		}
	case <-ctx.Done():
		t.Fatal("dev did not stop after its context ended")
	}
	if c, err := pgx.Connect(ctx, ready.ReadURL); err == nil {
		c.Close(ctx)
		t.Fatal("the replica still accepts connections after dev stopped")
	}

	r := annals(t, "", "dev", "--replica-port", "1", "--", "true")
	if r.code != ExitUsage || !strings.Contains(r.stderr, "--replica-port needs --replica") {
		t.Fatalf("dev --replica-port 1 -- true: %+v", r)
	}
}

// lockedBuilder is a strings.Builder that a command writes to while the
// test may read it.
type lockedBuilder struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuilder) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuilder) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// annals dev -- COMMAND without --replica gives the command no
// DATABASE_READ_URL, not even one of its own environment (it would name
// another cluster's replica); with --replica, its replica's. Not parallel:
// it sets the environment the command inherits.
func TestDevReadURLOnlyOfItsReplica(t *testing.T) {
	t.Setenv("DATABASE_READ_URL", "postgres://elsewhere.invalid/db")
	r := annals(t, "", "dev", "--fsync=false", "--", "sh", "-c", `test -z "$DATABASE_READ_URL"`)
	if r.code != 0 {
		t.Fatalf("dev -- sh: DATABASE_READ_URL was passed on from the environment: %+v", r)
	}
	r = annals(t, "", "dev", "--fsync=false", "--replica", "--", "sh", "-c", `test -n "$DATABASE_READ_URL" && test "$DATABASE_READ_URL" != postgres://elsewhere.invalid/db`)
	if r.code != 0 {
		t.Fatalf("dev --replica -- sh: DATABASE_READ_URL is not the replica's: %+v", r)
	}
}
