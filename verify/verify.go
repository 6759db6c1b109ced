package verify

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash"
	"slices"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/internal/schemaname"
	"github.com/annals-dev/annals/internal/sqltmpl"
)

//go:embed queries.sql
var queriesSQL string

// Config configures [Log]. A nil *Config means defaults.
type Config struct {
	// Schema is the annals schema to verify. Defaults to "annals".
	Schema string
	// PageSize is how many rows each read returns. Defaults to 5000.
	PageSize int
	// Interval is how many events a checkpoint of the new baseline covers.
	// Defaults to 10000.
	Interval int
	// Baseline, when set, is an earlier run's digest of the log: every range
	// of positions whose rows differ from it is reported as [Changed].
	// Defaults to nil: no comparison.
	Baseline *Baseline
	// MaxProblems is how many problems the report lists; the rest are only
	// counted. Defaults to 100.
	MaxProblems int
	// Progress, when set, is called as each phase starts and after each
	// page a phase reads. Defaults to nil.
	Progress func(Progress)
}

// Phase names the part of a run that [Progress] reports on.
type Phase string

// The phases of a run, in order.
const (
	// PhaseRecords: the catalog's guards, the streams' retention,
	// truncation and deletion records, and positions in both tables (a few
	// queries, each over the whole log).
	PhaseRecords Phase = "records"
	// PhaseEvents: the events, page by page in position order.
	PhaseEvents Phase = "events"
	// PhaseStreams: the streams table against the events, page by page.
	PhaseStreams Phase = "streams"
)

// Progress is how far a run has read.
type Progress struct {
	// Phase is the part of the run going on.
	Phase Phase
	// Position is the last position read; Head the highest one to read.
	Position, Head int64
	// Events is how many events have been read.
	Events int64
	// StreamRows is how many rows of the streams table have been read (in
	// PhaseStreams); Streams how many streams the events hold, about as
	// many as there are rows to read.
	StreamRows, Streams int64
}

// Kind classifies a [Problem].
type Kind string

// The problems [Log] reports. None of them can arise from appends through
// annals' functions: each means a row was written, changed or removed some
// other way (by the table's owner or a superuser).
const (
	// VersionGap: a stream's versions skip one or more numbers (a row was
	// deleted, or one inserted with a later version).
	VersionGap Kind = "version_gap"
	// DuplicateVersion: two events of a stream have the same version.
	DuplicateVersion Kind = "duplicate_version"
	// OutOfOrder: an event has a lower stream version than an event of the
	// same stream at a lower position (a row inserted out of order).
	OutOfOrder Kind = "out_of_order"
	// StreamVersion: streams.version is not the stream's highest event
	// version.
	StreamVersion Kind = "stream_version"
	// StreamRowMissing: a stream has events but no row in streams.
	StreamRowMissing Kind = "stream_row_missing"
	// StreamWithoutEvents: a row in streams has no events.
	StreamWithoutEvents Kind = "stream_without_events"
	// BeyondSequence: an event's position is above every position the
	// append function ever drew: it was not appended through it (a forged
	// position, which subscribers would jump to).
	BeyondSequence Kind = "beyond_sequence"
	// Changed: the rows in a range of positions differ from the baseline
	// (a row's content changed, a row was deleted or inserted).
	Changed Kind = "changed"
	// DuplicatePosition: a position is held by a row in events and by one
	// in events_archive (archive moves a row; it never copies one).
	DuplicatePosition Kind = "duplicate_position"
	// RetentionUnrecorded: a stream's maximum count or age in streams is
	// not what the latest "$stream.truncated" event of its metadata stream
	// records (set_stream_retention writes both, together): the setting
	// was changed some other way, and it would excuse missing events, so
	// they are reported as if the stream had no such setting.
	RetentionUnrecorded Kind = "retention_unrecorded"
	// TruncationUnrecorded: a stream's truncate_before in streams is above
	// what its "$stream.truncated" records hold and no deletion explains
	// it (delete_stream sets it just above its "$stream.deleted" event, and
	// a deleted stream is recreated only by an append): it was set some
	// other way, and it would excuse missing events, so they are reported.
	TruncationUnrecorded Kind = "truncation_unrecorded"
	// DeletionUnrecorded: streams marks a stream deleted, but the log
	// contradicts it: its truncate_before is not just above its version,
	// or events of it remain while its newest event is not the
	// "$stream.deleted" event delete_stream appends (the scavenger removes
	// that event only together with all older events of the stream). The
	// state was set some other way, and the deletion excuses no missing
	// event.
	DeletionUnrecorded Kind = "deletion_unrecorded"
	// ScavengeClockAhead: a scavenge run that removed events had a
	// retention clock (scavenge_runs.now_at) more than
	// [ScavengeClockTolerance] later than its start: it removed events of
	// streams with a maximum age that the age still kept, and which ones
	// cannot be told. Before migration 0027 scavenge() took the caller's
	// time unbounded; since, a run's clock is never later than the
	// server's.
	ScavengeClockAhead Kind = "scavenge_clock_ahead"
	// VersionLowered: a stream's version in streams is below a version the
	// records of its metadata stream show it reached (the version of a
	// recorded deletion, a recorded truncate_before less one): versions
	// never go down, and appends after the change reuse versions the
	// stream had, with other content.
	VersionLowered Kind = "version_lowered"
	// GuardRemoved: a trigger or unique index the log's guarantees rest on
	// is missing, disabled or changed: the append-only trigger of events,
	// the guard of events_archive, or the uniqueness of positions, event
	// IDs, (stream, version) pairs and stream IDs. Whoever did it (the
	// schema's owner or a superuser) can change the log unseen by them
	// while it lasts; [Log] then finds only what the rows still show. Also
	// deletions_recorded_after() (migration 0038) returning a position at
	// or above a deletion record (Position: the first record), or missing
	// while schema_migrations records 0038: replaced or dropped, it would
	// let deletions without a record pass as older than the records. Also
	// row-level security enabled on a table Log reads (events,
	// events_archive, streams, scavenge_runs, schema_migrations; annals
	// enables it on none): its policies can hide rows from the role that
	// runs Log while other roles, subscribers among them, read them. Also
	// a trigger or rule on events, events_archive or streams that annals
	// did not create, or a table inheriting from one of them: a BEFORE
	// INSERT trigger can rewrite events as they are appended. Also a
	// function of the schema missing or not as the migrations made it
	// (its body, SECURITY DEFINER, settings).
	GuardRemoved Kind = "guard_removed"
)

