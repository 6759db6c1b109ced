package verify

import (
	"context"
	"fmt"
	"math"
	"sort"
	"time"

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
// them) or the newest (tail, removed by a deletion or a maximum age). why,
// when set, is appended to the message of a problem the stream's missing
// events raise.
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
	// inForce tells which retention records were in force while a run
	// removed events (when canRuns).
	inForce runIndex
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
	id                      string
	state                   int16
	version, truncateBefore int64
	limits, lossy           bool
	records                 int64
	recordedTB              *int64
	recordedLimits          bool
	// Each "$stream.truncated" record of the stream, in version order:
	// its position, when it was recorded, its max_count (0: none) and
	// whether it has a max_age.
	recPos, recCount         []int64
	recAt                    []time.Time
	recAge                   []bool
	firstV, firstPos         *int64
	lastV, lastPos           *int64
	atVersion, atVersionHard *string
	atVersionPos             *int64
	belowTB                  *string
	belowTBPos               *int64
	// The latest deletion record (delete_stream, since migration 0038):
	// the version of its "$stream.deleted" event, whether it was hard and
	// its position (nil: none); anyHard: a record of a hard deletion.
	delVersion *int64
	delHard    *bool
	delPos     *int64
	anyHard    bool
}

func (r *lifecycleRow) targets() []any {
	return []any{&r.id, &r.state, &r.version, &r.truncateBefore, &r.limits, &r.lossy,
		&r.records, &r.recordedTB, &r.recordedLimits, &r.recPos, &r.recAt, &r.recCount, &r.recAge, &r.firstV, &r.firstPos, &r.lastV, &r.lastPos,
		&r.atVersion, &r.atVersionHard, &r.atVersionPos, &r.belowTB, &r.belowTBPos, &r.delVersion, &r.delHard, &r.delPos, &r.anyHard}
}

// scavengeRange is the range of positions (from, to] in which a scavenge
// run removed events.
type scavengeRange struct{ from, to int64 }

// scavengeRun is a row of the ScavengeRuns query: a run that removed
// events.
type scavengeRun struct {
	id                             int64
	startedBy                      string
	from, scanned, target, removed int64
	started, end, now              time.Time
}

// runIndex answers which retention records were in force while a scavenge
// run removed events. A run's steps decide with the settings committed
// when each step starts (set_stream_retention waits for a step in
// progress): its first step sees exactly the records at positions up to
// its target (the head when it started; positions are commit order), and
// a later step sees a record committed before that step, which is before
// the run's last step ended.
type runIndex struct {
	// targets are the runs' targets in ascending order; maxEnd[i] is the
	// latest end of the runs with targets[:i+1].
	targets []int64
	maxEnd  []time.Time
}

func newRunIndex(runs []scavengeRun) runIndex {
	byTarget := append([]scavengeRun(nil), runs...)
	sort.Slice(byTarget, func(i, j int) bool { return byTarget[i].target < byTarget[j].target })
	var x runIndex
	for i, r := range byTarget {
		end := r.end
		if i > 0 && x.maxEnd[i-1].After(end) {
			end = x.maxEnd[i-1]
		}
		x.targets = append(x.targets, r.target)
		x.maxEnd = append(x.maxEnd, end)
	}
	return x
}

// inForce reports whether a record at position pos, recorded at at and
// replaced by the record at position next (0: none, it is the latest), was
// in force during a run that removed events: a run that started before the
// next record was committed (its target is below next) and that saw the
// record (its target is at or above pos, or its last step ended at or
// after at).
func (x runIndex) inForce(pos int64, at time.Time, next int64) bool {
	k := len(x.targets)
	if next > 0 {
		k = sort.Search(len(x.targets), func(i int) bool { return x.targets[i] >= next })
	}
	return k > 0 && (x.targets[k-1] >= pos || !x.maxEnd[k-1].Before(at))
}

