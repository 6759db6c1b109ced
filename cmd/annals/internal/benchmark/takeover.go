package benchmark

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/catchup"
)

// TakeoverConfig configures RunTakeover. A nil *TakeoverConfig means
// defaults, except for Command, which is required.
type TakeoverConfig struct {
	// Schema is the schema the benchmark drops, recreates and leaves behind.
	// Defaults to "annals_bench_takeover".
	Schema string
	// Command is the command line (program and arguments) of a child
	// process, to which ChildConfig.Args are appended: the annals binary
	// and "bench", "runner-child". Required.
	Command []string
	// Env is the children's environment; it must let them connect to the
	// same database (DATABASE_URL). Defaults to os.Environ().
	Env []string
	// LockRetry lists the standby's LockRetryInterval settings to measure;
	// 0 is the runner's default. Defaults to the default alone.
	LockRetry []time.Duration
	// Rounds is the number of takeovers after SIGKILL measured per setting
	// (and of handovers of the raw baseline). Defaults to 20.
	Rounds int
	// Graceful is the number of graceful handovers measured at the first
	// setting: the leader is stopped (its Runner's context ends), releases
	// its lock and announces it. Defaults to 5; negative: none.
	Graceful int
	// Progress receives a line as each measurement starts. Defaults to none.
	Progress io.Writer
}

// TakeoverStats are the durations of a set of takeovers.
type TakeoverStats struct {
	Samples []float64 `json:"samples_ms"`
	// Median is the nearest-rank median.
	Median float64 `json:"median_ms"`
	Max    float64 `json:"max_ms"`
}

// TakeoverResult is one LockRetryInterval setting.
type TakeoverResult struct {
	LockRetry string `json:"lock_retry_interval"`
	// Graceful says the leader was stopped gracefully, not killed.
	Graceful bool `json:"graceful,omitempty"`
	TakeoverStats
	// MedianVsRaw is the ratio of the median to the raw baseline's median.
	MedianVsRaw float64 `json:"median_vs_raw"`
}

// TakeoverReport is the outcome of RunTakeover.
type TakeoverReport struct {
	// Skipped says why the benchmark did not run (then nothing else is set).
	Skipped string `json:"skipped,omitempty"`
	Rounds  int    `json:"rounds,omitempty"`
	// Raw is the baseline: a session blocked in pg_advisory_lock gets the
	// lock after the SIGKILL of the process holding it.
	Raw     *TakeoverStats   `json:"raw,omitempty"`
	Results []TakeoverResult `json:"results,omitempty"`
}

func (c *TakeoverConfig) withDefaults() TakeoverConfig {
	var out TakeoverConfig
	if c != nil {
		out = *c
	}
	if out.Schema == "" {
		out.Schema = "annals_bench_takeover"
	}
	if out.Env == nil {
		out.Env = os.Environ()
	}
	if len(out.LockRetry) == 0 {
		out.LockRetry = []time.Duration{0}
	}
	if out.Rounds <= 0 {
		out.Rounds = 20
	}
	if out.Graceful == 0 {
		out.Graceful = 5
	}
	if out.Progress == nil {
		out.Progress = io.Discard
	}
	return out
}

