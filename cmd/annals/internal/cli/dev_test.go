package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
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