// Problem is one inconsistency in the log.
type Problem struct {
	Kind Kind `json:"kind"`
	// Position is the event's position; for Changed, the range's last
	// position (inclusive). Zero for problems of the streams table.
	Position int64 `json:"position,omitempty"`
	// After is, for Changed, the position the range starts after.
	After int64 `json:"after,omitempty"`
	// StreamID and Version name the stream and the version concerned.
	StreamID string `json:"stream_id,omitempty"`
	Version  int64  `json:"version,omitempty"`
	// Message says what is wrong in one line.
	Message string `json:"message"`
}

// Report is the outcome of [Log].
type Report struct {
	// Schema is the schema verified.
	Schema string `json:"schema"`
	// Head is the highest position in the log (0 when it is empty).
	Head int64 `json:"head"`
	// Sequence is the last position the append function drew, or nil when
	// the sequence could not be read (the role has no SELECT on it).
	Sequence *int64 `json:"sequence"`
	// Events and Streams count the events and the distinct streams in them.
	Events  int64 `json:"events"`
	Streams int64 `json:"streams"`
	// Problems lists the first Config.MaxProblems problems in the order
	// they were found; ProblemCount counts them all.
	Problems     []Problem `json:"problems"`
	ProblemCount int       `json:"problem_count"`
	// BaselineHead is the head of the baseline compared against (0: none).
	BaselineHead int64 `json:"baseline_head,omitempty"`
	// Digest is the SHA-256 of the whole log as read, in position order
	// (hex): equal digests mean equal logs.
	Digest string `json:"digest"`
	// Notes are what the run could not check.
	Notes []string `json:"notes,omitempty"`
	// NoteCauses says why, one for each note.
	NoteCauses []NoteCause `json:"note_causes,omitempty"`
	// Baseline is this run's digest of the log, to compare the next run
	// with. Keep it outside the database, and only from a run without
	// problems.
	Baseline *Baseline `json:"-"`
}

// NoteCause says why a check was not made.
type NoteCause string

