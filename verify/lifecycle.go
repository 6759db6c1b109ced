package verify

import (
	"context"
	"fmt"
	"math"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
)

// The reserved event types of annals' lifecycle functions.
const (
	deletedType   = "$stream.deleted"
	truncatedType = "$stream.truncated"
)

// excuses says, per stream, which missing events the log's own records
// excuse: the oldest versions (start; for a stream without events, all of
// them) or the newest (tail, removed by a maximum age). why, when set, is
// appended to the message of a problem the stream's missing events raise.
type excuses struct {
	start, tail map[string]bool
	why         map[string]string
	// below is, for a stream in start, the version below which missing
	// events are excused, wherever they are (math.MaxInt64: any): a run
	// that started before a deletion or a lower maximum count removes
	// older events it had not scanned yet and leaves the ones it had.
	below map[string]int64
	// canRuns says whether runs was read: the ranges in which scavenge
	// runs removed events.
	canRuns bool
	runs    []scavengeRange
}

// gap reports whether missing versions of stream id up to to (inclusive),
// which were between positions after and before, are excused.
func (ex *excuses) gap(id string, to, after, before int64) bool {
	if !ex.start[id] || to >= ex.below[id] {
		return false
	}
	return !ex.canRuns || removedIn(ex.runs, after, before)
}

// lifecycleRow is a row of the Lifecycle query.
type lifecycleRow struct {
	id                       string
	state                    int16
	version, truncateBefore  int64
	limits, lossy            bool
	records                  int64
	recordedTB               *int64
	recordedLimits           bool
	firstV, firstPos         *int64
	lastV, lastPos           *int64
	atVersion, atVersionHard *string
	belowTB                  *string
}

func (r *lifecycleRow) targets() []any {
	return []any{&r.id, &r.state, &r.version, &r.truncateBefore, &r.limits, &r.lossy,
		&r.records, &r.recordedTB, &r.recordedLimits, &r.firstV, &r.firstPos, &r.lastV, &r.lastPos,
		&r.atVersion, &r.atVersionHard, &r.belowTB}
}

// scavengeRange is the range of positions (from, to] in which a scavenge
// run removed events.
type scavengeRange struct{ from, to int64 }

// checkLifecycle compares every stream's retention, truncation and deletion
// with what the log records of them, reports what was set some other way,
// and returns which missing events the rest excuses. An excuse holds only
// if a scavenge run removed events where the missing ones were (when the
// role can read scavenge_runs).
func checkLifecycle(ctx context.Context, tx pgx.Tx, q map[string]string, rep *Report, maxProblems int) (*excuses, error) {
	ex := &excuses{start: map[string]bool{}, tail: map[string]bool{}, why: map[string]string{}, below: map[string]int64{}}

	// A maximum count or age that set_stream_retention did not record
	// excuses nothing.
	unrecorded := map[string]bool{}
	urows, err := tx.Query(ctx, q["UnrecordedRetention"])
	if err != nil {
		return nil, errors.Wrap(err, "verify: compare retention with its records")
	}
	var (
		rid      string
		setting  string
		recorded *string
	)
	if _, err := pgx.ForEachRow(urows, []any{&rid, &setting, &recorded}, func() error {
		was := "no \"" + truncatedType + "\" event records any"
		if recorded != nil {
			was = "the latest \"" + truncatedType + "\" event records " + *recorded
		}
		rep.add(maxProblems, Problem{Kind: RetentionUnrecorded, StreamID: rid,
			Message: fmt.Sprintf("stream %q has retention %s in streams, but %s: set outside set_stream_retention; its missing events are reported", rid, setting, was)})
		unrecorded[rid] = true
		return nil
	}); err != nil {
		return nil, errors.Wrap(err, "verify: compare retention with its records")
	}

	var canRuns bool
	if err := tx.QueryRow(ctx, q["CanReadScavengeRuns"]).Scan(&canRuns); err != nil {
		return nil, errors.Wrap(err, "verify: look up scavenge_runs")
	}
	var runs []scavengeRange
	if canRuns {
		rows, err := tx.Query(ctx, q["ScavengeRuns"])
		if err != nil {
			return nil, errors.Wrap(err, "verify: read scavenge runs")
		}
		var r scavengeRange
		if _, err := pgx.ForEachRow(rows, []any{&r.from, &r.to}, func() error {
			runs = append(runs, r)
			return nil
		}); err != nil {
			return nil, errors.Wrap(err, "verify: read scavenge runs")
		}
	} else {
		rep.Notes = append(rep.Notes, "events a stream's retention, truncation or deletion excuses were not checked against scavenge_runs: no SELECT on it (annals grant operator gives it)")
	}

	ex.canRuns, ex.runs = canRuns, runs

	rows, err := tx.Query(ctx, q["Lifecycle"])
	if err != nil {
		return nil, errors.Wrap(err, "verify: read streams with retention")
	}
	var lc lifecycleRow
	if _, err := pgx.ForEachRow(rows, lc.targets(), func() error {
		lc.judge(rep, maxProblems, ex, unrecorded[lc.id], canRuns, runs)
		return nil
	}); err != nil {
		return nil, errors.Wrap(err, "verify: read streams with retention")
	}
	return ex, nil
}