// checkLifecycle compares every stream's retention, truncation and deletion
// with what the log records of them, reports what was set some other way,
// and returns which missing events the rest excuses. An excuse holds only
// if a scavenge run removed events where the missing ones were (when the
// role can read scavenge_runs).
func checkLifecycle(ctx context.Context, tx pgx.Tx, q map[string]string, rep *Report, maxProblems int) (*excuses, error) {
	ex := &excuses{start: map[string]bool{}, tail: map[string]bool{}, why: map[string]string{}, below: map[string]int64{}}

	// Since migration 0038 delete_stream records every deletion in the
	// metadata stream; deletions at or below recordedAfter may have none.
	since, err := deletionsRecordedAfter(ctx, tx, q, rep, maxProblems)
	if err != nil {
		return nil, err
	}
	recordedAfter := since.after()

	// A maximum count or age that set_stream_retention did not record
	// excuses nothing.
	unrecorded := map[string]bool{}
	urows, err := tx.Query(ctx, q["UnrecordedRetention"], recordedAfter)
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
		var (
			r   scavengeRun
			all []scavengeRun
		)
		if _, err := pgx.ForEachRow(rows, []any{&r.id, &r.startedBy, &r.from, &r.scanned, &r.target, &r.removed,
			&r.started, &r.end, &r.now}, func() error {
			all = append(all, r)
			if r.scanned > r.from {
				runs = append(runs, scavengeRange{from: r.from, to: r.scanned})
			}
			// Before migration 0027 a run's clock was the caller's: one
			// ahead of the server removed events a maximum age kept.
			if ahead := r.now.Sub(r.started); ahead > ScavengeClockTolerance {
				rep.add(maxProblems, Problem{Kind: ScavengeClockAhead, After: r.from, Position: r.scanned,
					Message: fmt.Sprintf("scavenge run %d (started %s by %s) ran with the clock %s, %s ahead of its start, and removed %d events at positions %d to %d: events of streams with a maximum age that the age still kept may be among them (scavenge() took the caller's clock before migration 0027)",
						r.id, r.started.UTC().Format(time.RFC3339), r.startedBy, r.now.UTC().Format(time.RFC3339), ahead.Round(time.Second), r.removed, r.from+1, r.scanned)})
			}
			return nil
		}); err != nil {
			return nil, errors.Wrap(err, "verify: read scavenge runs")
		}
		ex.inForce = newRunIndex(all)
	} else {
		rep.note(NotePrivileges, "events a stream's retention, truncation or deletion excuses were not checked against scavenge_runs: no SELECT on it (annals grant operator gives it)")
	}

	ex.canRuns, ex.runs = canRuns, runs

	rows, err := tx.Query(ctx, q["Lifecycle"])
	if err != nil {
		return nil, errors.Wrap(err, "verify: read streams with retention")
	}
	var (
		lc     lifecycleRow
		old    []string // streams checked by the rules before migration 0038
		waited bool     // one of them was deleted while 0038 was applied
	)
	if _, err := pgx.ForEachRow(rows, lc.targets(), func() error {
		o, w := lc.judge(rep, maxProblems, ex, unrecorded[lc.id], canRuns, runs, since)
		if o {
			old = append(old, lc.id)
		}
		waited = waited || w
		return nil
	}); err != nil {
		return nil, errors.Wrap(err, "verify: read streams with retention")
	}
	if len(old) > 0 {
		const show = 5
		ids := fmt.Sprintf("%q", old[:min(len(old), show)])
		if len(old) > show {
			ids = fmt.Sprintf("%s and %d more", ids, len(old)-show)
		}
		rep.note(NoteHistory, fmt.Sprintf("%d streams (%s) are deleted, or truncated by a deletion, without a deletion record in their metadata streams, which delete_stream writes since migration 0038 (%s): their deletions may be older, and were checked as before (their state and versions could have been changed without it being seen; compare with a baseline)%s",
			len(old), ids, since.describe(), since.stragglers(waited)))
	}
	return ex, nil
}

// recordsSince tells which deletions must have their record in the
// metadata stream (migration 0038).
type recordsSince struct {
	// head is deletions_recorded_after(), the head of the log when 0038
	// ran (math.MaxInt64: unknown).
	head int64
	// first is the position of the first deletion record in the log (0:
	// none).
	first int64
}