const (
	// NotePrivileges: the role lacks a privilege the check needs (annals
	// grant operator gives them all).
	NotePrivileges NoteCause = "privileges"
	// NoteVersion: the schema is not at the migration this verify knows
	// (older: annals migrate upgrades it; newer: verify with the annals
	// that migrated it), or its migration is not recorded
	// (schema_migrations missing: applied from annals migrate --print).
	NoteVersion NoteCause = "version"
	// NoteHistory: rows an older annals wrote without what the check
	// needs (a deletion before migration 0038 has no record): no role
	// and no migration makes it possible.
	NoteHistory NoteCause = "history"
	// NoteServer: the check depends on how the server prints what it
	// stores, and this server is of another major version than the one
	// verify's reference was made on (the functions with SQL-standard
	// bodies, which PostgreSQL deparses: functions.json is PostgreSQL
	// 15's). No role and no migration changes it.
	NoteServer NoteCause = "server"
)

// note adds a note and its cause.
func (r *Report) note(cause NoteCause, text string) {
	r.Notes = append(r.Notes, text)
	r.NoteCauses = append(r.NoteCauses, cause)
}

// Skipped counts the notes of the given causes.
func (r *Report) Skipped(causes ...NoteCause) int {
	n := 0
	for _, c := range r.NoteCauses {
		if slices.Contains(causes, c) {
			n++
		}
	}
	return n
}

// OK reports whether the run found no problem.
func (r *Report) OK() bool { return r.ProblemCount == 0 }

// Complete reports whether the run made every check: a run without Notes.
// A role with fewer privileges than an operator's skips some (each skipped
// check is a note) and can still be OK.
func (r *Report) Complete() bool { return len(r.Notes) == 0 }

// MarshalJSON writes p as its fields say, except that a Changed problem
// always carries "after", also when its range starts after position 0.
func (p Problem) MarshalJSON() ([]byte, error) {
	type plain Problem
	if p.Kind != Changed {
		return json.Marshal(plain(p))
	}
	return json.Marshal(struct {
		plain
		After int64 `json:"after"`
	}{plain(p), p.After})
}

func (r *Report) add(max int, p Problem) {
	r.ProblemCount++
	if len(r.Problems) < max {
		r.Problems = append(r.Problems, p)
	}
}

// streamState is what the scan remembers of a stream.
type streamState struct {
	last    int64 // highest version seen so far
	lastPos int64 // its position
}

