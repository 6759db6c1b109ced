// Package childproc runs the test binary again as a child process, for tests
// that must kill a runner the way a crashed service dies: SIGKILL, no
// deferred call, no graceful release, only the kernel closing its sockets.
//
// The parent side is Start and the Child it returns (Kill, Freeze,
// SIGTERM, Term, WaitStopped, Log). The child side is Context, which ends
// the child when its parent goes away, and Pool, which tags every
// connection with the child's instance ID so that the parent can tell
// whose session holds a lock. A test package's TestMain decides, from an
// environment variable the parent sets, whether to run the tests or the
// child's main.
//
// Test support only: no production code imports it.
package childproc
