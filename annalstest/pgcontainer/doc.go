// Package pgcontainer lets annalstest run PostgreSQL in Docker, through
// testcontainers-go, on machines that have neither the PostgreSQL server
// binaries nor ANNALS_TEST_DATABASE_URL. Import it for its side effect, in a
// test file:
//
//	import _ "github.com/annals-dev/annals/annalstest/pgcontainer"
//
//	func TestMain(m *testing.M) { annalstest.Main(m) }
//
// The import registers [Start] as an annalstest provider; it is used only
// when the other two ways to get a server are unavailable, and [annalstest.Main]
// stops the container when the tests end (testcontainers' reaper removes it
// if the process dies first). Keeping this in its own package keeps the
// Docker client out of the builds of everyone who does not import it.
//
// The image is postgres:17-alpine unless ANNALS_TEST_POSTGRES_IMAGE names
// another; the server runs with fsync off, wal_level=logical and
// max_connections=300, like the harness's local clusters. Docker is found the
// way testcontainers finds it (DOCKER_HOST, the Docker context, the default
// socket, ~/.testcontainers.properties).
package pgcontainer