// after returns the position at or below which a deletion may lack its
// record. A delete_stream call that started before 0038 committed runs the
// function as it was (PL/pgSQL takes the body when the call starts), waits
// for the migration at the append lock and commits after it, without a
// record, above head; but it was queued on the lock before any call that
// started after the commit, so its deletion event lies below the first
// deletion record. Only a call that had started and not yet asked for the
// lock at the commit (microseconds) can land above that.
func (s recordsSince) after() int64 {
	if s.first > 0 {
		return s.first - 1
	}
	return s.head
}

// describe says where deletions have their records, for messages.
func (s recordsSince) describe() string {
	if s.first > 0 {
		return fmt.Sprintf("every deletion from the first deletion record, at position %d, on", s.first)
	}
	if s.head == math.MaxInt64 {
		// Not applied here, or deletions_recorded_after() not to be
		// run: a note says which.
		return "every deletion once it was applied, which this run could not tell: see the note on deletion records"
	}
	return fmt.Sprintf("every deletion above position %d, the head when it ran", s.head)
}

// stragglers describes, when there is one (waited), a deletion that was
// called while 0038 was applied.
func (s recordsSince) stragglers(waited bool) string {
	if !waited {
		return ""
	}
	return fmt.Sprintf("; those whose deletion events lie above position %d (deletions_recorded_after()) and below %d (the first deletion record) were deleted by delete_stream calls that started while migration 0038 was applied and waited for it: they ran the function as it was, without a record", s.head, s.first)
}

// pending explains, while no deletion has been recorded, the one
// legitimate deletion without a record above head: a call that started
// while 0038 was applied. The next recorded deletion tells it from one set
// some other way (it then lies below that record).
func (s recordsSince) pending(pos *int64) string {
	if s.first > 0 || s.head == math.MaxInt64 || (pos != nil && *pos <= s.head) {
		return ""
	}
	return "; unless its delete_stream call started while migration 0038 was applied (it then ran the function as it was, without a record): no deletion has been recorded since to tell, and once one is, such a deletion, below it, is checked as before"
}

// deletionsRecordedAfter reads deletions_recorded_after() (migration 0038)
// and the first deletion record in the log. Without the function (or the
// right to run it) and without any deletion record every deletion may be
// without a record: that is noted. A deletion record at or below the
// function's value is reported (the function was replaced: every deletion
// up to its value would be checked by the old rules), and so is the
// function missing from a schema that schema_migrations says has 0038.
func deletionsRecordedAfter(ctx context.Context, tx pgx.Tx, q map[string]string, rep *Report, maxProblems int) (recordsSince, error) {
	s := recordsSince{head: math.MaxInt64}
	var first *int64
	if err := tx.QueryRow(ctx, q["FirstDeletionRecord"]).Scan(&first); err != nil {
		return s, errors.Wrap(err, "verify: look for the first deletion record")
	}
	if first != nil {
		s.first = *first
	}
	var can *bool
	err := tx.QueryRow(ctx, q["DeletionsRecordedAfter"]).Scan(&can)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		applied, err := deletionsRecordedApplied(ctx, tx, q)
		if err != nil {
			return s, err
		}
		if applied {
			rep.add(maxProblems, Problem{Kind: GuardRemoved,
				Message: "deletions_recorded_after() is missing, but schema_migrations records migration 0038, which created it: it was dropped, and without it deletions without a record could not be told from older ones; recreate it as 0038 did (the head of the log when it ran; below the first deletion record)"})
		}
		if s.first == 0 {
			rep.note(NoteVersion, "deletions were checked without their records: the schema is older than migration 0038 (delete_stream records deletions in the metadata streams since)")
		}
		return s, nil
	case err != nil:
		return s, errors.Wrap(err, "verify: look up deletions_recorded_after")
	case can == nil:
		if s.first == 0 {
			rep.note(NotePrivileges, "deletions were checked without their records: no EXECUTE on deletions_recorded_after()")
		}
		return s, nil
	}
	if err := tx.QueryRow(ctx, q["DeletionsRecordedAfterValue"]).Scan(&s.head); err != nil {
		return s, errors.Wrap(err, "verify: read deletions_recorded_after")
	}
	if s.first > 0 && s.head >= s.first {
		rep.add(maxProblems, Problem{Kind: GuardRemoved, Position: s.first,
			Message: fmt.Sprintf("deletions_recorded_after() returns %d, but a deletion record lies at position %d, at or below it: migration 0038 made it return the head of the log when delete_stream began recording deletions, below every record; it was replaced, and deletions are checked against the first record instead",
				s.head, s.first)})
	}
	return s, nil
}

