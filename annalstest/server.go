package annalstest

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/internal/pgcluster"
)

// EnvDatabaseURL names the environment variable that points the harness at an
// existing server. Its value is an admin URL: the harness connects to it to
// create and drop databases, so its role must be a superuser or have
// CREATEDB, and its database is not touched otherwise.
const EnvDatabaseURL = "ANNALS_TEST_DATABASE_URL"

const (
	minServerVersion = 130000 // DROP DATABASE ... WITH (FORCE)
	clusterStartFor  = 2 * time.Minute
	providerStartFor = 10 * time.Minute // may pull an image
	stopFor          = 30 * time.Second
)

// server is the PostgreSQL server of this test binary.
type server struct {
	adminURL  string
	source    string // where it came from, for messages
	admin     *pgxpool.Pool
	stop      func(context.Context) error
	templates sync.Map // template name -> *templateState
}

// The server is chosen once per test binary. sync.Once keeps the error too,
// so every test that asks after a failure fails with the same message.
var (
	serverOnce   sync.Once
	theServer    *server
	theServerErr error
	shutdownOnce sync.Once
)

func getServer() (*server, error) {
	serverOnce.Do(func() {
		theServer, theServerErr = openServer(context.Background(), defaultSources())
	})
	return theServer, theServerErr
}

// Main runs the tests of a package and then stops the server the harness
// started for them, if any, and exits with the tests' code:
//
//	func TestMain(m *testing.M) { annalstest.Main(m) }
//
// Without it the harness works the same, and on Linux a local cluster still
// dies with the test process (its parent-death signal), but its temporary
// directory is only removed by a later run, and a provider's server (a
// container) is left to the provider's own reaper.
func Main(m *testing.M) {
	code := m.Run()
	if err := shutdown(); err != nil {
		fmt.Fprintf(os.Stderr, "annalstest: %v\n", err)
	}
	os.Exit(code)
}

// shutdown closes the admin pool and stops the server the harness started.
func shutdown() error {
	var err error
	shutdownOnce.Do(func() {
		// Make sure no test can start the server after this point.
		serverOnce.Do(func() { theServerErr = errors.New("annalstest: the harness has shut down") })
		if theServer == nil {
			return
		}
		theServer.admin.Close()
		if theServer.stop != nil {
			ctx, cancel := context.WithTimeout(context.Background(), stopFor)
			defer cancel()
			err = errors.Wrapf(theServer.stop(ctx), "stop the server from %s", theServer.source)
		}
	})
	return err
}

// sources are the ways to get a server, replaceable in tests.
type sources struct {
	getenv       func(string) string
	findBinaries func() (string, error)
	startCluster func(ctx context.Context, binDir string) (url string, stop func(context.Context) error, err error)
	providers    func() []namedProvider
}

func defaultSources() sources {
	return sources{
		getenv:       os.Getenv,
		findBinaries: pgcluster.FindBinaries,
		startCluster: func(ctx context.Context, binDir string) (string, func(context.Context) error, error) {
			c, err := pgcluster.Start(ctx, &pgcluster.Options{BinDir: binDir})
			if err != nil {
				return "", nil, err
			}
			return c.URL(), c.Stop, nil
		},
		providers: providers.list,
	}
}

// chooseServer returns an admin URL: from ANNALS_TEST_DATABASE_URL, else a
// throwaway local cluster, else the first registered provider that works.
func chooseServer(ctx context.Context, s sources) (url, source string, stop func(context.Context) error, err error) {
	if url := s.getenv(EnvDatabaseURL); url != "" {
		return url, EnvDatabaseURL, nil, nil
	}
	if binDir, err := s.findBinaries(); err == nil {
		cctx, cancel := context.WithTimeout(ctx, clusterStartFor)
		defer cancel()
		url, stop, err := s.startCluster(cctx, binDir)
		if err != nil {
			return "", "", nil, errors.Wrapf(err, "annalstest: start a throwaway PostgreSQL from %s "+
				"(or set %s to use an existing server)", binDir, EnvDatabaseURL)
		}
		return url, "a throwaway cluster from " + binDir, stop, nil
	}
	var failed []string
	for _, np := range s.providers() {
		pctx, cancel := context.WithTimeout(ctx, providerStartFor)
		url, stop, err := np.p(pctx)
		cancel()
		if err == nil {
			return url, "provider " + np.name, stop, nil
		}
		failed = append(failed, fmt.Sprintf("provider %s failed: %v", np.name, err))
	}
	msg := fmt.Sprintf("annalstest: no PostgreSQL server for the tests: %s is not set, "+
		"and there are no PostgreSQL server binaries (initdb and postgres) on PATH or under /usr/lib/postgresql/*/bin",
		EnvDatabaseURL)
	if len(failed) > 0 {
		msg += "; " + strings.Join(failed, "; ")
	}
	msg += fmt.Sprintf(".\nTo fix it, install the PostgreSQL server (%s), or set %s to an admin URL of a server "+
		"(e.g. %s=postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable)",
		pgcluster.InstallHint, EnvDatabaseURL, EnvDatabaseURL)
	if len(failed) == 0 {
		msg += ", or blank-import github.com/annals-dev/annals/annalstest/pgcontainer to run one in Docker"
	}
	return "", "", nil, errors.New(msg)
}

// openServer chooses the server and connects to its admin database.
func openServer(ctx context.Context, s sources) (*server, error) {
	url, source, stop, err := chooseServer(ctx, s)
	if err != nil {
		return nil, err
	}
	srv := &server{adminURL: url, source: source, stop: stop}
	fail := func(err error) (*server, error) {
		if stop != nil {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stopFor)
			defer cancel()
			err = errors.CombineErrors(err, stop(sctx))
		}
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return fail(errors.Wrapf(err, "annalstest: parse the admin URL from %s", source))
	}
	if srv.admin, err = pgxpool.NewWithConfig(cctx, cfg); err != nil {
		return fail(errors.Wrapf(err, "annalstest: connect to the server from %s", source))
	}
	var version int
	if err := srv.admin.QueryRow(cctx, queries()["ServerVersion"]).Scan(&version); err != nil {
		srv.admin.Close()
		return fail(errors.Wrapf(err, "annalstest: connect to the server from %s", source))
	}
	if version < minServerVersion {
		srv.admin.Close()
		return fail(errors.Newf("annalstest: the server from %s is PostgreSQL %d; at least 13 is needed", source, version/10000))
	}
	return srv, nil
}
