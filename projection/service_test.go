package projection_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/projection"
)

// flakyService fails its first run, then runs until its context ends.
type flakyService struct {
	starts, stopped atomic.Int32
}

func (s *flakyService) Run(ctx context.Context) error {
	if s.starts.Add(1) == 1 {
		return errors.New("first run fails")
	}
	<-ctx.Done()
	s.stopped.Add(1)
	return nil
}

// funcService is a Service of a non-comparable type.
type funcService func(ctx context.Context) error

func (f funcService) Run(ctx context.Context) error { return f(ctx) }

func TestServiceRunsBesideSubscribers(t *testing.T) {
	t.Parallel()
	h := newLiveHarness(t)
	r, err := projection.NewRunner(h.pool, testConfig(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	svc := &flakyService{}
	if err := r.AddService("flaky", svc); err != nil {
		t.Fatal(err)
	}
	if err := r.AddService("flaky", svc); err != nil {
		t.Fatalf("adding the same service twice: %v", err)
	}
	if err := r.AddService("flaky-again", svc); err != nil {
		t.Fatalf("adding the same service under another name: %v", err)
	}
	if err := r.AddService("flaky", &flakyService{}); err == nil || !strings.Contains(err.Error(), "already added") {
		t.Fatalf("a different service under a used name: %v", err)
	}
	// Services of a type that cannot be compared are never taken for the
	// same one (comparing them would panic).
	wait := funcService(func(ctx context.Context) error { <-ctx.Done(); return nil })
	if err := r.AddService("func-1", wait); err != nil {
		t.Fatal(err)
	}
	if err := r.AddService("func-2", wait); err != nil {
		t.Fatal(err)
	}
	if err := r.AddService("", svc); err == nil {
		t.Fatal("empty name accepted")
	}
	if err := r.AddService("nil", (*flakyService)(nil)); err == nil {
		t.Fatal("nil service accepted")
	}
	// A runner with only a service runs it (no subscriber is needed).
	stop := h.run(r)
	annalstest.WaitFor(t, 10*time.Second, func() bool { return svc.starts.Load() >= 2 }) // restarted after its error
	stop()
	if got := svc.starts.Load(); got != 2 {
		t.Fatalf("the service ran %d times, want 2 (one failure, one run: added once)", got)
	}
	if got := svc.stopped.Load(); got != 1 {
		t.Fatalf("the service saw its context end %d times, want 1 (Run waits for it)", got)
	}
	if err := r.AddService("late", &flakyService{}); err != nil {
		t.Fatalf("AddService after Run returned: %v", err)
	}
}
