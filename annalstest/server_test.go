package annalstest

import (
	"context"
	"strings"
	"testing"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals/internal/pgcluster"
)

// fakeSources describes the machine to chooseServer.
type fakeSources struct {
	env       string
	binDir    string
	startErr  error
	providers []namedProvider
	started   int
}

func (f *fakeSources) sources() sources {
	return sources{
		getenv: func(k string) string {
			if k == EnvDatabaseURL {
				return f.env
			}
			return ""
		},
		findBinaries: func() (string, error) {
			if f.binDir == "" {
				return "", errors.Mark(errors.New("pgcluster: no PostgreSQL server binaries"), pgcluster.ErrNoBinaries)
			}
			return f.binDir, nil
		},
		startCluster: func(context.Context, string) (string, func(context.Context) error, error) {
			f.started++
			if f.startErr != nil {
				return "", nil, f.startErr
			}
			return "postgres://local", nil, nil
		},
		providers: func() []namedProvider { return f.providers },
	}
}

func provider(url string, err error) Provider {
	return func(context.Context) (string, func(context.Context) error, error) { return url, nil, err }
}

func TestChooseServer(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	t.Run("EnvFirst", func(t *testing.T) {
		f := &fakeSources{env: "postgres://env", binDir: "/bin"}
		url, _, _, err := chooseServer(ctx, f.sources())
		if err != nil || url != "postgres://env" || f.started != 0 {
			t.Fatalf("url = %q, err = %v, clusters started = %d", url, err, f.started)
		}
	})
	t.Run("LocalCluster", func(t *testing.T) {
		f := &fakeSources{binDir: "/bin", providers: []namedProvider{{"p", provider("postgres://p", nil)}}}
		url, _, _, err := chooseServer(ctx, f.sources())
		if err != nil || url != "postgres://local" {
			t.Fatalf("url = %q, err = %v", url, err)
		}
	})
	t.Run("LocalClusterFails", func(t *testing.T) {
		f := &fakeSources{binDir: "/bin", startErr: errors.New("boom"),
			providers: []namedProvider{{"p", provider("postgres://p", nil)}}}
		_, _, _, err := chooseServer(ctx, f.sources())
		if err == nil || !strings.Contains(err.Error(), "boom") || !strings.Contains(err.Error(), EnvDatabaseURL) {
			t.Fatalf("err = %v, want the start failure and a pointer to %s", err, EnvDatabaseURL)
		}
	})
	t.Run("ProviderFallback", func(t *testing.T) {
		f := &fakeSources{providers: []namedProvider{
			{"a", provider("", errors.New("no engine"))},
			{"b", provider("postgres://b", nil)},
		}}
		url, source, _, err := chooseServer(ctx, f.sources())
		if err != nil || url != "postgres://b" || source != "provider b" {
			t.Fatalf("url = %q, source = %q, err = %v", url, source, err)
		}
	})
	t.Run("NothingAvailable", func(t *testing.T) {
		f := &fakeSources{}
		_, _, _, err := chooseServer(ctx, f.sources())
		for _, want := range []string{EnvDatabaseURL, "apt-get install -y postgresql", "annalstest/pgcontainer"} {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("err = %v, want it to mention %q", err, want)
			}
		}
	})
	t.Run("ProvidersFail", func(t *testing.T) {
		f := &fakeSources{providers: []namedProvider{{"docker", provider("", errors.New("no engine"))}}}
		_, _, _, err := chooseServer(ctx, f.sources())
		for _, want := range []string{"provider docker failed: no engine", "apt-get install -y postgresql", EnvDatabaseURL} {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("err = %v, want it to mention %q", err, want)
			}
		}
	})
}

func TestOpenServerBadURL(t *testing.T) {
	t.Parallel()
	f := &fakeSources{env: "postgres://postgres@127.0.0.1:1/postgres?sslmode=disable&connect_timeout=2"}
	if _, err := openServer(t.Context(), f.sources()); err == nil || !strings.Contains(err.Error(), EnvDatabaseURL) {
		t.Fatalf("openServer with an unreachable server = %v, want an error naming %s", err, EnvDatabaseURL)
	}
}

func TestRegistry(t *testing.T) {
	t.Parallel()
	var r registry
	r.register("b", provider("b", nil))
	r.register("a", provider("a", nil))
	if got := r.list(); len(got) != 2 || got[0].name != "a" || got[1].name != "b" {
		t.Errorf("list = %v, want a, b", got)
	}
	for name, p := range map[string]Provider{"a": provider("", nil), "nil": nil} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("register(%q) did not panic", name)
				}
			}()
			r.register(name, p)
		}()
	}
}
