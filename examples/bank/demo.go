package main

import (
	"context"
	"fmt"
	"io"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/google/uuid"

	"github.com/annals-dev/annals/aggregate"
	"github.com/annals-dev/annals/projection"
)

// syncWriter serializes the demo's output with the observer's, which
// prints from the runner's goroutine.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// step is one command of the demo script.
type step struct {
	verb, id, owner string
	amount          int64
}

// runDemo runs the bank end to end on the service's database: the
// service's runner follows the log live while commands on Account
// aggregates append events; the projection keeps bank_balances and the
// observer notifies large withdrawals; then the projection is rebuilt from
// the log while the runner keeps running. Account IDs carry a random run
// suffix, so the demo can run again on the same database.
func runDemo(ctx context.Context, s *service, out io.Writer) error {
	run := uuid.NewString()[:4]
	id := func(name string) string { return name + "-" + run }
	p := func(format string, args ...any) { fmt.Fprintf(out, format, args...) }

	p("bank demo: commands → events → read model (run %s)\n\n", run)
	p("1. The service starts (annals.Client.Start): it migrates the schema, sets up bank_balances\n")
	p("   (the projection's OnSetup, once per version) and runs, live, the %s projection\n", balancesName)
	p("   and the %s observer.\n", notifierName)
	p("   (The observer sends its notifications from the background: their lines appear as it gets there.)\n")
	if err := s.client.Start(ctx); err != nil {
		return err
	}
	defer func() { _ = s.client.Stop(context.WithoutCancel(ctx)) }()

	p("\n2. Commands on Account aggregates; each saves its events to the account's stream.\n")
	script := []step{
		{"open", id("alice"), "Alice", 0},
		{"deposit", id("alice"), "", 2500_00},
		{"open", id("bob"), "Bob", 0},
		{"deposit", id("bob"), "", 300_00},
		{"withdraw", id("alice"), "", 1200_00},
		{"withdraw", id("bob"), "", 500_00}, // more than Bob has
		{"withdraw", id("bob"), "", 45_50},
		{"open", id("alice"), "Alice", 0},   // twice
		{"deposit", id("carol"), "", 10_00}, // never opened
		{"withdraw", id("alice"), "", 1300_00},
	}
	versions := map[string]int64{}
	notified := 0
	for _, st := range script {
		acc, err := s.execute(ctx, st)
		what := st.verb + " " + st.id
		if st.owner != "" {
			what += " for " + st.owner
		}
		if st.amount != 0 {
			what += " " + money(st.amount)
		}
		if err != nil {
			if !isRuleViolation(err) {
				return err
			}
			p("   %-32s refused: %s\n", what, refusal(err, st.id))
			continue
		}
		versions[st.id] = acc.Version()
		if st.verb == "withdraw" && st.amount >= largeWithdrawal {
			notified++
		}
		p("   %-32s ok: %s v%d, balance %s\n", what, s.accounts.StreamID(st.id), acc.Version(), money(acc.Balance))
	}

	p("\n3. The events in the log (this run's), in commit order:\n")
	for e, err := range s.client.ReadAll(ctx, 0) {
		if err != nil {
			return err
		}
		if _, ours := versions[accountID(e.StreamID)]; ours {
			p("   #%-4d %-20s v%d  %-23s %s\n", e.GlobalSequence, e.StreamID, e.StreamVersion, e.Type, e.Data)
		}
	}

	p("\n4. The read model, once the projection has caught up (live, in the background):\n")
	if err := s.waitFor(ctx, versions, notified); err != nil {
		return err
	}
	rows, err := listBalances(ctx, s.pool, "")
	if err != nil {
		return err
	}
	printBalances(out, rows, versions)

	p("\n5. Rebuild %s from the log (annals.Client.Rebuild) while the runner keeps running:\n", balancesName)
	var last projection.RebuildProgress
	if err := s.client.Rebuild(ctx, balancesName, &projection.RebuildOptions{
		OnProgress: func(pr projection.RebuildProgress) { last = pr },
	}); err != nil {
		return err
	}
	p("   replayed %d events through position %d in %s\n", last.Done, last.Head, last.Elapsed.Round(time.Millisecond))
	after, err := listBalances(ctx, s.pool, "")
	if err != nil {
		return err
	}
	if fmt.Sprint(after) != fmt.Sprint(rows) {
		return errors.Newf("the rebuilt read model differs:\nbefore %v\nafter  %v", rows, after)
	}
	p("   bank_balances after the rebuild: the same %d rows\n", len(after))

	if err := s.client.Stop(ctx); err != nil {
		return err
	}
	p("\n6. The runner stopped gracefully (annals.Client.Stop). On a database that stays (DATABASE_URL),\n")
	p("   try `go run ./examples/bank projections list | status | rebuild %s --yes`.\n", balancesName)
	return nil
}

