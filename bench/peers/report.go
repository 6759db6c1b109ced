package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// report is the outcome of a run; --output json prints it as is.
type report struct {
	Server            string   `json:"server_version"`
	Fsync             string   `json:"fsync"`
	SynchronousCommit string   `json:"synchronous_commit"`
	Rounds            int      `json:"rounds"`
	Duration          string   `json:"duration_per_cell"`
	Contenders        []string `json:"contenders"`
	// LoadBefore and LoadAfter are the load averages (1, 5, 15 minutes) of
	// the machine running the benchmark, when it can read them.
	LoadBefore string `json:"load_average_before,omitempty"`
	LoadAfter  string `json:"load_average_after,omitempty"`
	// Appends are the append workloads, Catchup the catch-up read (the raw
	// contender's figure is a paged reader scanning into []byte).
	Appends []*row `json:"appends"`
	// CatchupLimit bounds each catch-up read (see cell.Partial).
	CatchupLimit string      `json:"catchup_limit"`
	Catchup      *row        `json:"catchup,omitempty"`
	Tail         *tailReport `json:"tailing_check,omitempty"`
	// ServerCPUNote says why the server's CPU time was not measured (it is
	// when the server runs on this machine); empty when it was.
	ServerCPUNote string `json:"server_cpu_note,omitempty"`
}

// row is one workload: a cell per contender.
type row struct {
	Workload string           `json:"workload"`
	Label    string           `json:"label"`
	Unit     string           `json:"unit"`
	Cells    map[string]*cell `json:"contenders"`
}

// cell is one contender on one workload.
type cell struct {
	// Rounds holds the rate of each round, in round order.
	Rounds []float64 `json:"rounds"`
	Median float64   `json:"median"`
	// VsAnnals is Median over annals' median: above 1 is faster than annals.
	VsAnnals float64 `json:"vs_annals"`
	// Partial is set when a catch-up read hit -catchup-limit: its rate is
	// taken over the events it read in that time.
	Partial bool `json:"partial,omitempty"`
	// CPURounds is an append workload's CPU time per event in each round,
	// CPU their medians (each part on its own).
	CPURounds []cpuPerEvent `json:"cpu_us_per_event_rounds,omitempty"`
	CPU       *cpuPerEvent  `json:"cpu_us_per_event,omitempty"`
}

// tailReport is the correctness check of every contender.
type tailReport struct {
	Writers  int    `json:"writers"`
	Duration string `json:"duration"`
	Hold     string `json:"unrelated_transaction_held"`
	Drain    string `json:"drain"`
	Poll     string `json:"poll_interval"`
	// Results are without the unrelated transaction, Held with it.
	Results map[string]*tailResult `json:"contenders"`
	Held    map[string]*tailResult `json:"contenders_with_unrelated_transaction"`
}

func (r *row) add(contender string, rate float64, partial bool) {
	if r.Cells == nil {
		r.Cells = map[string]*cell{}
	}
	c := r.Cells[contender]
	if c == nil {
		c = &cell{}
		r.Cells[contender] = c
	}
	c.Rounds = append(c.Rounds, rate)
	c.Partial = c.Partial || partial
}

func (r *row) addCPU(contender string, cpu cpuPerEvent) {
	c := r.Cells[contender] // add made it
	c.CPURounds = append(c.CPURounds, cpu)
}

