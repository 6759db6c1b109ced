package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/testkit"
)

func TestMain(m *testing.M) { annalstest.Main(m) }

// The Account's rules with the test kit's Given/When/Then: given its
// history, a command records these events, or is refused with this error.
// WithRegistry sends every event through JSON and the registry, as the
// store would.
func TestAccountRules(t *testing.T) {
	t.Parallel()
	reg := newRegistry()
	opened := AccountOpened{Owner: "Ann"}
	given := func(t *testing.T, history ...any) *testkit.AggregateScenario[*Account] {
		return testkit.Given(t, newAccount, history...).WithID("a").WithRegistry(reg)
	}
	t.Run("Open", func(t *testing.T) {
		t.Parallel()
		acc := given(t).When(func(a *Account) error { return a.OpenAccount("Ann") }).Then(opened)
		if !acc.Open || acc.Owner != "Ann" {
			t.Errorf("after opening: %+v", acc)
		}
		given(t, opened).When(func(a *Account) error { return a.OpenAccount("Ann") }).ThenError(ErrAlreadyOpen)
		given(t).When(func(a *Account) error { return a.OpenAccount("") }).ThenError(ErrNoOwner)
	})
	t.Run("Deposit", func(t *testing.T) {
		t.Parallel()
		given(t, opened).When(func(a *Account) error { return a.Deposit(5_00) }).Then(MoneyDeposited{Amount: 5_00})
		given(t).When(func(a *Account) error { return a.Deposit(5_00) }).ThenError(ErrNotOpen)
		given(t, opened).When(func(a *Account) error { return a.Deposit(0) }).ThenError(ErrInvalidAmount)
	})
	t.Run("Withdraw", func(t *testing.T) {
		t.Parallel()
		history := []any{opened, MoneyDeposited{Amount: 10_00}, MoneyWithdrawn{Amount: 4_00}}
		acc := given(t, history...).When(func(a *Account) error { return a.Withdraw(6_00) }).Then(MoneyWithdrawn{Amount: 6_00})
		if acc.Balance != 0 {
			t.Errorf("balance after withdrawing everything = %s", money(acc.Balance))
		}
		// Insufficient funds: one cent more than the balance is refused.
		given(t, history...).When(func(a *Account) error { return a.Withdraw(6_01) }).ThenError(ErrInsufficientFunds)
		given(t, opened).When(func(a *Account) error { return a.Withdraw(-1) }).ThenError(ErrInvalidAmount)
		given(t).When(func(a *Account) error { return a.Withdraw(1) }).ThenError(ErrNotOpen)
	})
}

// The balances projection, replayed with the test kit into a fresh
// database: its OnSetup creates bank_balances, so the test needs no set-up.
func TestBalancesProjection(t *testing.T) {
	t.Parallel()
	reg := newRegistry()
	r := testkit.ReplayProjection(t, newBalances(reg), &testkit.ReplayOptions{Registry: reg},
		testkit.Stream("account-a", AccountOpened{Owner: "Ann"}, MoneyDeposited{Amount: 100_00}),
		testkit.Stream("account-b", AccountOpened{Owner: "Bob"}, MoneyDeposited{Amount: 5_00}),
		testkit.Stream("account-a", MoneyWithdrawn{Amount: 30_00}, MoneyDeposited{Amount: 1}),
	)
	want := []balanceRow{
		{AccountID: "a", Owner: "Ann", Balance: 70_01, Deposits: 2, Withdrawals: 1, Version: 4},
		{AccountID: "b", Owner: "Bob", Balance: 5_00, Deposits: 1, Withdrawals: 0, Version: 2},
	}
	if got := balances(t, r); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("bank_balances = %+v, want %+v", got, want)
	}

	// More events later: the projection continues from its checkpoint.
	r.Append(t, testkit.Stream("account-b", MoneyWithdrawn{Amount: 5_00}))
	want[1] = balanceRow{AccountID: "b", Owner: "Bob", Balance: 0, Deposits: 1, Withdrawals: 1, Version: 3}
	if got := balances(t, r); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("after Append, bank_balances = %+v, want %+v", got, want)
	}
}

