// Package annalstest is the test harness of annals, for its own tests and
// for the tests of applications built on it: each test gets a fresh,
// migrated PostgreSQL database of its own.
//
//	func TestMain(m *testing.M) { annalstest.Main(m) }
//
//	func TestOpenAccount(t *testing.T) {
//		t.Parallel()
//		db := annalstest.NewDB(t, nil) // fresh, migrated; dropped when the test ends
//		_, err := db.Pool.Exec(t.Context(),
//			`SELECT * FROM annals.append_events('account-1', 0, '[{"type": "Opened", "data": {}}]')`)
//		if err != nil {
//			t.Fatal(err)
//		}
//		// Wait for background work (a projection, a subscriber) with a deadline:
//		annalstest.WaitFor(t, 5*time.Second, func() bool { return accounts(t, db) == 1 })
//	}
//
// # The server
//
// The first [NewDB] of a test binary chooses one PostgreSQL server for all
// its tests:
//
//  1. ANNALS_TEST_DATABASE_URL, when set: an admin URL of an existing server
//     (a superuser or a role with CREATEDB; its database is only used to
//     create and drop the test databases), e.g.
//     postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable.
//  2. Otherwise a throwaway cluster started from the local server binaries
//     (initdb and postgres on PATH or under /usr/lib/postgresql/*/bin), with
//     fsync off, in a temporary directory; [Main] stops it and deletes the
//     directory when the tests end. On Debian or Ubuntu the binaries come
//     from apt-get install -y postgresql.
//  3. Otherwise a registered [Provider]: blank-import
//     github.com/annals-dev/annals/annalstest/pgcontainer to run one in
//     Docker with testcontainers. The import keeps the Docker client out of
//     the builds of those who do not want it.
//  4. Otherwise every test that calls NewDB fails, saying how to install
//     PostgreSQL or set ANNALS_TEST_DATABASE_URL. The tests are not skipped:
//     a suite that silently tests nothing is worse than one that fails.
//
// A failure to start the server is reported to every test that asks.
//
// # Databases and templates
//
// NewDB does not run the migrations for each test. For each schema name it
// builds, once per server, a template database migrated with
// [migrations.Up], and each test's database is a copy of it (CREATE DATABASE
// ... TEMPLATE), which takes a few milliseconds. The template's name is a
// hash of the schema name and of every migration's SQL, so changing a
// migration builds a new template and never reuses a stale one.
//
// Building is safe when many tests and several test binaries (go test ./...
// runs packages in parallel processes) ask at once: builders take a session
// advisory lock in the admin database, check pg_database again, build the
// template under a temporary name (create, migrate, disconnect, forbid
// connections) and rename it to its final name, so a half-built template is
// never used. A temporary database left by a crashed build is dropped first.
// Templates stay on the server for the next run.
//
// When the test ends, the database's pool is closed and the database dropped
// (DROP DATABASE ... WITH (FORCE)). A connection of the pool that is still
// acquired a few seconds after the test ended (a transaction never committed
// or rolled back, rows never closed, a conn never released) fails the test
// with the number of such connections; the database is dropped anyway, which
// ends their sessions. Connections the test opened itself, outside the pool,
// do not block the drop either. PostgreSQL 13 or later is required.
//
// # Waiting
//
// [WaitFor] and [WaitForErr] poll a condition with a deadline. Tests use them
// instead of time.Sleep to wait for whatever happens in the background.
package annalstest