// finish computes medians and ratios.
func (rep *report) finish() {
	rows := slices.Clone(rep.Appends)
	if rep.Catchup != nil {
		rows = append(rows, rep.Catchup)
	}
	for _, r := range rows {
		for _, c := range r.Cells {
			c.Median = median(c.Rounds)
			if len(c.CPURounds) > 0 {
				var server, client []float64
				for _, x := range c.CPURounds {
					if x.Server != nil {
						server = append(server, *x.Server)
					}
					client = append(client, x.Client)
				}
				c.CPU = &cpuPerEvent{Client: median(client)}
				if len(server) == len(c.CPURounds) {
					m := median(server)
					c.CPU.Server = &m
				}
			}
		}
		if a := r.Cells[annalsName]; a != nil && a.Median > 0 {
			for _, c := range r.Cells {
				c.VsAnnals = c.Median / a.Median
			}
		}
	}
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// writeText prints the report as markdown tables.
func writeText(w io.Writer, rep *report) error {
	fmt.Fprintf(w, "PostgreSQL %s, fsync=%s, synchronous_commit=%s; medians of %d interleaved rounds of %s per append cell.\n",
		rep.Server, rep.Fsync, rep.SynchronousCommit, rep.Rounds, rep.Duration)
	if rep.LoadBefore != "" {
		fmt.Fprintf(w, "Load average (1, 5, 15 min) of this machine: %s before, %s after.\n", rep.LoadBefore, rep.LoadAfter)
	}
	fmt.Fprintf(w, "Figures are ratios to annals (above 1.00: faster than annals); annals' own rate in parentheses.\n\n")
	head := []string{"workload"}
	for _, n := range rep.Contenders {
		head = append(head, contenderTitles[n])
	}
	fmt.Fprintf(w, "| %s |\n|---|%s\n", strings.Join(head, " | "), strings.Repeat("--:|", len(rep.Contenders)))
	rows := slices.Clone(rep.Appends)
	if rep.Catchup != nil {
		rows = append(rows, rep.Catchup)
	}
	for _, r := range rows {
		cols := []string{r.Label}
		for _, n := range rep.Contenders {
			c := r.Cells[n]
			switch {
			case c == nil:
				cols = append(cols, "–")
			case n == annalsName:
				cols = append(cols, fmt.Sprintf("1.00 (%s/s)", thousands(c.Median)))
			default:
				s := fmt.Sprintf("%.2f", c.VsAnnals)
				if r == rep.Catchup && n == rawName {
					s = "raw paged read into `[]byte`: " + s
				}
				if c.Partial {
					s += " (over the first " + rep.CatchupLimit + " of the read)"
				}
				cols = append(cols, s)
			}
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(cols, " | "))
	}
	writeCPU(w, rep, head)
	if rep.Tail == nil {
		return nil
	}
	t := rep.Tail
	fmt.Fprintf(w, "\nCorrectness: a reader tails the log from its start (polling every %s when idle) while %d writers append single events for %s, twice: alone, then with an unrelated transaction that writes a row a quarter in and stays open for %s. Skipped: appended events the reader was never given (%s without a new event ends the drain). Delay: append returned → reader given the event.\n\n",
		t.Poll, t.Writers, t.Duration, t.Hold, t.Drain)
	fmt.Fprintf(w, "| tailing reader | %s |\n|---|%s\n", strings.Join(head[1:], " | "), strings.Repeat("--:|", len(rep.Contenders)))
	held := "with the transaction held " + t.Hold
	lines := []struct {
		name string
		set  map[string]*tailResult
		f    func(*tailResult) string
	}{
		{"events appended", t.Results, func(r *tailResult) string { return thousands(float64(r.Appended)) }},
		{"skipped", t.Results, skipped},
		{"duplicated", t.Results, func(r *tailResult) string { return strconv.FormatInt(r.Duplicates, 10) }},
		{"delay p50", t.Results, func(r *tailResult) string { return ms(r.DelayP50) }},
		{"delay p99", t.Results, func(r *tailResult) string { return ms(r.DelayP99) }},
		{"delay max", t.Results, func(r *tailResult) string { return ms(r.DelayMax) }},
		{held + ": events appended", t.Held, func(r *tailResult) string { return thousands(float64(r.Appended)) }},
		{held + ": skipped", t.Held, skipped},
		{held + ": duplicated", t.Held, func(r *tailResult) string { return strconv.FormatInt(r.Duplicates, 10) }},
		{held + ": delay p50", t.Held, func(r *tailResult) string { return ms(r.DelayP50) }},
		{held + ": delay max (stall)", t.Held, func(r *tailResult) string { return ms(r.DelayMax) }},
	}
	for _, l := range lines {
		cols := []string{l.name}
		for _, n := range rep.Contenders {
			if r := l.set[n]; r != nil {
				cols = append(cols, l.f(r))
			} else {
				cols = append(cols, "–")
			}
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(cols, " | "))
	}
	return nil
}

// writeCPU prints the append workloads' CPU time per event.
func writeCPU(w io.Writer, rep *report, head []string) {
	if len(rep.Appends) == 0 {
		return
	}
	if rep.ServerCPUNote != "" {
		fmt.Fprintf(w, "\nCPU time per event, µs, of the appending processes only (medians; the server's is not measured: %s).\n\n", rep.ServerCPUNote)
	} else {
		fmt.Fprintf(w, "\nCPU time per event, µs (medians): PostgreSQL's processes + the appending processes. A machine's load moves the rates above, not these.\n\n")
	}
	fmt.Fprintf(w, "| %s |\n|---|%s\n", strings.Join(head, " | "), strings.Repeat("--:|", len(rep.Contenders)))
	for _, r := range rep.Appends {
		cols := []string{r.Label}
		for _, n := range rep.Contenders {
			c := r.Cells[n]
			switch {
			case c == nil || c.CPU == nil:
				cols = append(cols, "–")
			case c.CPU.Server == nil:
				cols = append(cols, fmt.Sprintf("%.1f", c.CPU.Client))
			default:
				cols = append(cols, fmt.Sprintf("%.1f + %.1f", *c.CPU.Server, c.CPU.Client))
			}
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(cols, " | "))
	}
}

func skipped(r *tailResult) string {
	if r.Appended == 0 {
		return "0"
	}
	return fmt.Sprintf("%d (%.2f%%)", r.Skipped, 100*float64(r.Skipped)/float64(r.Appended))
}

// ms formats d in milliseconds.
func ms(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 1, 64) + " ms"
}

// thousands formats x rounded, with commas between thousands.
func thousands(x float64) string {
	s := strconv.FormatInt(int64(math.Round(x)), 10)
	var b strings.Builder
	for i, ch := range s {
		if i > 0 && (len(s)-i)%3 == 0 && s[i-1] != '-' {
			b.WriteByte(',')
		}
		b.WriteRune(ch)
	}
	return b.String()
}

func itoa(i int) string { return strconv.Itoa(i) }