func balances(t *testing.T, r *testkit.Replay) []balanceRow {
	t.Helper()
	rows, err := listBalances(t.Context(), r.Pool, "")
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

// recordingMailer remembers what was sent, deduplicating by key as
// logMailer does, and counts every call.
type recordingMailer struct {
	mu       sync.Mutex
	calls    int
	messages map[uuid.UUID]string
}

func (m *recordingMailer) Send(_ context.Context, key uuid.UUID, message string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls++
	if m.messages == nil {
		m.messages = map[uuid.UUID]string{}
	}
	m.messages[key] = message
	return nil
}

// The observer notifies large withdrawals only, keyed by the event ID, so a
// re-delivery (at-least-once) sends the same key again, which the mailer
// deduplicates.
func TestNotifier(t *testing.T) {
	t.Parallel()
	reg := newRegistry()
	mailer := &recordingMailer{}
	notifier := newNotifier(reg, mailer)
	r := testkit.ReplayProjection(t, notifier, &testkit.ReplayOptions{Registry: reg, Stream: "account-a"},
		AccountOpened{Owner: "Ann"}, MoneyDeposited{Amount: 5000_00},
		MoneyWithdrawn{Amount: largeWithdrawal - 1}, MoneyWithdrawn{Amount: largeWithdrawal}, MoneyWithdrawn{Amount: 2000_00})
	large := []uuid.UUID{r.Events[3].ID, r.Events[4].ID}
	want := map[uuid.UUID]string{
		large[0]: "large withdrawal of $1000.00 from account a",
		large[1]: "large withdrawal of $2000.00 from account a",
	}
	if fmt.Sprint(mailer.messages) != fmt.Sprint(want) || mailer.calls != 2 {
		t.Fatalf("sent %v in %d calls, want %v in 2", mailer.messages, mailer.calls, want)
	}

	// A re-delivery of a notified event uses the same idempotency key.
	if err := notifier.Handle(t.Context(), r.Events[3]); err != nil {
		t.Fatal(err)
	}
	if len(mailer.messages) != 2 || mailer.calls != 3 {
		t.Fatalf("after a re-delivery: %d keys in %d calls, want 2 keys in 3", len(mailer.messages), mailer.calls)
	}

	// The demo's mailer prints each key once.
	var out bytes.Buffer
	lm := newLogMailer(&out)
	for range 2 {
		if err := lm.Send(t.Context(), large[0], "hello"); err != nil {
			t.Fatal(err)
		}
	}
	if got := strings.Count(out.String(), "notification: hello"); got != 1 {
		t.Fatalf("logMailer printed %q: %d notifications, want 1", out.String(), got)
	}
}

// The demo (make demo) runs end to end against a fresh database, and again
// on the same database.
func TestDemoRuns(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, &annalstest.Options{Schema: "annals"})
	getenv := func(k string) string {
		if k == "DATABASE_URL" {
			return db.URL
		}
		return ""
	}
	for i, args := range [][]string{nil, {"demo"}} {
		var stdout, stderr bytes.Buffer
		if code := run(t.Context(), args, strings.NewReader(""), &stdout, &stderr, getenv); code != 0 {
			t.Fatalf("run %d: exit code %d\nstdout:\n%s\nstderr:\n%s", i+1, code, stdout.String(), stderr.String())
		}
		out := stdout.String()
		for _, want := range []string{
			"refused: withdraw $500.00 from bob-",
			": the balance is $300.00: insufficient funds",
			"already exists",
			"there is no account carol-",
			"notification: large withdrawal of $1200.00 from account alice-",
			"notification: large withdrawal of $1300.00 from account alice-",
			"bank_balances after the rebuild: the same",
			"The runner stopped gracefully",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("run %d: the output does not say %q:\n%s", i+1, want, out)
			}
		}
		if n := strings.Count(out, "notification:"); n != 2 {
			t.Errorf("run %d: %d notifications, want 2:\n%s", i+1, n, out)
		}
		// The read model's rows of this run.
		var rows []string
		for _, line := range strings.Split(out, "\n") {
			if f := strings.Fields(line); len(f) == 6 && (strings.HasPrefix(f[0], "alice-") || strings.HasPrefix(f[0], "bob-")) {
				rows = append(rows, strings.Join(f[1:], " "))
			}
		}
		if want := "[Alice $0.00 1 2 4 Bob $254.50 1 1 3]"; fmt.Sprint(rows) != want {
			t.Errorf("run %d: read model rows %v, want %s", i+1, rows, want)
		}
	}
	var accounts int
	if err := db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM bank_balances`).Scan(&accounts); err != nil || accounts != 4 {
		t.Errorf("bank_balances holds %d accounts (%v) after two runs, want 4", accounts, err)
	}
}

// Without DATABASE_URL every command says so; help still works, also the
// projections commands'.
func TestWithoutDatabase(t *testing.T) {
	t.Parallel()
	bank := func(args ...string) (int, string, string) {
		var stdout, stderr bytes.Buffer
		code := run(t.Context(), args, strings.NewReader(""), &stdout, &stderr, func(string) string { return "" })
		return code, stdout.String(), stderr.String()
	}
	for _, args := range [][]string{nil, {"demo"}, {"projections", "list"}, {"projections", "status"}, {"projections", "rebuild", balancesName, "--yes"}} {
		if code, _, errOut := bank(args...); code != 1 || !strings.Contains(errOut, "set DATABASE_URL") {
			t.Errorf("bank %v: exit code %d, stderr %q: want 1 and a hint to set DATABASE_URL", args, code, errOut)
		}
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--help"}, "projections"},
		{[]string{"projections", "--help"}, "rebuild"},
		{[]string{"projections"}, "rebuild"},
		{[]string{"projections", "rebuild", "--help"}, "--yes"},
		{[]string{"help", "projections", "status"}, "status"},
	} {
		if code, out, errOut := bank(c.args...); code != 0 || !strings.Contains(out, c.want) || !strings.Contains(out, "Usage:") {
			t.Errorf("bank %v: exit code %d, output %q, stderr %q; want 0 and help mentioning %q", c.args, code, out, errOut, c.want)
		}
	}
}

// projections list and status only read: they do not migrate the
// database (the bank's table is not created, nor the annals schema);
// rebuild migrates, as the service does.
func TestReadOnlyCommandsDoNotMigrate(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	bank := func(args ...string) (int, string, string) {
		var stdout, stderr bytes.Buffer
		code := run(t.Context(), args, strings.NewReader(""), &stdout, &stderr, func(k string) string {
			if k == "DATABASE_URL" {
				return db.URL
			}
			return ""
		})
		return code, stdout.String(), stderr.String()
	}
	exists := func(sql string) bool {
		t.Helper()
		var ok bool
		if err := db.Pool.QueryRow(t.Context(), sql).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	bankTable := `SELECT to_regclass('bank_balances') IS NOT NULL`
	annalsSchema := `SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = 'annals')`

	// Migrated annals schema, no bank table: list and status work and
	// create nothing.
	for _, args := range [][]string{{"projections", "list"}, {"projections", "status"}} {
		if code, out, errOut := bank(args...); code != 0 || !strings.Contains(out, balancesName) {
			t.Fatalf("bank %v: exit code %d\n%s\n%s", args, code, out, errOut)
		}
		if exists(bankTable) {
			t.Fatalf("bank %v created bank_balances: it migrated", args)
		}
	}
	// No annals schema: list reports it, and does not create it.
	if _, err := db.Pool.Exec(t.Context(), `DROP SCHEMA annals CASCADE`); err != nil {
		t.Fatal(err)
	}
	if code, out, errOut := bank("projections", "list"); code != 1 || !strings.Contains(errOut, "migrated") {
		t.Errorf("list on an unmigrated database: exit code %d\n%s\n%s; want 1 and a hint that it is not migrated", code, out, errOut)
	}
	if exists(annalsSchema) {
		t.Fatal("projections list created the annals schema")
	}
	// rebuild migrates first.
	if code, out, errOut := bank("projections", "rebuild", balancesName, "--yes"); code != 0 {
		t.Fatalf("rebuild on an unmigrated database: exit code %d\n%s\n%s", code, out, errOut)
	}
	if !exists(annalsSchema) || !exists(bankTable) {
		t.Fatal("rebuild did not migrate the database")
	}
}

// The projections commands, mounted from projectioncmd, work on the
// service's runner: list shows both subscribers, rebuild rebuilds the
// balances from the log (and refuses an observer, and a script without
// --yes).
func TestProjectionsCommands(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	bank := func(args ...string) (int, string, string) {
		var stdout, stderr bytes.Buffer
		code := run(t.Context(), args, strings.NewReader(""), &stdout, &stderr, func(k string) string {
			if k == "DATABASE_URL" {
				return db.URL
			}
			return ""
		})
		return code, stdout.String(), stderr.String()
	}
	if code, out, errOut := bank("demo"); code != 0 {
		t.Fatalf("demo: exit code %d\n%s\n%s", code, out, errOut)
	}
	before, err := listBalances(t.Context(), db.Pool, "")
	if err != nil || len(before) != 2 {
		t.Fatalf("bank_balances after the demo: %v, %v", before, err)
	}

	code, out, errOut := bank("projections", "list")
	if code != 0 || !strings.Contains(out, balancesName) || !strings.Contains(out, notifierName) {
		t.Fatalf("projections list: exit code %d\n%s\n%s", code, out, errOut)
	}

	// Make the read model wrong, then rebuild it from the log.
	if _, err := db.Pool.Exec(t.Context(), `UPDATE bank_balances SET balance = -1`); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = bank("projections", "rebuild", balancesName, "--yes")
	if code != 0 {
		t.Fatalf("projections rebuild: exit code %d\n%s\n%s", code, out, errOut)
	}
	after, err := listBalances(t.Context(), db.Pool, "")
	if err != nil || fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("bank_balances after the rebuild = %v (%v), want %v", after, err, before)
	}

	// Mistakes in the command line exit with 2, and change nothing.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"projections", "rebuild", notifierName, "--yes"}, "observer"},
		{[]string{"projections", "rebuild", balancesName}, "--yes"}, // from a script
		{[]string{"projections", "rebuild", "nosuch", "--yes"}, "nosuch"},
		{[]string{"projections", "rebuild"}, "arg"},
		{[]string{"projections", "list", "--bogus"}, "bogus"},
		{[]string{"projections", "lsit"}, "lsit"},
		{[]string{"demo", "extra"}, "extra"},
		{[]string{"--bogus"}, "bogus"},
		{[]string{"nosuch"}, "nosuch"},
	} {
		if code, out, errOut = bank(c.args...); code != 2 || !strings.Contains(errOut, c.want) {
			t.Errorf("bank %v: exit code %d\n%s\n%s; want 2 and an error naming %q", c.args, code, out, errOut, c.want)
		}
	}
	if got, err := listBalances(t.Context(), db.Pool, ""); err != nil || fmt.Sprint(got) != fmt.Sprint(before) {
		t.Errorf("bank_balances after the mistakes = %v (%v), want %v", got, err, before)
	}
}