// Log reads the whole log of the configured schema, in pages, from one
// snapshot, and reports every inconsistency that appends through annals'
// functions cannot produce: gaps, duplicates and disorder in a stream's
// versions, streams rows that disagree with the events, positions above the
// position sequence, and (with a baseline) every range of positions whose
// rows changed since the baseline was taken. It needs SELECT on events and
// streams (and on the sequence for the sequence check); it writes nothing.
// It keeps one small entry per stream in memory.
//
// The run holds a REPEATABLE READ transaction open while it reads, which
// keeps VACUUM from removing rows deleted meanwhile anywhere in the database.
func Log(ctx context.Context, pool *pgxpool.Pool, cfg *Config) (*Report, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	q, err := sqltmpl.Named("queries.sql", queriesSQL, sqltmpl.NewData(c.Schema))
	if err != nil {
		return nil, err
	}
	if c.Baseline != nil {
		if err := c.Baseline.valid(); err != nil {
			return nil, err
		}
		if c.Baseline.Schema != c.Schema {
			return nil, errors.Wrapf(ErrBadBaseline, "the baseline is of schema %q, not %q", c.Baseline.Schema, c.Schema)
		}
	}
	rep := &Report{Schema: c.Schema, Problems: []Problem{}}
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, errors.Wrap(err, "verify: begin")
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	if err := tx.QueryRow(ctx, q["Head"]).Scan(&rep.Head); err != nil {
		return nil, errors.Wrapf(err, "verify: read the head of %s", schemaname.Ident(c.Schema))
	}
	var canSeq bool
	if err := tx.QueryRow(ctx, q["CanReadSequence"]).Scan(&canSeq); err != nil {
		return nil, errors.Wrap(err, "verify: look up the position sequence")
	}
	if canSeq {
		var seq int64
		if err := tx.QueryRow(ctx, q["Sequence"]).Scan(&seq); err != nil {
			return nil, errors.Wrap(err, "verify: read the position sequence")
		}
		rep.Sequence = &seq
	} else {
		rep.note(NotePrivileges, "positions were not compared with the position sequence: no SELECT on it (annals grant operator gives it)")
	}

	progress := func(p Progress) {
		if c.Progress != nil {
			p.Head, p.Events = rep.Head, rep.Events
			c.Progress(p)
		}
	}
	progress(Progress{Phase: PhaseRecords})

	// The guards of the log, in the catalog.
	grows, err := tx.Query(ctx, q["Guards"])
	if err != nil {
		return nil, errors.Wrap(err, "verify: look up the log's triggers and unique indexes")
	}
	var table, wrong, now, why string
	if _, err := pgx.ForEachRow(grows, []any{&table, &wrong, &now, &why}, func() error {
		rep.add(c.MaxProblems, Problem{Kind: GuardRemoved,
			Message: fmt.Sprintf("%s.%s: %s (now: %s): %s", schemaname.Ident(c.Schema), table, wrong, now, why)})
		return nil
	}); err != nil {
		return nil, errors.Wrap(err, "verify: look up the log's triggers and unique indexes")
	}
	// The functions that write and guard the log, as the migrations made
	// them.
	if err := checkFunctions(ctx, tx, q, rep, c); err != nil {
		return nil, err
	}

	// Streams with retention, truncated or deleted: the scavenger may have
	// removed their oldest events (all of them, for a deleted stream) or,
	// by age, their newest; only what the log records excuses that.
	ex, err := checkLifecycle(ctx, tx, q, rep, c.MaxProblems)
	if err != nil {
		return nil, err
	}

	// A position in both tables: paging by position would read one copy
	// only, so they are looked for on their own.
	drows, err := tx.Query(ctx, q["SamePosition"])
	if err != nil {
		return nil, errors.Wrap(err, "verify: look for positions in both events and events_archive")
	}
	var (
		dpos      int64
		hot, cold string
	)
	if _, err := pgx.ForEachRow(drows, []any{&dpos, &hot, &cold}, func() error {
		rep.add(c.MaxProblems, Problem{Kind: DuplicatePosition, Position: dpos, StreamID: hot,
			Message: fmt.Sprintf("position %d is in events (stream %q) and in events_archive (stream %q): one of the rows was not written by annals", dpos, hot, cold)})
		return nil
	}); err != nil {
		return nil, errors.Wrap(err, "verify: look for positions in both events and events_archive")
	}

	seg := newSegmenter(c.Interval, c.Baseline)
	streams := map[string]streamState{}
	var (
		after int64
		row   eventRow
		buf   []byte
	)
	progress(Progress{Phase: PhaseEvents})
	for {
		rows, err := tx.Query(ctx, q["Events"], after, c.PageSize)
		if err != nil {
			return nil, errors.Wrap(err, "verify: read events")
		}
		n := 0
		_, err = pgx.ForEachRow(rows, row.targets(), func() error {
			n++
			rep.Events++
			after = row.position
			buf = row.encode(buf[:0])
			seg.add(row.position, buf)
			if rep.Sequence != nil && row.position > *rep.Sequence {
				rep.add(c.MaxProblems, Problem{Kind: BeyondSequence, Position: row.position, StreamID: row.stream, Version: row.version,
					Message: fmt.Sprintf("position %d is above the last position the append function drew (%d): the row was not appended through it", row.position, *rep.Sequence)})
			}
			st, seen := streams[row.stream]
			switch {
			case !seen && row.version != 1 && !ex.gap(row.stream, row.version-1, 0, row.position):
				rep.add(c.MaxProblems, Problem{Kind: VersionGap, Position: row.position, StreamID: row.stream, Version: row.version,
					Message: fmt.Sprintf("stream %q starts at version %d: versions 1 to %d are missing%s", row.stream, row.version, row.version-1, ex.why[row.stream])})
			case seen && row.version == st.last+1:
			case seen && row.version > st.last+1 && ex.gap(row.stream, row.version-1, st.lastPos, row.position):
			case seen && row.version > st.last+1:
				rep.add(c.MaxProblems, Problem{Kind: VersionGap, Position: row.position, StreamID: row.stream, Version: row.version,
					Message: fmt.Sprintf("stream %q jumps from version %d (position %d) to %d (position %d): %s missing%s",
						row.stream, st.last, st.lastPos, row.version, row.position, versionRange(st.last+1, row.version-1), ex.why[row.stream])})
			case seen && row.version == st.last:
				rep.add(c.MaxProblems, Problem{Kind: DuplicateVersion, Position: row.position, StreamID: row.stream, Version: row.version,
					Message: fmt.Sprintf("stream %q has version %d twice: at positions %d and %d", row.stream, row.version, st.lastPos, row.position)})
			case seen:
				rep.add(c.MaxProblems, Problem{Kind: OutOfOrder, Position: row.position, StreamID: row.stream, Version: row.version,
					Message: fmt.Sprintf("stream %q has version %d at position %d, after version %d at position %d", row.stream, row.version, row.position, st.last, st.lastPos)})
			}
			if !seen || row.version > st.last {
				streams[row.stream] = streamState{last: row.version, lastPos: row.position}
			}
			return nil
		})
		if err != nil {
			return nil, errors.Wrap(err, "verify: read events")
		}
		progress(Progress{Phase: PhaseEvents, Position: after})
		if n < c.PageSize {
			break
		}
	}
	rep.Streams = int64(len(streams))

	// The streams table against the events.
	var (
		from string
		read int64
	)
	progress(Progress{Phase: PhaseStreams, Position: after, Streams: rep.Streams})
	for {
		rows, err := tx.Query(ctx, q["Streams"], from, c.PageSize)
		if err != nil {
			return nil, errors.Wrap(err, "verify: read streams")
		}
		var id string
		var version int64
		n := 0
		_, err = pgx.ForEachRow(rows, []any{&id, &version}, func() error {
			n++
			from = id
			st, ok := streams[id]
			switch {
			case !ok && ex.start[id] && ex.below[id] > version:
			case !ok:
				rep.add(c.MaxProblems, Problem{Kind: StreamWithoutEvents, StreamID: id, Version: version,
					Message: fmt.Sprintf("stream %q is at version %d in streams but has no events%s", id, version, ex.why[id])})
			case st.last != version && !(ex.tail[id] && st.last < version):
				rep.add(c.MaxProblems, Problem{Kind: StreamVersion, StreamID: id, Version: version,
					Message: fmt.Sprintf("stream %q is at version %d in streams, but its highest event is version %d%s", id, version, st.last, ex.why[id])})
			}
			if ok {
				st.lastPos = -1 // has its row
				streams[id] = st
			}
			return nil
		})
		if err != nil {
			return nil, errors.Wrap(err, "verify: read streams")
		}
		read += int64(n)
		progress(Progress{Phase: PhaseStreams, Position: after, StreamRows: read, Streams: rep.Streams})
		if n < c.PageSize {
			break
		}
	}
	for id, st := range streams {
		if st.lastPos != -1 {
			rep.add(c.MaxProblems, Problem{Kind: StreamRowMissing, StreamID: id, Version: st.last,
				Message: fmt.Sprintf("stream %q has events up to version %d but no row in streams", id, st.last)})
		}
	}

	rep.Baseline, rep.Digest = seg.finish(rep.Head)
	rep.Baseline.Schema = c.Schema
	rep.Baseline.Events = rep.Events
	if c.Baseline != nil {
		rep.BaselineHead = c.Baseline.Head
		for _, p := range seg.compare(c.Baseline) {
			rep.add(c.MaxProblems, p)
		}
	}
	return rep, nil
}

