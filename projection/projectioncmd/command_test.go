package projectioncmd

import (
	"bytes"
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

func TestMain(m *testing.M) { annalstest.Main(m) }

// counting is a projection counting applications per event in cmd_applied.
type counting struct{ name string }

func (p counting) Name() string { return p.name }
func (p counting) Handle(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	_, err := tx.Exec(ctx, `INSERT INTO cmd_applied VALUES ($1, $2, 1) ON CONFLICT (event_id, projection) DO UPDATE SET n = cmd_applied.n + 1`, e.ID, p.name)
	return err
}
func (p counting) Reset(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, `DELETE FROM cmd_applied WHERE projection = $1`, p.name)
	return err
}

type noop struct{ name string }

func (o noop) Name() string                                   { return o.name }
func (o noop) Handle(context.Context, eventstore.Event) error { return nil }

type bundle struct {
	db     *annalstest.DB
	store  *eventstore.Store
	runner *projection.Runner
}

func setup(t *testing.T) *bundle {
	t.Helper()
	db := annalstest.NewDB(t, nil)
	if _, err := db.Pool.Exec(t.Context(), `CREATE TABLE cmd_applied (event_id uuid, projection text, n int NOT NULL, PRIMARY KEY (event_id, projection))`); err != nil {
		t.Fatal(err)
	}
	store, err := eventstore.New(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err := projection.NewRunner(db.Pool, &projection.Config{InstanceID: "inst-1", PollInterval: 100 * time.Millisecond,
		LockRetryInterval: 200 * time.Millisecond, RetryBackoff: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []struct {
		h    any
		opts *projection.Options
	}{
		{counting{"balances"}, nil},
		{counting{"sharded"}, &projection.Options{Partitions: 2}},
		{noop{"mailer"}, nil},
	} {
		if err := r.Register(h.h, h.opts); err != nil {
			t.Fatal(err)
		}
	}
	return &bundle{db: db, store: store, runner: r}
}

func (b *bundle) fill(t *testing.T, n int) {
	t.Helper()
	evs := make([]eventstore.EventData, n)
	for i := range evs {
		evs[i] = eventstore.EventData{Type: "thing.happened", Data: map[string]int{"i": i}}
	}
	for i := 0; i < n; i += 100 {
		if _, err := b.store.Append(t.Context(), fmt.Sprintf("s-%d", i), eventstore.Any, evs[i:min(i+100, n)]...); err != nil {
			t.Fatal(err)
		}
	}
}

type result struct {
	stdout, stderr string
	err            error
}

// execute runs the command tree in-process; terminal says whether stdin and
// stderr are terminals.
func (b *bundle) execute(t *testing.T, terminal bool, stdin string, args ...string) result {
	t.Helper()
	c := newCommands(b.runner, b.db.Pool, &Config{ProgressInterval: time.Nanosecond})
	c.terminal = func(any) bool { return terminal }
	cmd := c.root()
	var out, errOut bytes.Buffer
	cmd.SetArgs(args)
	cmd.SetIn(strings.NewReader(stdin))
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	err := cmd.ExecuteContext(t.Context())
	return result{out.String(), errOut.String(), err}
}

func (b *bundle) applied(t *testing.T, name string) (events, maxN int64) {
	t.Helper()
	if err := b.db.Pool.QueryRow(t.Context(), `SELECT count(*), coalesce(max(n), 0) FROM cmd_applied WHERE projection = $1`, name).Scan(&events, &maxN); err != nil {
		t.Fatal(err)
	}
	return events, maxN
}

func fields(line string) []string { return strings.Fields(line) }

// lineOf returns the first line of s starting with prefix.
func lineOf(t *testing.T, s, prefix string) string {
	t.Helper()
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	t.Fatalf("no line starting with %q in:\n%s", prefix, s)
	return ""
}

func TestListAndStatus(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.fill(t, 250)

	r := b.execute(t, false, "", "list")
	if r.err != nil {
		t.Fatal(r.err)
	}
	if got := fields(lineOf(t, r.stdout, "balances")); strings.Join(got, " ") != "balances projection - 1 - 250 - none" {
		t.Errorf("list before any run: %q\n%s", got, r.stdout)
	}
	if got := fields(lineOf(t, r.stdout, "mailer")); strings.Join(got, " ") != "mailer observer - 1 - 250 - none" {
		t.Errorf("list: %q", got)
	}

	// A live instance leads everything.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.runner.Run(ctx) }()
	defer func() { cancel(); <-done }()
	annalstest.WaitFor(t, 15*time.Second, func() bool {
		r = b.execute(t, false, "", "list")
		want := map[string]string{
			"balances": "balances projection - 1 250 250 0 inst-1",
			"mailer":   "mailer observer - 1 250 250 0 inst-1",
			"sharded":  "sharded projection - 2 250 250 0 inst-1",
		}
		for _, l := range strings.Split(r.stdout, "\n") {
			if f := fields(l); len(f) > 0 && want[f[0]] == strings.Join(f, " ") {
				delete(want, f[0])
			}
		}
		return r.err == nil && len(want) == 0
	})
	if got := fields(lineOf(t, r.stdout, "balances")); strings.Join(got, " ") != "balances projection - 1 250 250 0 inst-1" {
		t.Errorf("list while live: %q\n%s", got, r.stdout)
	}

	r = b.execute(t, false, "", "status", "sharded")
	if r.err != nil {
		t.Fatal(r.err)
	}
	if !strings.HasPrefix(r.stdout, "head of the log: 250\n") || strings.Count(r.stdout, "\nsharded") != 2 {
		t.Errorf("status sharded:\n%s", r.stdout)
	}
	if got := fields(lineOf(t, r.stdout, "sharded")); len(got) != 11 || got[2] != "-" || got[3] != "0" || got[4] != "250" || got[5] != "0" || got[7] != "inst-1" || got[9] != "0" {
		t.Errorf("status line %q", got)
	}
	r = b.execute(t, false, "", "status")
	if r.err != nil || strings.Count(r.stdout, "inst-1") != 4 {
		t.Errorf("status: %v\n%s", r.err, r.stdout)
	}
	r = b.execute(t, false, "", "bogus")
	if r.err == nil || !strings.Contains(r.err.Error(), `unknown command "bogus"`) {
		t.Errorf("a mistyped subcommand: %v (stdout %q)", r.err, r.stdout)
	}
	r = b.execute(t, false, "")
	if r.err != nil || !strings.Contains(r.stdout, "rebuild") {
		t.Errorf("no subcommand should print help: %v\n%s", r.err, r.stdout)
	}
	r = b.execute(t, false, "", "status", "nope")
	if !errors.Is(r.err, projection.ErrUnknownProjection) || !strings.Contains(r.err.Error(), "registered: balances, mailer, sharded") {
		t.Errorf("status nope: %v", r.err)
	}
}

func TestRebuildCommand(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.fill(t, 300)
	if err := b.runner.RunUntilCaughtUp(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := b.db.Pool.Exec(t.Context(), `UPDATE cmd_applied SET n = 9 WHERE projection = 'balances'`); err != nil {
		t.Fatal(err)
	}
	unchanged := func() {
		t.Helper()
		if n, maxN := b.applied(t, "balances"); n != 300 || maxN != 9 {
			t.Errorf("read model changed: %d events, max n %d", n, maxN)
		}
	}

	t.Run("RefusesWithoutTerminal", func(t *testing.T) {
		r := b.execute(t, false, "y\n", "rebuild", "balances")
		if !errors.Is(r.err, ErrNotConfirmed) || !strings.Contains(r.err.Error(), "pass --yes") {
			t.Errorf("err = %v", r.err)
		}
		unchanged()
	})
	t.Run("DeclinedOnTerminal", func(t *testing.T) {
		r := b.execute(t, true, "n\n", "rebuild", "balances")
		if !errors.Is(r.err, ErrNotConfirmed) || !strings.Contains(r.stderr, `Rebuild "balances"? `) {
			t.Errorf("err = %v, stderr %q", r.err, r.stderr)
		}
		unchanged()
	})
	t.Run("BadInput", func(t *testing.T) {
		for _, c := range []struct {
			args []string
			want string
		}{
			{[]string{"rebuild", "nope", "--yes"}, "registered: balances, mailer, sharded"},
			{[]string{"rebuild", "mailer", "--yes"}, "is an observer"},
			{[]string{"rebuild", "balances", "--yes", "--batch-size", "0"}, "--batch-size 0"},
			{[]string{"rebuild", "--yes"}, "accepts 1 arg"},
		} {
			r := b.execute(t, true, "y\n", c.args...)
			if r.err == nil || !strings.Contains(r.err.Error(), c.want) {
				t.Errorf("%v: err = %v; want %q", c.args, r.err, c.want)
			}
		}
		unchanged()
	})
	t.Run("ConfirmedOnTerminal", func(t *testing.T) {
		r := b.execute(t, true, "yes\n", "rebuild", "balances", "--batch-size", "50")
		if r.err != nil {
			t.Fatalf("%+v", r.err)
		}
		if n, maxN := b.applied(t, "balances"); n != 300 || maxN != 1 {
			t.Errorf("after the rebuild: %d events, max n %d", n, maxN)
		}
		if !strings.Contains(r.stderr, "\rrebuild balances [") || !strings.Contains(r.stderr, "100.0% 300/300") || !strings.HasSuffix(r.stderr, "\n") {
			t.Errorf("progress bar: %q", r.stderr)
		}
		if !regexp.MustCompile(`^rebuilt "balances": 300 events through position 300 in \S+ \(\d+ events/s\)\n$`).MatchString(r.stdout) {
			t.Errorf("stdout %q", r.stdout)
		}
	})
	t.Run("PlainProgressWithYes", func(t *testing.T) {
		r := b.execute(t, false, "", "rebuild", "sharded", "--yes", "--batch-size", "40")
		if r.err != nil {
			t.Fatalf("%+v", r.err)
		}
		lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
		last := lines[len(lines)-1]
		if len(lines) < 3 || !strings.HasPrefix(last, "rebuild sharded: 300/300 events (100.0%)") || !strings.HasSuffix(last, ", done") ||
			!strings.Contains(lines[0], "ETA") || strings.Contains(r.stderr, "\r") {
			t.Errorf("progress lines:\n%s", r.stderr)
		}
		if n, maxN := b.applied(t, "sharded"); n != 300 || maxN != 1 {
			t.Errorf("after the rebuild: %d events, max n %d", n, maxN)
		}
	})
}

// TestUsageErrors: every mistake in the command line matches ErrUsage (and
// still its own sentinel), changes nothing, and the failures that are not
// mistakes (a declined confirmation) do not match it.
func TestUsageErrors(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.fill(t, 50)
	if err := b.runner.RunUntilCaughtUp(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		also error // another sentinel the error must match, or nil
		text string
	}{
		{[]string{"bogus"}, nil, `unknown command "bogus"`},
		{[]string{"list", "extra"}, nil, `unknown command "extra"`},
		{[]string{"list", "--nope"}, nil, "unknown flag: --nope"},
		{[]string{"status", "a", "b"}, nil, "accepts at most 1 arg"},
		{[]string{"status", "nope"}, projection.ErrUnknownProjection, "registered: balances, mailer, sharded"},
		{[]string{"rebuild", "--yes"}, nil, "accepts 1 arg"},
		{[]string{"rebuild", "balances", "sharded", "--yes"}, nil, "accepts 1 arg"},
		{[]string{"rebuild", "balances", "--yes", "--batch-size", "abc"}, nil, `invalid argument "abc"`},
		{[]string{"rebuild", "balances", "--yes", "--batch-size", "0"}, nil, "--batch-size 0"},
		{[]string{"rebuild", "balances", "--yes", "--lock-timeout", "0s"}, nil, "--lock-timeout 0s"},
		{[]string{"rebuild", "nope", "--yes"}, projection.ErrUnknownProjection, "not registered"},
		{[]string{"rebuild", "mailer", "--yes"}, projection.ErrObserver, "is an observer"},
		{[]string{"rebuild", "balances"}, ErrNotConfirmed, "pass --yes"},
	} {
		r := b.execute(t, false, "y\n", c.args...)
		if !errors.Is(r.err, ErrUsage) || !strings.Contains(r.err.Error(), c.text) || (c.also != nil && !errors.Is(r.err, c.also)) {
			t.Errorf("%v: err = %v; want ErrUsage with %q (and %v)", c.args, r.err, c.text, c.also)
		}
	}
	if n, maxN := b.applied(t, "balances"); n != 50 || maxN != 1 {
		t.Errorf("read model changed: %d events, max n %d", n, maxN)
	}

	// Mounted in a service's own tree, flag errors are still usage errors.
	c := newCommands(b.runner, b.db.Pool, nil)
	root := &cobra.Command{Use: "myservice", SilenceErrors: true, SilenceUsage: true}
	root.AddCommand(c.root())
	root.SetArgs([]string{"projections", "rebuild", "balances", "--batch-size", "x"})
	root.SetOut(&bytes.Buffer{})
	root.SetErr(&bytes.Buffer{})
	if err := root.ExecuteContext(t.Context()); !errors.Is(err, ErrUsage) {
		t.Errorf("mounted: err = %v; want ErrUsage", err)
	}

	// Not usage errors: a declined confirmation, a successful command.
	if r := b.execute(t, true, "n\n", "rebuild", "balances"); !errors.Is(r.err, ErrNotConfirmed) || errors.Is(r.err, ErrUsage) {
		t.Errorf("declined: err = %v; want ErrNotConfirmed, not ErrUsage", r.err)
	}
	if r := b.execute(t, false, "", "status", "balances"); r.err != nil {
		t.Errorf("status balances: %v", r.err)
	}
}

// failing is counting that fails on every event whose data has i = 7.
type failing struct{ counting }

func (p failing) Handle(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	if strings.Contains(string(e.Data), `"i":7}`) || strings.Contains(string(e.Data), `"i": 7}`) {
		return errors.New("boom on 7")
	}
	return p.counting.Handle(ctx, tx, e)
}

// A rebuild whose replay dead-letters events says so after its summary:
// the read model lacks their events until they are retried.
func TestRebuildReportsDeadLetters(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r, err := projection.NewRunner(b.db.Pool, &projection.Config{InstanceID: "inst-2", PollInterval: 100 * time.Millisecond,
		RetryBackoff: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Register(failing{counting{"flaky"}}, &projection.Options{Retry: &projection.RetryPolicy{MaxRetries: -1}}); err != nil {
		t.Fatal(err)
	}
	b.runner = r
	b.fill(t, 100)
	res := b.execute(t, false, "", "rebuild", "flaky", "--yes")
	if res.err != nil {
		t.Fatalf("%+v", res.err)
	}
	// Event 7 failed; the 92 after it in its stream are parked behind it.
	if !strings.Contains(res.stdout, `"flaky" has 93 unresolved dead letter(s)`) {
		t.Fatalf("stdout %q", res.stdout)
	}
}
