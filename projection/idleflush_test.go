package projection_test

import (
	"testing"
	"time"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/projection"
)

// TestIdleObserverFlushesOnTime: a caught-up observer writes its buffered
// checkpoint within CheckpointInterval of its last event even when the poll
// interval is much longer. The last event here comes shortly after a write,
// so the batch does not write it; the idle wait used to last the whole poll
// interval (20 s) before the write was looked at again, and the checkpoint
// (what Await, status and the console's health read) stayed behind for it.
func TestIdleObserverFlushesOnTime(t *testing.T) {
	t.Parallel()
	const interval = 500 * time.Millisecond
	const within = interval + 3*time.Second // far below the poll interval
	db := annalstest.NewDB(t, nil)
	h := liveHarnessOn(t, db.Pool)
	obs := &deliveryLog{name: "idle-obs"}
	h.run(h.newRunner(testConfig(20*time.Second), &projection.Options{CheckpointInterval: interval}, obs))
	annalstest.WaitFor(t, 10*time.Second, func() bool { return h.checkpoint("idle-obs") == 0 }) // leading

	head := h.appendEvents(2, 2)
	annalstest.WaitFor(t, within, func() bool { return h.checkpoint("idle-obs") == head })
	// Right after that write: the batch of this event finds no write due.
	head = h.appendEvents(1, 1)
	annalstest.WaitFor(t, 10*time.Second, func() bool { return len(obs.deliveries()) == 3 })
	annalstest.WaitFor(t, within, func() bool { return h.checkpoint("idle-obs") == head })
}
