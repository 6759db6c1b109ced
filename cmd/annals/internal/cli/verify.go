package cli

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/spf13/cobra"

	"github.com/annals-dev/annals/verify"
)

func (e *env) verifyCommand() *cobra.Command {
	var (
		baseline, writeBaseline         string
		format                          *string
		interval, pageSize, maxProblems int
		strict                          bool
	)
	cmd := &cobra.Command{
		Use:   "verify",
		Short: "Check the log for rows written, changed or removed outside annals",
		Long: `Read the whole log from one snapshot and report what appends through annals never
produce: a gap, duplicate or disorder in a stream's versions, a streams row that disagrees
with its events, a position above the position sequence (a forged row). Missing events are
excused only as far as a stream's recorded deletion, truncation or retention lets the
scavenger remove them (a maximum count never removes the newest version), where a
scavenge run removed events; a scavenge run whose clock was ahead of its start (possible
before migration 0027) is reported.

--baseline FILE also compares the log with an earlier run's digest (a running SHA-256 with
a checkpoint every --interval events) and reports every range of positions whose rows
changed. --write-baseline FILE writes this run's digest (it may be the same file), only
when no problem was found. Keep baselines outside the database: whoever can rewrite both
the log and its baseline can hide anything.

What it cannot see without a baseline: rows removed without leaving a gap in a stream's
versions (a whole stream with its streams row, or a stream's newest events with the row's
version lowered) look like a log that never had them. Keep a baseline.

A role with fewer privileges than an operator's (a reader, a writer) skips the checks it
cannot make, each said in a note ("complete": false in JSON; "note_causes" says why:
"privileges"), and can still pass; so does a schema not at the migration this annals verify
knows ("version": an older schema's functions that differ from this version's are named,
not judged). --strict makes a check skipped for either cause fail the run (exit 1), for
scheduled audits. A note on what an older annals wrote without what a check needs
("history": deletions before migration 0038, checked by the rules before it) does not fail
--strict: no role and no migration makes that check.

Exit codes: 0 clean, 1 problems found (or, with --strict, checks skipped; or a failure),
2 bad flags or arguments. Progress goes to stderr; --output json writes the report as one
JSON object: the report's fields, "ok", "complete", "baseline_written" (the file, when
written) and "baseline_not_written" (why not, when --write-baseline was given).`,
		Example: `  annals verify --write-baseline /secure/annals.baseline
  annals verify --baseline /secure/annals.baseline --write-baseline /secure/annals.baseline
  annals verify --output json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if interval < 1 || pageSize < 1 || maxProblems < 1 {
				return usagef("--interval, --page-size and --max-problems must be at least 1")
			}
			cfg := &verify.Config{Schema: e.schema, Interval: interval, PageSize: pageSize, MaxProblems: maxProblems}
			if baseline != "" {
				f, err := os.Open(baseline)
				if err != nil {
					return usagef("--baseline: %v", err)
				}
				cfg.Baseline, err = verify.ReadBaseline(f)
				_ = f.Close()
				if err != nil {
					return usagef("--baseline %s: %v", baseline, err)
				}
			}
			if writeBaseline != "" {
				// Find out now, not after reading the whole log, that the
				// baseline cannot be written there.
				f, err := os.CreateTemp(filepath.Dir(writeBaseline), ".annals-baseline-*")
				if err != nil {
					return usagef("--write-baseline %s: %v", writeBaseline, err)
				}
				_ = f.Close()
				_ = os.Remove(f.Name())
			}
			pool, err := e.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			start, last := time.Now(), time.Now()
			var phase verify.Phase
			cfg.Progress = func(p verify.Progress) {
				// Once the run has taken a second: each phase as it
				// starts, and a line a second within one.
				changed := p.Phase != phase
				phase = p.Phase
				if time.Since(last) < time.Second && (!changed || time.Since(start) < time.Second) {
					return
				}
				last = time.Now()
				took := time.Since(start).Round(time.Second)
				switch {
				case p.Phase == verify.PhaseRecords:
					fmt.Fprintf(e.stderr, "verify: checking the catalog and the streams' records, %s\n", took)
				case p.Phase == verify.PhaseEvents:
					pct := 100.0
					if p.Head > 0 {
						pct = 100 * float64(p.Position) / float64(p.Head)
					}
					fmt.Fprintf(e.stderr, "verify: position %d of %d (%.0f%%), %s, %s\n",
						p.Position, p.Head, pct, countNoun(p.Events, "event"), took)
				default:
					fmt.Fprintf(e.stderr, "verify: streams table, %s of about %d, %s\n", countNoun(p.StreamRows, "row"), p.Streams, took)
				}
			}
			rep, err := verify.Log(cmd.Context(), pool, cfg)
			if errors.Is(err, verify.ErrBadBaseline) {
				return usageError{err}
			} else if err != nil {
				return err
			}
			wrote, notWritten := "", ""
			var writeErr error // reported after the report: the run's findings are not lost
			switch {
			case writeBaseline == "":
			case !rep.OK():
				notWritten = "the log has problems"
			default:
				if writeErr = writeBaselineFile(writeBaseline, rep.Baseline); writeErr == nil {
					wrote = writeBaseline
				} else {
					notWritten = writeErr.Error()
				}
			}
			if *format == outputJSON {
				out := struct {
					*verify.Report
					OK               bool   `json:"ok"`
					Complete         bool   `json:"complete"`
					BaselineWrote    string `json:"baseline_written,omitempty"`
					BaselineNotWrote string `json:"baseline_not_written,omitempty"`
				}{rep, rep.OK(), rep.Complete(), wrote, notWritten}
				enc := json.NewEncoder(e.stdout)
				enc.SetIndent("", "  ")
				if err := enc.Encode(out); err != nil {
					return err
				}
			} else if err := writeVerifyText(e, rep, baseline, wrote); err != nil {
				return err
			}
			if !rep.OK() {
				if writeBaseline != "" {
					fmt.Fprintf(e.stderr, "annals: baseline not written: the log has problems\n")
				}
				return exitError{ExitFailure}
			}
			if priv, ver := rep.Skipped(verify.NotePrivileges), rep.Skipped(verify.NoteVersion); strict && priv+ver > 0 {
				if priv > 0 {
					fmt.Fprintf(e.stderr, "annals: verify --strict: %s skipped for lack of privileges (see the notes); run it as a role with the operator's grants to check everything\n",
						checksSkipped(priv))
				}
				if ver > 0 {
					fmt.Fprintf(e.stderr, "annals: verify --strict: %s skipped: the schema is not at the migration this annals verify knows (see the notes); "+
						"run 'annals migrate' to upgrade an older schema, or verify with the annals that migrated it\n", checksSkipped(ver))
				}
				if writeErr != nil {
					return writeErr
				}
				return exitError{ExitFailure}
			}
			return writeErr
		},
	}
	format = addOutputFlag(cmd, true, outputText, outputJSON)
	cmd.Flags().StringVar(&baseline, "baseline", "", "compare with the baseline in FILE")
	cmd.Flags().StringVar(&writeBaseline, "write-baseline", "", "write this run's baseline to FILE (only when clean)")
	cmd.Flags().IntVar(&interval, "interval", 10000, "events per checkpoint of a new baseline")
	cmd.Flags().IntVar(&pageSize, "page-size", 5000, "rows per read")
	cmd.Flags().IntVar(&maxProblems, "max-problems", 100, "how many problems to list (all are counted)")
	cmd.Flags().BoolVar(&strict, "strict", false, "fail (exit 1) when a check was skipped for lack of privileges or because the schema is not at this verify's migration")
	return cmd
}

func writeVerifyText(e *env, rep *verify.Report, baseline, wrote string) error {
	w := e.stdout
	fmt.Fprintf(w, "schema %s: %s in %s, head %d", rep.Schema, countNoun(rep.Events, "event"), countNoun(rep.Streams, "stream"), rep.Head)
	if rep.Sequence != nil {
		fmt.Fprintf(w, ", sequence %d", *rep.Sequence)
	}
	fmt.Fprintf(w, "\ndigest %s\n", rep.Digest)
	if baseline != "" {
		fmt.Fprintf(w, "compared with baseline %s (head %d)\n", baseline, rep.BaselineHead)
	}
	for _, n := range rep.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	for _, p := range rep.Problems {
		fmt.Fprintf(w, "PROBLEM %s: %s\n", p.Kind, p.Message)
	}
	if more := rep.ProblemCount - len(rep.Problems); more > 0 {
		fmt.Fprintf(w, "... and %s\n", countNoun(more, "more problem"))
	}
	switch {
	case rep.OK() && !rep.Complete():
		fmt.Fprintf(w, "ok: no problems found (%s skipped: see the notes)\n", checksSkipped(len(rep.Notes)))
	case rep.OK():
		fmt.Fprintln(w, "ok: no problems found")
	default:
		fmt.Fprintf(w, "%s found\n", countNoun(rep.ProblemCount, "problem"))
	}
	if wrote != "" {
		fmt.Fprintf(w, "baseline written to %s\n", wrote)
	}
	return nil
}

// writeBaselineFile writes b to path through a temporary file in the same
// directory, so that a crash never leaves half a baseline.
func writeBaselineFile(path string, b *verify.Baseline) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".annals-baseline-*")
	if err != nil {
		return errors.Wrap(err, "write the baseline")
	}
	defer func() { _ = os.Remove(f.Name()) }()
	if err := b.Write(f); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return errors.Wrap(err, "write the baseline")
	}
	if err := f.Close(); err != nil {
		return errors.Wrap(err, "write the baseline")
	}
	return errors.Wrap(os.Rename(f.Name(), path), "write the baseline")
}

// checksSkipped is "1 check was" or "n checks were".
func checksSkipped(n int) string {
	if n == 1 {
		return "1 check was"
	}
	return fmt.Sprintf("%d checks were", n)
}