// RunTakeover measures leader takeover after a SIGKILL: two child processes
// run the same subscriber; the leader is killed and the time until the
// other has claimed the checkpoint (epoch bumped, owner = itself) is taken,
// Rounds times per LockRetry setting, the killed process being replaced by
// a new standby each time; then the same with Graceful graceful stops at
// the first setting. The baseline is a raw waiter blocked in
// pg_advisory_lock while a child holds the lock and is killed.
func RunTakeover(ctx context.Context, pool *pgxpool.Pool, cfg *TakeoverConfig) (*TakeoverReport, error) {
	c := cfg.withDefaults()
	if len(c.Command) == 0 {
		return nil, errors.New("benchmark: takeover needs the child command")
	}
	for _, d := range c.LockRetry {
		if d < 0 {
			return nil, errors.Newf("benchmark: lock retry interval %s is negative", d)
		}
	}
	q, err := freshSchema(ctx, pool, c.Schema)
	if err != nil {
		return nil, err
	}
	rep := &TakeoverReport{Rounds: c.Rounds}

	fmt.Fprintf(c.Progress, "takeover: raw baseline, %d round(s) ...\n", c.Rounds)
	var raw []time.Duration
	for r := range c.Rounds {
		d, err := rawHandover(ctx, pool, q, c, r)
		if err != nil {
			return nil, errors.Wrap(err, "benchmark: takeover baseline")
		}
		raw = append(raw, d)
	}
	rs := takeoverStats(raw)
	rep.Raw = &rs

	for i, d := range c.LockRetry {
		fmt.Fprintf(c.Progress, "takeover %d/%d: SIGKILL, lock retry interval %s, %d round(s) ...\n", i+1, len(c.LockRetry), retryName(d), c.Rounds)
		ds, err := runnerTakeovers(ctx, pool, q, c, fmt.Sprint(i), d, c.Rounds, false)
		if err != nil {
			return nil, errors.Wrapf(err, "benchmark: takeover with lock retry %s", retryName(d))
		}
		st := takeoverStats(ds)
		rep.Results = append(rep.Results, TakeoverResult{LockRetry: retryName(d), TakeoverStats: st, MedianVsRaw: ratio(st.Median, rs.Median)})
	}
	if c.Graceful > 0 {
		d := c.LockRetry[0]
		fmt.Fprintf(c.Progress, "takeover: graceful stop, lock retry interval %s, %d round(s) ...\n", retryName(d), c.Graceful)
		ds, err := runnerTakeovers(ctx, pool, q, c, "graceful", d, c.Graceful, true)
		if err != nil {
			return nil, errors.Wrapf(err, "benchmark: graceful handover with lock retry %s", retryName(d))
		}
		st := takeoverStats(ds)
		rep.Results = append(rep.Results, TakeoverResult{LockRetry: retryName(d), Graceful: true, TakeoverStats: st, MedianVsRaw: ratio(st.Median, rs.Median)})
	}
	return rep, nil
}

func takeoverStats(ds []time.Duration) TakeoverStats {
	st := TakeoverStats{Samples: make([]float64, len(ds))}
	for i, d := range ds {
		st.Samples[i] = ms(d)
	}
	sorted := slices.Clone(ds)
	slices.Sort(sorted)
	st.Median = ms(percentile(sorted, 0.5))
	st.Max = ms(sorted[len(sorted)-1])
	return st
}

// retryName names a LockRetryInterval setting.
func retryName(d time.Duration) string {
	if d == 0 {
		return fmt.Sprintf("%s (default)", catchup.DefaultLockRetryInterval)
	}
	return d.String()
}