// execute runs one command through the repository.
func (s *service) execute(ctx context.Context, st step) (*Account, error) {
	switch st.verb {
	case "open":
		return s.accounts.Create(ctx, st.id, func(a *Account) error { return a.OpenAccount(st.owner) })
	case "deposit":
		return s.accounts.Update(ctx, st.id, func(a *Account) error { return a.Deposit(st.amount) })
	case "withdraw":
		return s.accounts.Update(ctx, st.id, func(a *Account) error { return a.Withdraw(st.amount) })
	}
	return nil, errors.Newf("unknown command %q", st.verb)
}

// waitFor returns once the projection and the notifier have processed the
// whole log as it is now (read-your-writes with Client.Await: woken by
// their checkpoints' notifications, no polling), then checks that the read
// model shows every account at the version its last command left it.
func (s *service) waitFor(ctx context.Context, versions map[string]int64, notifications int) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	head, err := s.client.Store().Head(ctx)
	if err != nil {
		return err
	}
	for _, name := range []string{balancesName, notifierName} {
		if err := s.client.Await(ctx, name, head); err != nil {
			return err // a *projection.BehindError says how far behind it is
		}
	}
	rows, err := listBalances(ctx, s.pool, "")
	if err != nil {
		return err
	}
	caughtUp := 0
	for _, r := range rows {
		if v, ok := versions[r.AccountID]; ok && r.Version == v {
			caughtUp++
		}
	}
	if caughtUp != len(versions) || s.mailer.count() < notifications {
		return errors.Newf("at position %d the read model shows %d of %d accounts current and %d of %d notifications",
			head, caughtUp, len(versions), s.mailer.count(), notifications)
	}
	return nil
}

func printBalances(w io.Writer, rows []balanceRow, only map[string]int64) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "   account\towner\t   balance\tdeposits\twithdrawals\tversion")
	for _, r := range rows {
		if _, ok := only[r.AccountID]; !ok {
			continue
		}
		fmt.Fprintf(tw, "   %s\t%s\t%10s\t%8d\t%11d\t%7d\n", r.AccountID, r.Owner, money(r.Balance), r.Deposits, r.Withdrawals, r.Version)
	}
	_ = tw.Flush()
}

// refusal says why a command was refused, in the user's words.
func refusal(err error, id string) string {
	switch {
	case errors.Is(err, aggregate.ErrAlreadyExists):
		return "account " + id + " already exists"
	case errors.Is(err, aggregate.ErrNotFound):
		return "there is no account " + id
	}
	return err.Error()
}

// isRuleViolation reports whether err is a refused command (a business
// rule), as opposed to a failure of the system.
func isRuleViolation(err error) bool {
	for _, rule := range []error{ErrAlreadyOpen, ErrNotOpen, ErrInvalidAmount, ErrNoOwner, ErrInsufficientFunds,
		aggregate.ErrNotFound, aggregate.ErrAlreadyExists} {
		if errors.Is(err, rule) {
			return true
		}
	}
	return false
}