// judge checks one stream's deletion and truncation against the log and
// records what its retention, truncation and deletion excuse.
func (lc *lifecycleRow) judge(rep *Report, maxProblems int, ex *excuses, limitsUnrecorded, canRuns bool, runs []scavengeRange) {
	id := lc.id
	// Without a record left in a metadata stream that lost events (its
	// own retention, truncation or deletion, possible before migrations
	// 0021 and 0024), the stream's settings cannot be checked.
	lost := lc.lossy && lc.records == 0

	// A deletion: delete_stream appends "$stream.deleted" at the new
	// version and sets truncate_before just above it; no append follows
	// (one that recreates the stream makes it live again), and the
	// scavenger removes that event only with every older event of the
	// stream (its run starts after the deletion, so every step of it
	// removes all versions below truncate_before).
	deleted := false
	if lc.state != 0 {
		what, hard := "deleted", "false"
		if lc.state == 2 {
			what, hard = "hard-deleted", "true"
		}
		switch {
		case lc.truncateBefore != lc.version+1:
			rep.add(maxProblems, Problem{Kind: DeletionUnrecorded, StreamID: id, Version: lc.version,
				Message: fmt.Sprintf("stream %q is %s in streams (state %d) at version %d, but its truncate_before is %d, not %d: delete_stream sets it just above its %q event; the state was set some other way, and it excuses no missing event",
					id, what, lc.state, lc.version, lc.truncateBefore, lc.version+1, deletedType)})
		case lc.firstV != nil && (lc.atVersion == nil || *lc.atVersion != deletedType || lc.atVersionHard == nil || *lc.atVersionHard != hard):
			found := "missing"
			switch {
			case lc.atVersion == nil:
			case *lc.atVersion == deletedType:
				h := "no hard"
				if lc.atVersionHard != nil {
					h = "hard " + *lc.atVersionHard
				}
				found = fmt.Sprintf("a %q event with %s", deletedType, h)
			default:
				found = fmt.Sprintf("a %q event", *lc.atVersion)
			}
			rep.add(maxProblems, Problem{Kind: DeletionUnrecorded, StreamID: id, Version: lc.version,
				Message: fmt.Sprintf("stream %q is %s in streams at version %d, but its event at version %d is %s while older events of it remain: delete_stream appends a %q event with hard %s there, and the scavenger removes it only with every older event; the state was set some other way, and it excuses no missing event",
					id, what, lc.version, lc.version, found, deletedType, hard)})
		default:
			deleted = true
		}
	}

	// A truncation: set_stream_retention records the new truncate_before in
	// the metadata stream; a deletion sets it without a record, and then
	// the stream is deleted still, or was recreated by an append (its
	// version is at least truncate_before) after the "$stream.deleted"
	// event at truncate_before - 1, which is there unless the scavenger
	// removed it with every version below it.
	truncated := false
	if lc.truncateBefore > 1 {
		switch {
		case deleted:
			truncated = true
		case lc.recordedTB != nil && lc.truncateBefore <= *lc.recordedTB:
			truncated = true
		case lost:
			truncated = true
		case lc.state == 0 && lc.version >= lc.truncateBefore && lc.belowTB != nil && *lc.belowTB == deletedType:
			truncated = true
		case lc.state == 0 && lc.version >= lc.truncateBefore && (lc.firstV == nil || *lc.firstV >= lc.truncateBefore) &&
			(!canRuns || removedIn(runs, 0, positionOr(lc.firstPos, -1))):
			// The deletion event was scavenged with every version below
			// it, by a run that removed events below the first kept.
			truncated = true
		case lc.state != 0:
			// Reported as DeletionUnrecorded.
		default:
			rec := fmt.Sprintf("no %q event of %q records any", truncatedType, "$$"+id)
			if lc.recordedTB != nil {
				rec = fmt.Sprintf("the %q events of %q record at most %d", truncatedType, "$$"+id, *lc.recordedTB)
			}
			del := "no deletion at version %d explains it"
			if lc.state == 0 && lc.version >= lc.truncateBefore && (lc.firstV == nil || *lc.firstV >= lc.truncateBefore) {
				del = "no deletion at version %d explains it (its event is gone, and no scavenge run removed events where it was)"
			}
			rep.add(maxProblems, Problem{Kind: TruncationUnrecorded, StreamID: id, Version: lc.truncateBefore,
				Message: fmt.Sprintf("stream %q has truncate_before %d in streams, but %s, and "+del+": set outside set_stream_retention and delete_stream; its missing events are reported",
					id, lc.truncateBefore, rec, lc.truncateBefore-1)})
		}
	}

	// A maximum count or age, now (as recorded) or in a record of the
	// past: the events it let the scavenger remove stay gone when it is
	// lifted.
	limited := !limitsUnrecorded && (lc.limits || lc.recordedLimits || lost)

	if lost && (lc.limits || (lc.truncateBefore > 1 && !deleted)) {
		rep.Notes = append(rep.Notes, fmt.Sprintf("the retention of stream %q was not checked: its metadata stream %q lost its %q records (it has retention of its own or was deleted, possible before migration 0024)",
			id, "$$"+id, truncatedType))
	}
	if !deleted && !truncated && !limited {
		return
	}
	start, tail := true, deleted || limited
	// Only scavenge() removes events: the missing ones lie below the first
	// event kept (all of them, without one) or above the last one.
	if canRuns {
		switch {
		case lc.firstV == nil:
			if len(runs) == 0 {
				start = false
				ex.why[id] = "; no scavenge run has removed any event, so its deletion or retention excuses none"
			}
		case *lc.firstV > 1:
			if !removedIn(runs, 0, *lc.firstPos) {
				start = false
				ex.why[id] = fmt.Sprintf("; no scavenge run removed events below position %d, so its deletion or retention excuses none", *lc.firstPos)
			}
		}
		if tail && lc.lastV != nil && *lc.lastV < lc.version && !removedIn(runs, *lc.lastPos, -1) {
			tail = false
			ex.why[id] = fmt.Sprintf("; no scavenge run removed events above position %d, so its retention excuses none", *lc.lastPos)
		}
	}
	ex.start[id] = start
	ex.tail[id] = tail
	ex.below[id] = math.MaxInt64
	if !deleted && !limited {
		ex.below[id] = lc.truncateBefore
	}
}

// removedIn reports whether a run removed events at a position above
// after and below before (-1: no bound).
func removedIn(runs []scavengeRange, after, before int64) bool {
	for _, r := range runs {
		lo, hi := max(r.from, after), r.to
		if before >= 0 {
			hi = min(hi, before-1)
		}
		if lo < hi {
			return true
		}
	}
	return false
}

// positionOr returns *p, or or when p is nil.
func positionOr(p *int64, or int64) int64 {
	if p == nil {
		return or
	}
	return *p
}
