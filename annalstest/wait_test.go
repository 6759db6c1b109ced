package annalstest

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// fakeTB records Fatalf instead of failing the test. Methods it does not
// define panic (the embedded TB is nil).
type fakeTB struct {
	testing.TB
	fatals []string
}

func (f *fakeTB) Helper() {}

func (f *fakeTB) Fatalf(format string, args ...any) {
	f.fatals = append(f.fatals, fmt.Sprintf(format, args...))
	panic(fatalPanic{}) // like runtime.Goexit in the real one: stop the caller
}

type fatalPanic struct{}

// runFake runs fn, which may stop at a fake Fatalf.
func runFake(ft *fakeTB, fn func()) {
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(fatalPanic); !ok {
				panic(r)
			}
		}
	}()
	fn()
}

func TestWaitForSucceeds(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	start := time.Now()
	WaitFor(t, 5*time.Second, func() bool { return calls.Add(1) >= 4 })
	if calls.Load() != 4 {
		t.Errorf("cond called %d times, want 4", calls.Load())
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("took %v for 4 polls; the backoff starts too slow", took)
	}
}

func TestWaitForTimeout(t *testing.T) {
	t.Parallel()
	ft := &fakeTB{}
	start := time.Now()
	runFake(ft, func() { WaitFor(ft, 50*time.Millisecond, func() bool { return false }) })
	if took := time.Since(start); took < 50*time.Millisecond || took > 2*time.Second {
		t.Errorf("WaitFor gave up after %v, want about 50ms", took)
	}
	if len(ft.fatals) != 1 || !strings.Contains(ft.fatals[0], "wait_test.go:") {
		t.Fatalf("fatals = %q, want one naming wait_test.go:LINE", ft.fatals)
	}
}

func TestWaitForErr(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	WaitForErr(t, 5*time.Second, func() error {
		if calls.Add(1) < 3 {
			return errors.New("not yet")
		}
		return nil
	})
	ft := &fakeTB{}
	runFake(ft, func() {
		WaitForErr(ft, 30*time.Millisecond, func() error { return errors.New("still broken") })
	})
	if len(ft.fatals) != 1 || !strings.Contains(ft.fatals[0], "still broken") || !strings.Contains(ft.fatals[0], "wait_test.go:") {
		t.Fatalf("fatals = %q, want one naming wait_test.go:LINE and the last error", ft.fatals)
	}
}
