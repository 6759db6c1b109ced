package scheduler

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
)

// A timer's owner is checked as a stream ID is: valid UTF-8, no control
// character, at most MaxOwnerBytes. ScheduleTimer refuses others with
// ErrInvalidTimer and stores nothing; they failed with bare SQLSTATEs
// (22021 for NUL and invalid UTF-8, 54000 for 10 KB that the owner index
// cannot hold) or, for a newline, were stored and broke the table of
// `annals schedule list`. CancelOwned refuses what PostgreSQL cannot take
// (NUL, invalid UTF-8; 22021 before) with ErrInvalidTimer, and cancels by
// any other owner, which a timer stored before the check may have.
func TestTimerOwnerChecked(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	s := newScheduler(t, db, nil)
	ctx := t.Context()
	at := time.Now().Add(time.Hour)
	schedule := func(owner string) error {
		_, err := s.ScheduleTimer(ctx, nil, Timer{At: at, StreamID: "s", Owner: owner, Events: []eventstore.EventData{ev("x", []int{1})}})
		return err
	}
	r := rand.New(rand.NewPCG(1, 2))
	random := make([]byte, 10_000) // incompressible: the owner index cannot hold it
	for i := range random {
		random[i] = byte('a' + r.IntN(26))
	}
	for name, owner := range map[string]string{
		"NUL":           "a\x00b",
		"invalid UTF-8": "a\xffb",
		"newline":       "saga:5:order:a\nb",
		"C1":            "a\u0085b",
		"DEL":           "a\x7fb",
		"over the cap":  strings.Repeat("é", MaxOwnerBytes/2) + "x",
		"10 KB":         string(random),
	} {
		if err := schedule(owner); !errors.Is(err, ErrInvalidTimer) {
			t.Errorf("%s: ScheduleTimer = %v, want ErrInvalidTimer", name, err)
		}
	}
	if n := timerRows(t, db); n != 0 {
		t.Fatalf("%d timers stored with refused owners", n)
	}
	for _, owner := range []string{"saga:5:order:o-17", strings.Repeat("é", MaxOwnerBytes/2), "日本語 owner"} {
		if err := schedule(owner); err != nil {
			t.Errorf("ScheduleTimer with owner %.20q: %v", owner, err)
		}
		if n, err := s.CancelOwned(ctx, nil, owner); err != nil || n != 1 {
			t.Errorf("CancelOwned(%.20q) = %d, %v; want 1", owner, n, err)
		}
	}

	for _, owner := range []string{"a\x00b", "a\xffb"} {
		if n, err := s.CancelOwned(ctx, nil, owner); !errors.Is(err, ErrInvalidTimer) {
			t.Errorf("CancelOwned(%q) = %d, %v; want ErrInvalidTimer", owner, n, err)
		}
	}
	// An owner stored before ScheduleTimer checked it is cancelled by it.
	id, err := s.ScheduleTimer(ctx, nil, Timer{At: at, StreamID: "s", Owner: "old", Events: []eventstore.EventData{ev("x", []int{1})}})
	if err != nil {
		t.Fatal(err)
	}
	legacy := "saga:5:order:a\nb" + strings.Repeat("a", 5000) // compressible: the index holds it
	if _, err := db.Pool.Exec(ctx, `UPDATE annals.timers SET owner = $2 WHERE id = $1`, id, legacy); err != nil {
		t.Fatal(err)
	}
	if n, err := s.CancelOwned(ctx, nil, legacy); err != nil || n != 1 {
		t.Errorf("CancelOwned of an owner stored before the check = %d, %v; want 1", n, err)
	}
}