// deletionsRecordedApplied reports whether schema_migrations records
// migration 0038 (false when the role cannot read it).
func deletionsRecordedApplied(ctx context.Context, tx pgx.Tx, q map[string]string) (bool, error) {
	var exists, can, applied bool
	if err := tx.QueryRow(ctx, q["CanReadMigrations"]).Scan(&exists, &can); err != nil {
		return false, errors.Wrap(err, "verify: look up schema_migrations")
	}
	if !can {
		return false, nil
	}
	if err := tx.QueryRow(ctx, q["DeletionsRecordedApplied"]).Scan(&applied); err != nil {
		return false, errors.Wrap(err, "verify: read schema_migrations")
	}
	return applied, nil
}

// judge checks one stream's deletion and truncation against the log and
// records what its retention, truncation and deletion excuse. It reports
// whether the stream was let through by the rules for deletions older than
// their records (at or below since.after()), and whether its deletion event
// lies above deletions_recorded_after() (waited: its delete_stream call
// started while migration 0038 was applied).
func (lc *lifecycleRow) judge(rep *Report, maxProblems int, ex *excuses, limitsUnrecorded, canRuns bool, runs []scavengeRange, since recordsSince) (old, waited bool) {
	id := lc.id
	recordedAfter := since.after()
	above := func(pos *int64) bool { return pos != nil && since.head != math.MaxInt64 && *pos > since.head }
	meta := "$$" + id
	// Without a record left in a metadata stream that lost events (its
	// own retention, truncation or deletion, possible before migrations
	// 0021 and 0024), the stream's settings cannot be checked.
	lost := lc.lossy && lc.records == 0
	// beforeRecords reports whether a deletion event whose position is pos
	// (nil: removed by the scavenger, somewhere below before, -1: anywhere)
	// may be older than deletion records.
	beforeRecords := func(pos *int64, before int64) bool {
		if recordedAfter == math.MaxInt64 {
			return true
		}
		if pos != nil {
			return *pos <= recordedAfter
		}
		if before < 0 || before > recordedAfter+1 {
			before = recordedAfter + 1
		}
		return !canRuns || removedIn(runs, 0, before)
	}

	// Versions never go down, and no function sets truncate_before above
	// version + 1 (a deletion sets it just above its event, a truncation
	// at most there); every record names versions the stream reached.
	if lc.truncateBefore > lc.version+1 {
		rep.add(maxProblems, Problem{Kind: TruncationUnrecorded, StreamID: id, Version: lc.truncateBefore,
			Message: fmt.Sprintf("stream %q has truncate_before %d in streams, above its version %d + 1: neither set_stream_retention nor delete_stream sets it there; set some other way",
				id, lc.truncateBefore, lc.version)})
	}
	reached, by := int64(0), ""
	if lc.recordedTB != nil && *lc.recordedTB-1 > reached {
		reached, by = *lc.recordedTB-1, fmt.Sprintf("a %q record of %q holds truncate_before %d", truncatedType, meta, *lc.recordedTB)
	}
	if lc.delVersion != nil && *lc.delVersion > reached {
		reached, by = *lc.delVersion, fmt.Sprintf("a deletion at version %d is recorded in %q", *lc.delVersion, meta)
	}
	if reached > lc.version {
		rep.add(maxProblems, Problem{Kind: VersionLowered, StreamID: id, Version: lc.version,
			Message: fmt.Sprintf("stream %q is at version %d in streams, but %s: its version was lowered, and appends reuse versions it had",
				id, lc.version, by)})
	}

	// A deletion: delete_stream appends "$stream.deleted" at the new
	// version and sets truncate_before just above it; no append follows
	// (one that recreates the stream makes it live again), and the
	// scavenger removes that event only with every older event of the
	// stream (its run starts after the deletion, so every step of it
	// removes all versions below truncate_before). Since migration 0038 it
	// also records the deletion in the metadata stream, which keeps it: the
	// latest record says the state, unless an append recreated the stream
	// after a deletion that was not hard.
	deleted := false
	if lc.delVersion != nil || lc.anyHard {
		hard := lc.delHard != nil && *lc.delHard
		var want string
		switch {
		case lc.delVersion == nil:
		case hard && (lc.state != 2 || lc.version != *lc.delVersion):
			want = fmt.Sprintf("hard-deleted (state 2) at version %d: a hard-deleted stream takes no append and stays hard-deleted", *lc.delVersion)
		case !hard && lc.version == *lc.delVersion && lc.state != 1:
			want = fmt.Sprintf("deleted (state 1) at version %d, until an append recreates it", *lc.delVersion)
		case !hard && lc.version > *lc.delVersion && lc.state != 0:
			want = fmt.Sprintf("live (state 0) after version %d: an append recreated it, and a later deletion would be recorded too", *lc.delVersion)
		}
		if lc.anyHard && !hard {
			want = "hard-deleted (state 2): a hard-deleted stream takes no further deletion"
		}
		if want != "" {
			rep.add(maxProblems, Problem{Kind: DeletionUnrecorded, StreamID: id, Version: lc.version,
				Message: fmt.Sprintf("stream %q has state %d at version %d in streams, but the deletions %q records make it %s; the state was set some other way, and it excuses no missing event",
					id, lc.state, lc.version, meta, want)})
			lc.state = -1 // excuses nothing below
		}
	}
	if lc.state > 0 {
		what, hard := "deleted", "false"
		if lc.state == 2 {
			what, hard = "hard-deleted", "true"
		}
		recorded := lc.delVersion != nil && *lc.delVersion == lc.version
		switch {
		case !recorded && !beforeRecords(lc.atVersionPos, -1):
			at := "which the scavenger removed after migration 0038"
			if lc.atVersionPos != nil {
				at = fmt.Sprintf("at position %d", *lc.atVersionPos)
			}
			rep.add(maxProblems, Problem{Kind: DeletionUnrecorded, StreamID: id, Version: lc.version,
				Message: fmt.Sprintf("stream %q is %s in streams (state %d) at version %d, but %q records no deletion at that version, as delete_stream does since migration 0038 (%s), and its deletion event is %s; the state was set some other way, and it excuses no missing event%s",
					id, what, lc.state, lc.version, meta, since.describe(), at, since.pending(lc.atVersionPos))})
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
			old = old || !recorded
			waited = !recorded && above(lc.atVersionPos)
		}
	}

	// A truncation: set_stream_retention records the new truncate_before in
	// the metadata stream, and so does delete_stream since migration 0038.
	// An older deletion set it without a record, and then the stream is
	// deleted still, or was recreated by an append (its version is at least
	// truncate_before) after the "$stream.deleted" event at
	// truncate_before - 1, which is there unless the scavenger removed it
	// with every version below it.
	truncated := false
	if lc.truncateBefore > 1 {
		recreated := lc.state == 0 && lc.version >= lc.truncateBefore
		switch {
		case lc.truncateBefore > lc.version+1:
			// Reported above.
		case deleted:
			truncated = true
		case lc.recordedTB != nil && lc.truncateBefore <= *lc.recordedTB:
			truncated = true
		case lost:
			truncated = true
		case recreated && lc.belowTB != nil && *lc.belowTB == deletedType && beforeRecords(lc.belowTBPos, -1):
			truncated, old = true, true
			waited = waited || above(lc.belowTBPos)
		case recreated && lc.belowTB == nil && (lc.firstV == nil || *lc.firstV >= lc.truncateBefore) &&
			beforeRecords(nil, positionOr(lc.firstPos, -1)):
			// The deletion event was scavenged with every version below
			// it, by a run that removed events below the first kept (and,
			// for a deletion without its record, at or below the head
			// when records began).
			truncated, old = true, true
		case lc.state != 0:
			// Reported as DeletionUnrecorded.
		default:
			rec := fmt.Sprintf("no %q event of %q records any", truncatedType, meta)
			if lc.recordedTB != nil {
				rec = fmt.Sprintf("the %q events of %q record at most %d", truncatedType, meta, *lc.recordedTB)
			}
			del := "no deletion at version %d explains it"
			if recreated && (lc.firstV == nil || *lc.firstV >= lc.truncateBefore) {
				del = "no deletion at version %d explains it (its event is gone, and no scavenge run removed events where it was"
				if recordedAfter != math.MaxInt64 {
					del += fmt.Sprintf(" at or below position %d, before delete_stream recorded deletions", recordedAfter)
				}
				del += ")"
			}
			rep.add(maxProblems, Problem{Kind: TruncationUnrecorded, StreamID: id, Version: lc.truncateBefore,
				Message: fmt.Sprintf("stream %q has truncate_before %d in streams, but %s, and "+del+": set outside set_stream_retention and delete_stream; its missing events are reported",
					id, lc.truncateBefore, rec, lc.truncateBefore-1)})
		}
	}

	// A maximum count or age, now (as recorded) or in a record of the
	// past: the events it let the scavenger remove stay gone when it is
	// lifted. Only the records in force while a scavenge run removed
	// events count (all of them, when the runs cannot be read). A count
	// removes versions up to the stream's version at the time less the
	// count, never its newest; an age may remove any, the newest too. When
	// the metadata stream may have lost records, any limit it or the
	// stream shows excuses every version, as before the records were read.
	var (
		count      int64 // the smallest count in force (0: none)
		age        bool  // an age was in force
		permissive bool  // records may be missing
	)
	if !limitsUnrecorded {
		if lc.lossy && (lc.limits || lc.recordedLimits || lc.records == 0) {
			permissive = true
		} else {
			for i, pos := range lc.recPos {
				var next int64
				if i+1 < len(lc.recPos) {
					next = lc.recPos[i+1]
				}
				if canRuns && !ex.inForce.inForce(pos, lc.recAt[i], next) {
					continue
				}
				if c := lc.recCount[i]; c > 0 && (count == 0 || c < count) {
					count = c
				}
				age = age || lc.recAge[i]
			}
		}
	}

	if lost && (lc.limits || (lc.truncateBefore > 1 && !deleted)) {
		rep.note(NoteHistory, fmt.Sprintf("the retention of stream %q was not checked: its metadata stream %q lost its %q records (it has retention of its own or was deleted, possible before migration 0024)",
			id, "$$"+id, truncatedType))
	}

	// The versions below bound are excused; with tail, the newest too.
	tail := deleted || age || permissive
	var bound int64
	switch {
	case tail:
		bound = math.MaxInt64
	default:
		if truncated {
			bound = lc.truncateBefore
		}
		if count > 0 {
			bound = max(bound, lc.version-count+1)
		}
		if lc.limits || lc.recordedLimits {
			if count > 0 {
				ex.why[id] = fmt.Sprintf("; a maximum count lets the scavenger remove versions up to the stream's version less the count only (%d - %d: the smallest count in force while scavenge runs removed events), never the newest",
					lc.version, count)
			} else {
				ex.why[id] = "; no maximum count or age of it was in force while a scavenge run removed events, so its retention excuses none"
			}
		}
	}
	if bound <= 1 {
		return old, waited
	}
	// A truncation through the stream's version (set_stream_retention caps
	// it at version + 1) lets the scavenger remove every version, the
	// newest too: a run's steps before the change kept the older ones.
	tail = tail || bound > lc.version
	start := true
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
	ex.below[id] = bound
	return old, waited
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
