package catchup_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/eventstore"
)

// progressLog keeps the last OnProgress report.
type progressLog struct {
	mu           sync.Mutex
	calls        int
	cursor, head int64
	oldest       time.Time
}

func (l *progressLog) report(_ string, _ int, cursor, head int64, oldest time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls++
	l.cursor, l.head, l.oldest = cursor, head, oldest
}

func (l *progressLog) last() (cursor, head int64, oldest time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cursor, l.head, l.oldest
}

// After a batch that reaches the head, OnProgress reports the subscription
// caught up (cursor = head, no oldest unprocessed event), although no read
// follows: the engine waits idle for the next signal (a long PollInterval
// here). It used to report only before each batch, with the cursor the
// batch started from, so the lag gauges stayed at the batch's size until
// the next event or poll.
func TestProgressAfterBatch(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	store, err := eventstore.New(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	listener, err := catchup.NewListener(db.Pool.Config().ConnConfig, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	lctx, stopListener := context.WithCancel(ctx)
	defer stopListener()
	go func() { _ = listener.Run(lctx) }()
	progress := &progressLog{}
	e, err := catchup.NewEngine(db.Pool, listener, &catchup.Config{PollInterval: time.Minute, OnProgress: progress.report})
	if err != nil {
		t.Fatal(err)
	}
	p := &signalProcessor{got: make(chan struct{}, 1)}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- e.Run(rctx, &catchup.Subscription{Name: "progress", Processor: p}) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	// Leading and caught up with the empty log.
	annalstest.WaitFor(t, 10*time.Second, func() bool {
		progress.mu.Lock()
		defer progress.mu.Unlock()
		return progress.calls > 0
	})

	events := make([]eventstore.EventData, 10)
	for i := range events {
		events[i] = eventstore.EventData{Type: "t.x", Data: map[string]int{"i": i}}
	}
	res, err := store.Append(ctx, "s-1", eventstore.Any, events...)
	if err != nil {
		t.Fatal(err)
	}
	head := res.Events[len(res.Events)-1].GlobalSequence
	select {
	case <-p.got:
	case <-time.After(10 * time.Second):
		t.Fatal("the batch was not delivered within 10 s")
	}
	annalstest.WaitFor(t, 5*time.Second, func() bool {
		cursor, h, oldest := progress.last()
		return cursor == head && h == head && oldest.IsZero()
	})
}