func versionRange(from, to int64) string {
	if from == to {
		return fmt.Sprintf("version %d is", from)
	}
	return fmt.Sprintf("versions %d to %d are", from, to)
}

func (c *Config) withDefaults() (Config, error) {
	var out Config
	if c != nil {
		out = *c
	}
	var err error
	if out.Schema, err = schemaname.Resolve(out.Schema); err != nil {
		return out, err
	}
	if out.PageSize <= 0 {
		out.PageSize = 5000
	}
	if out.Interval <= 0 {
		out.Interval = 10000
	}
	if out.MaxProblems <= 0 {
		out.MaxProblems = 100
	}
	return out, nil
}

// eventRow is one row of the log as read.
type eventRow struct {
	position, version int64
	id                uuid.UUID
	stream, typ, data string
	metadata          *string
	recordedAt        time.Time
}

func (r *eventRow) targets() []any {
	return []any{&r.position, &r.id, &r.stream, &r.version, &r.typ, &r.data, &r.metadata, &r.recordedAt}
}

// encode appends the row's canonical form to b: every column, fixed-size
// or length-prefixed, so that no two different rows encode the same.
func (r *eventRow) encode(b []byte) []byte {
	b = binary.BigEndian.AppendUint64(b, uint64(r.position))
	b = append(b, r.id[:]...)
	b = appendString(b, r.stream)
	b = binary.BigEndian.AppendUint64(b, uint64(r.version))
	b = appendString(b, r.typ)
	b = appendString(b, r.data)
	if r.metadata == nil {
		b = append(b, 0)
	} else {
		b = append(b, 1)
		b = appendString(b, *r.metadata)
	}
	return binary.BigEndian.AppendUint64(b, uint64(r.recordedAt.UnixMicro()))
}

