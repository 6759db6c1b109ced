package catchup

import (
	"slices"
	"testing"
	"time"
)

// The partitions that join a look at a holder (sameHolder): those of the
// subscriber that the same pid is seen holding, young runs too (a
// runner's partitions start waiting a poll or two apart on a loaded
// machine); not those of another subscriber or another pid, not those
// whose holder is unknown yet, and not those looked at within
// HolderWarnAfter. (That the WARN then names them all is
// projection.TestStandbyWarnsOncePerHolder's.)
func TestSameHolderJoinsTheLook(t *testing.T) {
	now := time.Now()
	const after = 200 * time.Millisecond
	old, young := now.Add(-time.Second), now.Add(-50*time.Millisecond)
	run := func(sub string, part int, pid int32, since, checked time.Time) *heldRun {
		return &heldRun{sub: &Subscription{Name: sub, Partition: part}, since: since, pid: pid, checked: checked}
	}
	runs := map[string]*heldRun{
		"seen:0":  run("seen", 0, 7, old, time.Time{}),
		"seen:2":  run("seen", 2, 7, old, time.Time{}),
		"seen:1":  run("seen", 1, 7, young, time.Time{}),       // joins: same holder, younger run
		"seen:3":  run("seen", 3, 8, young, time.Time{}),       // another holder
		"seen:4":  run("seen", 4, 0, young, time.Time{}),       // holder not known yet
		"seen:5":  run("seen", 5, 7, young, now.Add(-after/2)), // looked at a moment ago
		"other:0": run("other", 0, 7, young, time.Time{}),      // another subscriber
		"other:1": run("other", 1, 9, old, time.Time{}),        // due, another holder
	}
	held := map[string]int32{}
	for k, r := range runs {
		held[k] = r.pid
	}
	due := []string{"seen:0", "seen:2", "other:1"}
	got := sameHolder(runs, held, due, now, after)
	slices.Sort(got)
	if want := []string{"seen:1"}; !slices.Equal(got, want) {
		t.Fatalf("sameHolder = %v, want %v", got, want)
	}
	if got := sameHolder(runs, held, nil, now, after); got != nil {
		t.Fatalf("with nothing due, sameHolder = %v, want none", got)
	}
}
