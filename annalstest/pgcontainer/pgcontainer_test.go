package pgcontainer

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/migrations"
)

// There is no Docker engine where these tests run, so they check the one
// thing that must hold everywhere: without an engine, Start fails quickly
// with an error that says what is missing, and does not panic.
func TestStartWithoutDocker(t *testing.T) {
	// t.Setenv: not parallel. testcontainers also looks in ~/.docker and
	// ~/.testcontainers.properties, so HOME points at an empty directory.
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("XDG_RUNTIME_DIR", home)
	t.Setenv("DOCKER_CONTEXT", "")
	t.Setenv("DOCKER_HOST", "unix://"+filepath.Join(home, "no-such-docker.sock"))
	t.Setenv("TESTCONTAINERS_RYUK_DISABLED", "true")

	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	start := time.Now()
	url, stop, err := Start(ctx)
	took := time.Since(start)
	t.Logf("Start without Docker failed after %v: %v", took, err)
	if err == nil {
		if stop != nil {
			_ = stop(context.Background())
		}
		t.Fatalf("Start without a Docker engine returned %q", url)
	}
	if !strings.Contains(err.Error(), "Docker") {
		t.Errorf("error does not mention Docker: %v", err)
	}
	if took > 15*time.Second {
		t.Errorf("Start took %v to notice there is no Docker engine", took)
	}
}

// dockerReachable reports whether a Docker engine answers on the socket
// testcontainers would use first (DOCKER_HOST when it names a unix socket,
// else /var/run/docker.sock).
func dockerReachable() (string, bool) {
	sock := "/var/run/docker.sock"
	if h := os.Getenv("DOCKER_HOST"); strings.HasPrefix(h, "unix://") {
		sock = strings.TrimPrefix(h, "unix://")
	} else if h != "" {
		c, err := net.DialTimeout("tcp", strings.TrimPrefix(h, "tcp://"), 2*time.Second)
		if err != nil {
			return h, false
		}
		_ = c.Close()
		return h, true
	}
	c, err := net.DialTimeout("unix", sock, 2*time.Second)
	if err != nil {
		return sock, false
	}
	_ = c.Close()
	return sock, true
}

// TestStartWithDocker runs the real thing where a Docker engine is
// reachable: a container starts, annals migrates its database and appends
// and reads an event, and the container is removed. Where no engine answers
// it says so in the test log and checks that Start reports exactly that.
func TestStartWithDocker(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	where, ok := dockerReachable()
	if !ok {
		t.Logf("no Docker engine answers at %s: checking that Start says so instead of starting PostgreSQL", where)
		_, stop, err := Start(ctx)
		if err == nil {
			_ = stop(context.Background())
			t.Fatal("Start succeeded although no Docker engine answered")
		}
		if !strings.Contains(err.Error(), "Docker") {
			t.Fatalf("error does not mention Docker: %v", err)
		}
		return
	}
	t.Logf("Docker engine at %s: starting %s", where, DefaultImage)
	url, stop, err := Start(ctx)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	defer func() {
		if err := stop(context.Background()); err != nil {
			t.Errorf("stop: %v", err)
		}
	}()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer pool.Close()
	if _, err := migrations.Up(ctx, pool, nil); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	store, err := eventstore.New(pool, nil)
	if err != nil {
		t.Fatalf("store: %v", err)
	}
	ev := eventstore.EventData{Type: "Tested", Data: []byte(`{"in":"docker"}`)}
	if _, err := store.Append(ctx, "container-1", eventstore.NoStream, ev); err != nil {
		t.Fatalf("append: %v", err)
	}
	var types []string
	for ev, err := range store.ReadStream(ctx, "container-1", 0) {
		if err != nil {
			t.Fatalf("read back: %v", err)
		}
		types = append(types, ev.Type)
	}
	if len(types) != 1 || types[0] != "Tested" {
		t.Fatalf("read back %v, want [Tested]", types)
	}
}
