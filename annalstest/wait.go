package annalstest

import (
	"fmt"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
)

const (
	firstPoll = 5 * time.Millisecond
	maxPoll   = 100 * time.Millisecond
)

// WaitFor polls cond until it returns true, starting every 5 ms and backing
// off to every 100 ms. If cond is still false after timeout, it fails the test
// with t.Fatalf, naming the caller's file and line. Use it instead of
// time.Sleep to wait for something another goroutine or process does.
func WaitFor(t testing.TB, timeout time.Duration, cond func() bool) {
	t.Helper()
	if err := poll(timeout, func() (bool, error) { return cond(), nil }); err != nil {
		t.Fatalf("%s: WaitFor: condition still false after %v", caller(), timeout)
	}
}

// WaitForErr polls cond until it returns nil, like [WaitFor]. If cond still
// fails after timeout, it fails the test with t.Fatalf, naming the caller's
// file and line and quoting the last error.
func WaitForErr(t testing.TB, timeout time.Duration, cond func() error) {
	t.Helper()
	if err := poll(timeout, func() (bool, error) { err := cond(); return err == nil, err }); err != nil {
		t.Fatalf("%s: WaitForErr: still failing after %v: %v", caller(), timeout, err)
	}
}

// errTimeout stands for the last error of a condition that gave none.
var errTimeout = errors.New("timed out")

// poll calls cond with a backoff until it reports done or timeout passes, and
// returns nil or the last error.
func poll(timeout time.Duration, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	delay := firstPoll
	for {
		done, err := cond()
		if done {
			return nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			if err == nil {
				err = errTimeout
			}
			return err
		}
		time.Sleep(min(delay, left))
		delay = min(delay*2, maxPoll)
	}
}

// caller returns "file.go:123" for the caller of WaitFor or WaitForErr.
func caller() string {
	_, file, line, ok := runtime.Caller(2)
	if !ok {
		return "?"
	}
	return fmt.Sprintf("%s:%d", filepath.Base(file), line)
}
