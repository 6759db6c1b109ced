package console_test

import (
	"net/url"
	"strconv"
	"strings"
	"testing"
)

// TestActionsRetryADeadlock: a console action whose transaction PostgreSQL
// aborts as a deadlock victim (40P01) changed nothing, and is run again, as
// the CLI's actions are (pgtx.Retrying): an operator's checkpoint move and
// a runner's re-delivery lock the checkpoint row and the dead letters in
// opposite orders. Here a trigger on audit_log raises 40P01 at the first
// entry of each action; each action must still succeed once, with one
// audit entry whose counts are those of the attempt that committed.
func TestActionsRetryADeadlock(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	f.stopRunner()
	ctx := t.Context()
	if _, err := f.db.Pool.Exec(ctx, `
		CREATE SEQUENCE public.deadlock_once;
		CREATE FUNCTION public.deadlock_once() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF nextval('public.deadlock_once') % 2 = 1 THEN
				RAISE EXCEPTION 'deadlock detected (test)' USING ERRCODE = '40P01';
			END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER deadlock_once BEFORE INSERT ON annals.audit_log
			FOR EACH ROW EXECUTE FUNCTION public.deadlock_once();`); err != nil {
		t.Fatal(err)
	}
	op := f.client(t)
	tok := op.login("ada")
	post := func(path string, form url.Values) string { t.Helper(); return op.act(tok, path, form) }
	id := strconv.FormatInt(f.dlID, 10)
	if msg := post("/dead-letters/retry", url.Values{"id": {id}}); !strings.HasPrefix(msg, "1 dead letter(s) marked for re-delivery, 0 skipped") {
		t.Errorf("retry: %q", msg)
	}
	if msg := post("/subscribers/mailer/checkpoint", url.Values{"partition": {"0"}, "position": {"0"}, "confirm": {"yes"}}); !strings.Contains(msg, "→ 0") {
		t.Errorf("checkpoint set: %q", msg)
	}
	var actions []string
	for _, e := range auditLog(t, f.db) {
		actions = append(actions, e.Action)
		if e.Action == "dlq.retry" && !strings.Contains(e.Detail, `"retried": [`+id+`]`) {
			t.Errorf("retry's entry: %s", e.Detail)
		}
	}
	if got := strings.Join(actions, ","); got != "dlq.retry,checkpoint.set" {
		t.Errorf("audit entries %q; want one of each", got)
	}
}
