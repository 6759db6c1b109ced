//go:build darwin || freebsd || netbsd || openbsd || dragonfly

package pgcluster

import "syscall"

// setDeathSignal does nothing: only Linux has a parent-death signal.
func setDeathSignal(*syscall.SysProcAttr, syscall.Signal) {}

// zombie reports false: without /proc, a zombie counts as alive.
func zombie(int) bool { return false }

// groupAlive reports false: without /proc, Crash does not wait for the
// backends.
func groupAlive(int) bool { return false }

// shmAttached reports false: without /proc, Crash does not wait for the old
// shared memory to be detached.
func shmAttached(int) bool { return false }
