package pgcontainer

import (
	"context"
	"os"

	"github.com/cockroachdb/errors"
	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/modules/postgres"

	"github.com/annals-dev/annals/annalstest"
)

// DefaultImage is the image [Start] runs unless EnvImage names another.
const DefaultImage = "postgres:17-alpine"

// EnvImage names the environment variable that overrides [DefaultImage].
const EnvImage = "ANNALS_TEST_POSTGRES_IMAGE"

// ProviderName is the name [Start] is registered under with annalstest.
const ProviderName = "testcontainers"

func init() { annalstest.RegisterProvider(ProviderName, Start) }

// Start runs PostgreSQL in a Docker container and returns its admin URL (user
// and database "postgres") and a function that removes the container. It
// fails, rather than panics, when no Docker engine is reachable. It is an
// [annalstest.Provider].
func Start(ctx context.Context) (adminURL string, stop func(context.Context) error, err error) {
	image := DefaultImage
	if v := os.Getenv(EnvImage); v != "" {
		image = v
	}
	// Some testcontainers paths panic when Docker cannot be found.
	defer func() {
		if r := recover(); r != nil {
			err = errors.Newf("pgcontainer: run %s: no reachable Docker engine (testcontainers: %v)", image, r)
		}
	}()
	c, err := postgres.Run(ctx, image,
		postgres.WithUsername("postgres"),
		postgres.WithPassword("postgres"),
		postgres.WithDatabase("postgres"),
		postgres.BasicWaitStrategies(),
		testcontainers.WithCmdArgs( // after the module's own "-c fsync=off"
			"-c", "wal_level=logical",
			"-c", "max_connections=300",
			"-c", "synchronous_commit=off",
			"-c", "full_page_writes=off",
		),
	)
	if err != nil {
		_ = testcontainers.TerminateContainer(c) // c is nil or half-started
		return "", nil, errors.Wrapf(err,
			"pgcontainer: run %s in Docker (is a Docker engine running and reachable, e.g. through DOCKER_HOST?)", image)
	}
	url, err := c.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		_ = testcontainers.TerminateContainer(c)
		return "", nil, errors.Wrap(err, "pgcontainer: read the container's address")
	}
	stop = func(ctx context.Context) error {
		return errors.Wrap(c.Terminate(ctx), "pgcontainer: remove the container")
	}
	return url, stop, nil
}
