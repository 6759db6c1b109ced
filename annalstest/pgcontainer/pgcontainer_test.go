package pgcontainer

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"
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