func appendString(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint64(b, uint64(len(s)))
	return append(b, s...)
}

// segmenter hashes the log in segments of positions: the boundaries of a
// baseline where it has them, then one every interval events.
type segmenter struct {
	bounds    []int64 // baseline boundaries not yet reached
	interval  int64
	running   hash.Hash
	seg       hash.Hash
	segEvents int64
	lastBound int64
	out       []Checkpoint
}

func newSegmenter(interval int, base *Baseline) *segmenter {
	s := &segmenter{interval: int64(interval), running: sha256.New(), seg: sha256.New()}
	if base != nil {
		for _, cp := range base.Checkpoints {
			s.bounds = append(s.bounds, cp.Position)
		}
	}
	return s
}

func (s *segmenter) add(pos int64, row []byte) {
	for len(s.bounds) > 0 && s.bounds[0] < pos {
		s.close(s.bounds[0])
		s.bounds = s.bounds[1:]
	}
	_, _ = s.running.Write(row)
	_, _ = s.seg.Write(row)
	s.segEvents++
	if len(s.bounds) == 0 && s.segEvents >= s.interval {
		s.close(pos)
	}
}

func (s *segmenter) close(pos int64) {
	s.out = append(s.out, Checkpoint{
		Position: pos,
		Events:   s.segEvents,
		Segment:  hex.EncodeToString(s.seg.Sum(nil)),
		Running:  hex.EncodeToString(s.running.Sum(nil)),
	})
	s.seg.Reset()
	s.segEvents = 0
	s.lastBound = pos
}

// finish closes the last segments and returns the baseline and the digest
// of the whole log.
func (s *segmenter) finish(head int64) (*Baseline, string) {
	for _, b := range s.bounds {
		s.close(b)
	}
	s.bounds = nil
	if s.segEvents > 0 {
		s.close(head)
	}
	return &Baseline{Format: BaselineFormat, CreatedAt: time.Now().UTC(), Head: head,
		Digest: hex.EncodeToString(s.running.Sum(nil)), Checkpoints: s.out}, hex.EncodeToString(s.running.Sum(nil))
}

// eventCount is n with "event" or "events".
func eventCount(n int64) string {
	if n == 1 {
		return "1 event"
	}
	return fmt.Sprintf("%d events", n)
}

// compare returns a Changed problem for every segment of base whose rows
// differ now. The segmenter's first segments have base's boundaries.
func (s *segmenter) compare(base *Baseline) []Problem {
	var out []Problem
	var after int64
	for i, want := range base.Checkpoints {
		got := s.out[i]
		if got.Position != want.Position {
			panic(fmt.Sprintf("verify: segment %d ends at %d, baseline at %d", i, got.Position, want.Position))
		}
		if got.Segment != want.Segment {
			out = append(out, Problem{Kind: Changed, After: after, Position: want.Position,
				Message: fmt.Sprintf("the events at positions %d to %d differ from the baseline (%s now, %d then): rows were changed, deleted or inserted",
					after+1, want.Position, eventCount(got.Events), want.Events)})
		}
		after = want.Position
	}
	return out
}

// ScavengeClockTolerance is how much later than a scavenge run's start its
// clock may be before [Log] reports it as [ScavengeClockAhead]. Runs from
// before migration 0027 took the clock of the client that started them
// (scavenge.Config.Clock, time.Now by default), which may be a little
// ahead of the server's; later runs are never ahead at all.
const ScavengeClockTolerance = time.Minute
