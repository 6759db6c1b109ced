package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/internal/procstat"
)

// workload is one append measurement: procs processes of writers writers,
// each appending batch events per append to a stream of its own with an
// exact expected version.
type workload struct {
	Key     string `json:"key"`
	Label   string `json:"label"`
	Procs   int    `json:"processes"`
	Writers int    `json:"writers_per_process"`
	Batch   int    `json:"events_per_append"`
}

// workloads are the append measurements, in table order.
var workloads = []workload{
	{"16x1", "16 writers × 1 event per append", 1, 16, 1},
	{"1x1", "1 writer × 1 event", 1, 1, 1},
	{"4x100", "4 writers × 100 events per append", 1, 4, 100},
	{"4px4x1", "4 processes × 4 writers × 1 event", 4, 4, 1},
}

// newIDs returns n new event IDs.
func newIDs(n int) []uuid.UUID {
	ids := make([]uuid.UUID, n)
	for i := range ids {
		ids[i] = uuid.Must(uuid.NewV7())
	}
	return ids
}

// appendFor runs writers concurrently from start until start+d, each
// appending batches of batch events to stream prefix-wN, and returns the
// number of events appended and the time from start until the last writer
// finished. onAppend, when not nil, is called after each append returns.
func appendFor(ctx context.Context, c *contender, prefix string, writers, batch int, start time.Time, d time.Duration, onAppend func(w int, ids []uuid.UUID)) (int64, time.Duration, error) {
	var total atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	if wait := time.Until(start); wait > 0 && !sleep(ctx, wait) {
		return 0, 0, ctx.Err()
	}
	// A child that got ready after the common start (a loaded machine)
	// still appends for d: its window is shifted (the parent warns), not
	// cut short to nothing.
	if now := time.Now(); now.After(start) {
		start = now
	}
	deadline := start.Add(d)
	for w := range writers {
		wg.Go(func() {
			stream := fmt.Sprintf("%s-w%d", prefix, w)
			var version int64
			for time.Now().Before(deadline) {
				ids := newIDs(batch)
				if err := c.append(ctx, stream, version, ids); err != nil {
					errs <- errors.Wrapf(err, "%s: writer %d", c.name, w)
					return
				}
				if onAppend != nil {
					onAppend(w, ids)
				}
				version += int64(batch)
				total.Add(int64(batch))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errs)
	if err := <-errs; err != nil {
		return 0, 0, err
	}
	return total.Load(), elapsed, nil
}

// cpuPerEvent is the CPU time one event of an append workload cost, in µs:
// the PostgreSQL server's (all of its processes; nil when the server does
// not run on this machine) and the appending processes'.
type cpuPerEvent struct {
	Server *float64 `json:"server,omitempty"`
	Client float64  `json:"client"`
}

// measureAppend runs workload w for contender c (in this process or in
// w.Procs child processes) and returns events per second and the CPU time
// per event. server, when not nil, is the server whose CPU time is read.
func measureAppend(ctx context.Context, cfg *config, server *procstat.Server, c *contender, w workload, prefix string, progress io.Writer) (float64, cpuPerEvent, error) {
	var cpu cpuPerEvent
	var server0 time.Duration
	readServer := func() (time.Duration, error) {
		if server == nil {
			return 0, nil
		}
		return server.Total()
	}
	perEvent := func(events int64, client time.Duration) error {
		if events <= 0 {
			return nil
		}
		server1, err := readServer()
		if err != nil {
			return err
		}
		if server != nil {
			v := float64((server1 - server0).Microseconds()) / float64(events)
			cpu.Server = &v
		}
		cpu.Client = float64(client.Microseconds()) / float64(events)
		return nil
	}
	if w.Procs <= 1 {
		var err error
		if server0, err = readServer(); err != nil {
			return 0, cpu, err
		}
		self0 := procstat.Self()
		n, elapsed, err := appendFor(ctx, c, prefix, w.Writers, w.Batch, time.Now(), cfg.Duration, nil)
		if err != nil {
			return 0, cpu, err
		}
		if err := perEvent(n, procstat.Self()-self0); err != nil {
			return 0, cpu, err
		}
		return float64(n) / elapsed.Seconds(), cpu, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return 0, cpu, errors.Wrap(err, "find this program to start children")
	}
	// The children connect first and start appending together.
	start := time.Now().Add(cfg.ChildStartDelay)
	results := make([]childResult, w.Procs)
	errs := make([]error, w.Procs)
	var wg sync.WaitGroup
	for p := range w.Procs {
		args := childArgs{
			Contender: c.name, Prefix: cfg.Prefix, StreamPrefix: fmt.Sprintf("%s-p%d", prefix, p),
			Writers: w.Writers, Batch: w.Batch, Start: start, Duration: cfg.Duration,
		}
		wg.Go(func() {
			results[p], errs[p] = runChild(ctx, exe, args)
		})
	}
	// The server's CPU time is read at the common start, after the children
	// connected, and after the last child ended.
	if wait := time.Until(start); wait > 0 && !sleep(ctx, wait) {
		wg.Wait() // the children end with ctx
		return 0, cpu, ctx.Err()
	}
	server0, serverErr := readServer()
	wg.Wait()
	if serverErr != nil {
		return 0, cpu, serverErr
	}
	var events int64
	var longest, clients time.Duration
	for p := range w.Procs {
		if errs[p] != nil {
			return 0, cpu, errors.Wrapf(errs[p], "child %d", p)
		}
		events += results[p].Events
		clients += time.Duration(results[p].CPUNanos)
		longest = max(longest, time.Duration(results[p].ElapsedNanos))
		if late := time.Duration(results[p].LateNanos); late > 0 {
			fmt.Fprintf(progress, "warning: child %d started appending %s late (-child-start %s): its window is shifted by that much, so the processes overlapped less\n", p, late.Round(time.Millisecond), cfg.ChildStartDelay)
		}
	}
	if err := perEvent(events, clients); err != nil {
		return 0, cpu, err
	}
	return float64(events) / longest.Seconds(), cpu, nil
}

// childArgs describes one child process of a multi-process workload.
type childArgs struct {
	Contender, Prefix, StreamPrefix string
	Writers, Batch                  int
	Start                           time.Time
	Duration                        time.Duration
}

func (a childArgs) flags() []string {
	return []string{
		"-contender", a.Contender, "-prefix", a.Prefix, "-streams", a.StreamPrefix,
		"-writers", strconv.Itoa(a.Writers), "-batch", strconv.Itoa(a.Batch),
		"-start", strconv.FormatInt(a.Start.UnixNano(), 10), "-duration", a.Duration.String(),
	}
}

// childResult is what a child prints as its last line on stdout.
type childResult struct {
	Events       int64 `json:"events"`
	ElapsedNanos int64 `json:"elapsed_ns"`
	// LateNanos is how long after the common start the child was ready to
	// append (0 when it was ready in time).
	LateNanos int64 `json:"late_ns"`
	// CPUNanos is the CPU time the child used while appending.
	CPUNanos int64 `json:"cpu_ns"`
}

// childCommand is the first argument that makes this program a child.
const childCommand = "child"

// runChild starts exe as a child and returns its result.
func runChild(ctx context.Context, exe string, a childArgs) (childResult, error) {
	cmd := exec.CommandContext(ctx, exe, append([]string{childCommand}, a.flags()...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return childResult{}, errors.Wrapf(err, "%s", bytes.TrimSpace(stderr.Bytes()))
	}
	var last []byte
	sc := bufio.NewScanner(&stdout)
	for sc.Scan() {
		last = append(last[:0], sc.Bytes()...)
	}
	var r childResult
	if err := json.Unmarshal(last, &r); err != nil {
		return childResult{}, errors.Wrapf(err, "child output %q", stdout.String())
	}
	return r, nil
}

// childMain is the child side of runChild: it appends as told and prints a
// childResult.
func childMain(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet(childCommand, flag.ContinueOnError)
	var a childArgs
	var startNanos int64
	fs.StringVar(&a.Contender, "contender", "", "contender name")
	fs.StringVar(&a.Prefix, "prefix", "", "schema prefix")
	fs.StringVar(&a.StreamPrefix, "streams", "", "stream name prefix")
	fs.IntVar(&a.Writers, "writers", 1, "concurrent writers")
	fs.IntVar(&a.Batch, "batch", 1, "events per append")
	fs.Int64Var(&startNanos, "start", 0, "start time, Unix nanoseconds")
	fs.DurationVar(&a.Duration, "duration", time.Second, "how long to append")
	if err := fs.Parse(args); err != nil {
		return err
	}
	pool, err := openPool(ctx, a.Writers+2)
	if err != nil {
		return err
	}
	defer pool.Close()
	c, err := newContender(pool, a.Prefix, a.Contender)
	if err != nil {
		return err
	}
	// Open the writers' connections before the start.
	if err := warm(ctx, pool, a.Writers); err != nil {
		return err
	}
	start := time.Unix(0, startNanos)
	late := max(time.Since(start), 0)
	self0 := procstat.Self()
	n, elapsed, err := appendFor(ctx, c, a.StreamPrefix, a.Writers, a.Batch, start, a.Duration, nil)
	if err != nil {
		return err
	}
	cpu := procstat.Self() - self0
	return json.NewEncoder(stdout).Encode(childResult{Events: n, ElapsedNanos: int64(elapsed), LateNanos: int64(late), CPUNanos: int64(cpu)})
}

// warm opens n connections of pool, so that no measurement pays for connecting.
func warm(ctx context.Context, pool *pgxpool.Pool, n int) error {
	conns := make([]*pgxpool.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for range n {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return errors.Wrap(err, "connect")
		}
		conns = append(conns, c)
	}
	return nil
}
