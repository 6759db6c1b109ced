// Package pgcluster runs a throwaway PostgreSQL cluster from the server
// binaries installed on the machine (initdb and postgres), for tests and for
// the dev and bench commands.
//
// [Start] makes a fresh temporary directory, runs initdb in it (trust
// authentication, superuser "postgres", UTF8, C locale), and runs postgres as
// a child process listening on 127.0.0.1 only, with its Unix socket inside the
// temporary directory, wal_level=logical, max_connections=300 and 64 WAL
// senders and replication slots (package walsource). By default
// durability is off (fsync, synchronous_commit and full_page_writes), which
// makes tests fast; [Options].Fsync turns it back on for benchmarks.
//
//	c, err := pgcluster.Start(ctx, nil)
//	if err != nil {
//		return err
//	}
//	defer c.Stop(context.Background())
//	pool, err := pgxpool.New(ctx, c.URL())
//
// # Lifecycle
//
// The server is not daemonized: it is a child of the Go process, in its own
// process group (so a Ctrl-C in the terminal reaches only the Go process), and
// on Linux it carries a parent-death signal (SIGQUIT), so the kernel stops it
// when the Go process dies, however it dies. [Cluster.Stop] asks for a fast
// shutdown (SIGINT), escalates to SIGQUIT and then SIGKILL for the whole
// process group if the server does not exit in time, and removes the
// directory. [Cluster.Restart] stops and starts the server on the same data
// directory and port, for tests of "PostgreSQL restarted under me".
//
// A process that dies without calling Stop leaves its directory behind. The
// owner holds an flock on a file in the directory for the cluster's whole
// life, so the next Start, in any process, removes directories whose lock is
// free and whose postmaster is gone.
//
// # Running as root
//
// PostgreSQL refuses to run as root. When the effective user is root, Start
// gives the directory to the "postgres" OS user and runs initdb and postgres
// with that user's credentials; it fails with a clear error when there is no
// such user.
//
// # PgBouncer
//
// [StartPgBouncer] runs PgBouncer (a binary found by [FindPgBouncer]) in
// front of a server, the same way: a child process in its own group, as the
// "postgres" OS user when we are root (PgBouncer refuses root too), on a
// free port, with trust authentication and the pool mode and size asked
// for. Tests use it to check what goes through a transaction-mode pooler.
//
// # Platforms
//
// Linux and the BSDs (including macOS) are supported; the parent-death signal
// exists only on Linux. Elsewhere Start returns an error.
package pgcluster