// runnerTakeovers measures rounds takeovers of one subscriber with the
// standby polling the lock every d (0: the default), the leader killed with
// SIGKILL or, if graceful, stopped gracefully.
func runnerTakeovers(ctx context.Context, pool *pgxpool.Pool, q map[string]string, c TakeoverConfig, setting string, d time.Duration, rounds int, graceful bool) ([]time.Duration, error) {
	sub := "bench-takeover-" + setting
	if d == 0 {
		d = catchup.DefaultLockRetryInterval
	}
	var children []*child
	defer func() {
		for _, ch := range children {
			ch.stop()
		}
	}()
	start := func() (*child, error) {
		ch, err := startChild(ctx, c, ChildConfig{
			Schema: c.Schema, InstanceID: fmt.Sprintf("%s-%d", sub, len(children)+1), Subscriber: sub, LockRetry: d,
		})
		if err == nil {
			children = append(children, ch)
		}
		return ch, err
	}
	leader, err := start()
	if err != nil {
		return nil, err
	}
	if _, err := waitForLeader(ctx, pool, q, sub, leader.id, 0, 30*time.Second+3*d); err != nil {
		return nil, err
	}
	standby, err := start()
	if err != nil {
		return nil, err
	}
	var out []time.Duration
	for r := range rounds {
		// Kill at a random point of the standby's poll cycle, once it has
		// settled (connected, registered, polling).
		if err := sleep(ctx, 300*time.Millisecond+rand.N(2*d)); err != nil {
			return nil, err
		}
		var epoch int64
		var owner string
		if err := pool.QueryRow(ctx, q["Leader"], sub).Scan(&epoch, &owner); err != nil {
			return nil, errors.Wrap(err, "read the leader")
		}
		if owner != leader.id {
			return nil, errors.Newf("round %d: %s leads, want %s", r+1, owner, leader.id)
		}
		killed := time.Now()
		if graceful {
			if err := leader.stdin.Close(); err != nil {
				return nil, errors.Wrap(err, "stop the leader")
			}
		} else if err := leader.cmd.Process.Kill(); err != nil {
			return nil, errors.Wrap(err, "SIGKILL the leader")
		}
		claimed, err := waitForLeader(ctx, pool, q, sub, standby.id, epoch, 30*time.Second+3*d)
		if err != nil {
			return nil, errors.Wrapf(err, "round %d", r+1)
		}
		took := claimed.Sub(killed)
		out = append(out, took)
		<-leader.exited
		fmt.Fprintf(c.Progress, "takeover: round %d/%d: %s took over after %.1f ms\n", r+1, rounds, standby.id, ms(took))
		leader = standby
		if r < rounds-1 {
			if standby, err = start(); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// waitForLeader polls the checkpoint every 2 ms until owner leads it with
// an epoch above after, and returns when it saw that.
func waitForLeader(ctx context.Context, pool *pgxpool.Pool, q map[string]string, sub, owner string, after int64, timeout time.Duration) (time.Time, error) {
	deadline := time.Now().Add(timeout)
	for {
		var epoch int64
		var got string
		err := pool.QueryRow(ctx, q["Leader"], sub).Scan(&epoch, &got)
		now := time.Now()
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return now, errors.Wrap(err, "read the leader")
		}
		if err == nil && got == owner && epoch > after {
			return now, nil
		}
		if now.After(deadline) {
			return now, errors.Newf("%s did not take the lead within %s (leader %q, epoch %d)", owner, timeout, got, epoch)
		}
		if err := sleep(ctx, 2*time.Millisecond); err != nil {
			return now, err
		}
	}
}

// rawHandover measures one handover of the baseline: a child holds a
// session advisory lock, a connection of ours waits for it in
// pg_advisory_lock, the child is killed.
func rawHandover(ctx context.Context, pool *pgxpool.Pool, q map[string]string, c TakeoverConfig, round int) (time.Duration, error) {
	holder, err := startChild(ctx, c, ChildConfig{
		Schema: c.Schema, InstanceID: fmt.Sprintf("bench-takeover-raw-%d", round), Subscriber: "raw", LockRetry: time.Second, Raw: true,
	})
	if err != nil {
		return 0, err
	}
	defer holder.stop()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return 0, errors.Wrap(err, "acquire a connection")
	}
	defer conn.Release()
	k1, k2 := rawTakeoverKey(c.Schema)
	type result struct {
		at  time.Time
		err error
	}
	done := make(chan result, 1)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		_, err := conn.Exec(wctx, q["SessionLock"], k1, k2)
		done <- result{time.Now(), err}
	}()
	waiter := conn.Conn().PgConn().PID()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var waiting bool
		if err := pool.QueryRow(ctx, q["LockWaiting"], waiter).Scan(&waiting); err != nil {
			cancel()
			<-done
			return 0, errors.Wrap(err, "watch the waiter")
		}
		if waiting {
			break
		}
		if time.Now().After(deadline) {
			cancel()
			<-done
			return 0, errors.New("the raw waiter never queued for the lock")
		}
		if err := sleep(ctx, 2*time.Millisecond); err != nil {
			cancel()
			<-done
			return 0, err
		}
	}
	start := time.Now()
	if err := holder.cmd.Process.Kill(); err != nil {
		cancel()
		<-done
		return 0, errors.Wrap(err, "SIGKILL the holder")
	}
	var res result
	select {
	case res = <-done:
	case <-time.After(30 * time.Second):
		cancel()
		<-done
		return 0, errors.New("the raw waiter did not get the lock within 30s")
	}
	if res.err != nil {
		return 0, errors.Wrap(res.err, "raw waiter")
	}
	<-holder.exited
	if _, err := conn.Exec(ctx, q["SessionUnlock"], k1, k2); err != nil {
		return 0, errors.Wrap(err, "release the baseline lock")
	}
	return res.at.Sub(start), nil
}

