package projection_test

import (
	"context"
	"testing"

	"github.com/annals-dev/annals"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

// The OnDeadLetter hook (and the dead-letter metric) count dead letters
// that committed: when the database refuses the first write of a dead
// letter, the batch is tried again and the hook is called once, for the
// write that committed. It was called before the write, once per try.
func TestFailureDeadLetterHookAfterCommit(t *testing.T) {
	t.Parallel()
	for _, k := range failKinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			h := newFailHarness(t)
			if _, err := h.pool.Exec(t.Context(), `
				CREATE SEQUENCE refuse_once;
				CREATE FUNCTION refuse_once() RETURNS trigger LANGUAGE plpgsql AS $$
				BEGIN
				  IF nextval('refuse_once') = 1 THEN
				    RAISE EXCEPTION 'disk full (simulated)' USING ERRCODE = '53100';
				  END IF;
				  RETURN NEW;
				END $$;
				CREATE TRIGGER refuse_once BEFORE INSERT ON annals.dead_letters
				   FOR EACH ROW EXECUTE FUNCTION refuse_once();`); err != nil {
				t.Fatal(err)
			}
			sub, _ := h.handler(k, "hook", func(context.Context, eventstore.Event, int) error {
				return annals.Permanent(context.DeadlineExceeded)
			})
			run := h.newRunner(projection.RetryPolicy{}, -1, failReg{sub, nil})
			h.start(run)
			evs := h.appendTo("a")
			h.waitFor(failWait, "the dead letter", func() bool { return len(h.deadLetters("hook")) == 1 })
			if n := h.queryInt(`SELECT last_value FROM refuse_once`); n < 2 {
				t.Fatalf("the trigger saw %d inserts, want the refused one and the committed one", n)
			}
			h.waitFor(failWait, "the hook", func() bool { _, dls := run.hooks.calls(); return len(dls) > 0 })
			_, dls := run.hooks.calls()
			if len(dls) != 1 || dls[0].Pos != evs[0].Pos || dls[0].Reason != "failed" {
				t.Errorf("OnDeadLetter calls %+v, want one, for %v, reason failed", dls, evs[0])
			}
		})
	}
}