// child is a running child process.
type child struct {
	id     string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr *syncBuffer
	exited chan struct{} // closed once the process has been waited for
	err    error         // the exit status, once exited is closed
}

// startChild starts a child and waits until it reports ready. The child
// ends gracefully when its stdin closes (and by itself if we die).
func startChild(ctx context.Context, c TakeoverConfig, cc ChildConfig) (*child, error) {
	cmd := exec.Command(c.Command[0], append(slices.Clone(c.Command[1:]), cc.Args()...)...)
	cmd.Env = c.Env
	ch := &child{id: cc.InstanceID, cmd: cmd, stderr: &syncBuffer{}, exited: make(chan struct{})}
	cmd.Stderr = ch.stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, errors.Wrap(err, "benchmark: child stdin")
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, errors.Wrap(err, "benchmark: child stdout")
	}
	if err := cmd.Start(); err != nil {
		return nil, errors.Wrapf(err, "benchmark: start %s", c.Command[0])
	}
	ch.stdin = stdin
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		seen := false
		for sc.Scan() {
			if !seen && sc.Text() == ChildReady {
				seen = true
				close(ready)
			}
		}
		ch.err = cmd.Wait()
		close(ch.exited)
	}()
	select {
	case <-ready:
		return ch, nil
	case <-ch.exited:
		return nil, errors.Newf("benchmark: child %s exited before it was ready (%v): %s", ch.id, ch.err, ch.stderr.tail())
	case <-time.After(30 * time.Second):
		ch.kill()
		return nil, errors.Newf("benchmark: child %s not ready within 30s: %s", ch.id, ch.stderr.tail())
	case <-ctx.Done():
		ch.kill()
		return nil, ctx.Err()
	}
}

func (ch *child) kill() {
	_ = ch.cmd.Process.Kill()
	<-ch.exited
}

// stop ends the child gracefully (closing its stdin), killing it if it has
// not exited within 10s. A no-op once it has exited.
func (ch *child) stop() {
	select {
	case <-ch.exited:
		return
	default:
	}
	_ = ch.stdin.Close()
	select {
	case <-ch.exited:
	case <-time.After(10 * time.Second):
		ch.kill()
	}
}

// syncBuffer collects a child's stderr.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// tail returns the last 2 KB written, on one line.
func (b *syncBuffer) tail() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.buf.String()
	if len(s) > 2048 {
		s = s[len(s)-2048:]
	}
	return strings.Join(strings.Fields(s), " ")
}

// sleep waits for d or until ctx ends (then returns its error).
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// WriteTakeoverTable prints the report as an aligned table.
func WriteTakeoverTable(w io.Writer, s Settings, rep *TakeoverReport) error {
	if rep.Skipped != "" {
		_, err := fmt.Fprintf(w, "leader takeover after SIGKILL: skipped: %s\n", rep.Skipped)
		return err
	}
	fmt.Fprintf(w, "leader takeover, ms: SIGKILL (or graceful stop) of the leader → the standby has claimed the checkpoint (%s)\n", s)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "contender\tlock retry interval\trounds\tmedian\tmax\tmedian/raw\t")
	if rep.Raw != nil {
		fmt.Fprintf(tw, "raw: waiter blocked in pg_advisory_lock, SIGKILL\t-\t%d\t%.1f\t%.1f\t1.00\t\n", len(rep.Raw.Samples), rep.Raw.Median, rep.Raw.Max)
	}
	for _, r := range rep.Results {
		what := "runner standby, SIGKILL"
		if r.Graceful {
			what = "runner standby, graceful stop"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.1f\t%.1f\t%.1f\t\n", what, r.LockRetry, len(r.Samples), r.Median, r.Max, r.MedianVsRaw)
	}
	return tw.Flush()
}
