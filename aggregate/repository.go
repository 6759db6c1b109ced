package aggregate

import (
	"context"
	_ "embed"
	"iter"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/cockroachdb/errors"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/freshids"
	"github.com/annals-dev/annals/internal/lockfallback"
	"github.com/annals-dev/annals/internal/sqltmpl"
	"github.com/annals-dev/annals/internal/telemetry"
)

//go:embed queries.sql
var queriesSQL string

// Config configures a Repository. A nil *Config means defaults.
type Config struct {
	// StreamID names the stream of the aggregate with the given type and ID.
	// It must be deterministic and return a non-empty name. Defaults to
	// aggregateType + "-" + id, e.g. "account-42".
	StreamID func(aggregateType, id string) string
	// UpdateRetries is how many times Update tries again after losing a
	// race (eventstore.ErrWrongExpectedVersion), reloading the aggregate and
	// re-running the command each time. Defaults to 10; -1 means no retries.
	UpdateRetries int
	// UpdateBackoff is the pause before Update's first retry; retry n waits
	// UpdateBackoff × 2^(n-1), at most 100 × UpdateBackoff, with ±50% jitter
	// so that competing writers spread out. Defaults to 2ms.
	UpdateBackoff time.Duration
	// Snapshots enables snapshots for this aggregate type. Defaults to nil:
	// every Load replays the whole stream.
	Snapshots *SnapshotConfig
	// Metadata, when set, returns the metadata (correlation and causation
	// IDs, anything else) given to every event a Save appends, from the
	// Save's context. Defaults to none.
	Metadata func(ctx context.Context) eventstore.Metadata
	// OnLoad, when set, is called after every successful Load with what the
	// load read: for metrics, and for tests that check snapshots are used.
	// It must not block. Defaults to none.
	OnLoad func(LoadStats)
	// Logger receives failed snapshot writes and unusable snapshots (both
	// only cost speed). Defaults to warnings and errors on slog.Default()
	// (information and debug records dropped).
	Logger *slog.Logger
}

// SnapshotConfig turns snapshots on for an aggregate type.
type SnapshotConfig struct {
	// Every writes a snapshot after a Save that brings the stream to or
	// past a multiple of Every events. Required: at least 1.
	Every int
	// SchemaVersion is the version of the aggregate's snapshot shape. Load
	// only uses a snapshot written with the same SchemaVersion; bump it
	// whenever the aggregate's state (its JSON, or what Apply computes)
	// changes, and loads replay from the first event until the next
	// snapshot is written. Defaults to 1 (when 0); negative is refused.
	SchemaVersion int
}

// LoadStats describes one Load.
type LoadStats struct {
	// AggregateType, ID and StreamID identify what was loaded.
	AggregateType, ID, StreamID string
	// SnapshotVersion is the stream version of the snapshot the load
	// started from; 0 when it replayed the stream from the first event.
	SnapshotVersion int64
	// EventsRead is the number of events read and applied.
	EventsRead int
	// Version is the aggregate's version after the load.
	Version int64
	// Duration is how long the load took.
	Duration time.Duration
}

// Repository loads aggregates of one type from their streams and saves
// their new events. It is safe for concurrent use (an aggregate value is
// not: load one per goroutine).
type Repository[A Root] struct {
	store  *eventstore.Store
	reg    *eventstore.Registry
	typ    string
	newAgg func() A
	cfg    Config
	q      map[string]string
	// snapshotLockFn chooses how snapshot writes take Forget's lock:
	// through snapshot_lock, or pg_try_advisory_xact_lock_shared on a
	// schema migrated before 0034 (see snapshotLock).
	snapshotLockFn lockfallback.Switch
}

// NewRepository returns the repository of the aggregate type named
// aggregateType (e.g. "account"), whose empty values newAgg returns. Events
// are appended to and read from store, and decoded with its registry: every
// event type the aggregate records or applies must be registered there.
func NewRepository[A Root](store *eventstore.Store, aggregateType string, newAgg func() A, cfg *Config) (*Repository[A], error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	switch {
	case store == nil:
		return nil, errors.New("aggregate: store is nil")
	case aggregateType == "":
		return nil, errors.New("aggregate: the aggregate type name is empty")
	case newAgg == nil:
		return nil, errors.Newf("aggregate %s: the constructor is nil", aggregateType)
	case c.UpdateRetries < -1:
		return nil, errors.Newf("aggregate %s: UpdateRetries %d; use -1 for none", aggregateType, c.UpdateRetries)
	case c.UpdateBackoff < 0:
		return nil, errors.Newf("aggregate %s: negative UpdateBackoff", aggregateType)
	}
	if c.StreamID == nil {
		c.StreamID = func(typ, id string) string { return typ + "-" + id }
	}
	switch {
	case c.UpdateRetries == 0:
		c.UpdateRetries = 10
	case c.UpdateRetries < 0:
		c.UpdateRetries = 0
	}
	if c.UpdateBackoff == 0 {
		c.UpdateBackoff = 2 * time.Millisecond
	}
	if c.Snapshots != nil {
		s := *c.Snapshots
		switch {
		case s.Every < 1:
			return nil, errors.Newf("aggregate %s: invalid snapshot config %+v (Every must be at least 1)", aggregateType, s)
		case s.SchemaVersion < 0:
			return nil, errors.Newf("aggregate %s: invalid snapshot config %+v (SchemaVersion must be at least 1, or 0 for the default 1)", aggregateType, s)
		}
		if s.SchemaVersion == 0 {
			s.SchemaVersion = 1
		}
		c.Snapshots = &s
	}
	if c.Logger == nil {
		c.Logger = telemetry.DefaultLogger()
	}
	if isNil(newAgg()) {
		return nil, errors.Newf("aggregate %s: the constructor returned nil", aggregateType)
	}
	q, err := sqltmpl.Named("queries.sql", queriesSQL, sqltmpl.NewData(store.Schema()))
	if err != nil {
		return nil, err
	}
	return &Repository[A]{store: store, reg: store.Registry(), typ: aggregateType, newAgg: newAgg, cfg: c, q: q}, nil
}

// Type returns the aggregate type name.
func (r *Repository[A]) Type() string { return r.typ }

// StreamID returns the stream of the aggregate with the given ID.
func (r *Repository[A]) StreamID(id string) string { return r.cfg.StreamID(r.typ, id) }

func (r *Repository[A]) stream(id string) (string, error) {
	if id == "" {
		return "", errors.Wrapf(ErrInvalidID, "aggregate %s: the ID is empty", r.typ)
	}
	s := r.cfg.StreamID(r.typ, id)
	if s == "" {
		return "", errors.Wrapf(ErrInvalidID, "aggregate %s %s: Config.StreamID returned an empty stream ID", r.typ, quoteID(id))
	}
	if err := eventstore.CheckStreamID(s); err != nil {
		// Marked, not wrapped: the reason is the stream ID's, and the
		// *InvalidEventError stays reachable with errors.As. mark, not
		// cockroachdb's errors.Mark, which the standard library's
		// errors.Is does not see.
		return "", mark(errors.Wrapf(err, "aggregate %s %s: the ID makes a stream ID no append takes", r.typ, quoteID(id)), ErrInvalidID)
	}
	return s, nil
}

// quoteID quotes an aggregate ID for an error message, cut to its first 64
// bytes when longer (an over-long ID is an error's subject, not its text).
func quoteID(id string) string {
	const max = 64
	if len(id) <= max {
		return strconv.Quote(id)
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(id[cut]) {
		cut--
	}
	return strconv.Quote(id[:cut]) + "… (" + strconv.Itoa(len(id)) + " bytes)"
}

// New returns a new, empty aggregate with the given ID at version 0.
// Saving it creates its stream; the save fails with
// eventstore.ErrWrongExpectedVersion if the stream exists by then.
func (r *Repository[A]) New(id string) (A, error) {
	if _, err := r.stream(id); err != nil {
		var zero A
		return zero, err
	}
	a := r.newAgg()
	a.root().id = id
	return a, nil
}

// Load replays the aggregate's stream (from its newest usable snapshot, if
// snapshots are on) and returns the aggregate at the stream's current
// version. Errors: ErrNotFound when the stream has no events; ErrInvalidID;
// ErrUnhandledEvent (or what Apply returned) and
// eventstore.ErrUnknownEventType for an event the aggregate cannot apply,
// named with its type and version; eventstore.ErrStreamDeleted when the
// stream is deleted.
//
// The state is the fold of the events stream reads return, with or without
// snapshots: a stream recreated after a delete, or truncated, loads from its
// first visible event, and a snapshot that folds events hidden since (a
// truncation, a maximum count) is ignored. A stream with a maximum age is
// always replayed.
func (r *Repository[A]) Load(ctx context.Context, id string) (A, error) {
	return r.load(ctx, nil, id)
}

// LoadTx is Load reading inside tx: it sees tx's own appends (an aggregate
// saved earlier in tx with SaveTx), and the snapshot is read in tx too.
func (r *Repository[A]) LoadTx(ctx context.Context, tx pgx.Tx, id string) (A, error) {
	if tx == nil {
		var zero A
		return zero, errors.Newf("aggregate %s: LoadTx with a nil transaction", r.typ)
	}
	return r.load(ctx, tx, id)
}

func (r *Repository[A]) load(ctx context.Context, tx pgx.Tx, id string) (A, error) {
	var zero A
	start := time.Now()
	stream, err := r.stream(id)
	if err != nil {
		return zero, err
	}
	a, ok, err := r.loadSnapshot(ctx, tx, id, stream)
	if err != nil {
		return zero, err
	}
	if !ok {
		a = r.newAgg()
		a.root().id = id
	}
	b := a.root()
	stats := LoadStats{AggregateType: r.typ, ID: id, StreamID: stream, SnapshotVersion: b.version}
	first := true
	events := r.store.ReadStream
	if tx != nil {
		events = func(ctx context.Context, stream string, from int64) iter.Seq2[eventstore.Event, error] {
			return r.store.ReadStreamTx(ctx, tx, stream, from)
		}
	}
	for e, err := range events(ctx, stream, b.version+1) {
		if err != nil {
			if errors.Is(err, eventstore.ErrStreamNotFound) {
				return zero, mark(errors.Wrapf(err, "aggregate %s %q", r.typ, id), ErrNotFound)
			}
			return zero, errors.Wrapf(err, "aggregate %s %q: load", r.typ, id)
		}
		if first && e.StreamVersion > b.version+1 {
			// The stream was truncated or deleted and recreated (or
			// truncated after the snapshot was read): the events before e
			// no longer count, and neither does a snapshot of them.
			// Start afresh at e.
			a = r.newAgg()
			a.root().id = id
			b = a.root()
			b.version = e.StreamVersion - 1
			stats.SnapshotVersion = 0
		}
		if first && b.from == 0 {
			b.from = e.StreamVersion
		}
		first = false
		if e.StreamVersion != b.version+1 {
			return zero, errors.Newf("aggregate %s %q: stream %q jumps from version %d to %d", r.typ, id, stream, b.version, e.StreamVersion)
		}
		ev, err := r.reg.Decode(e)
		if err != nil {
			return zero, errors.Wrapf(err, "aggregate %s %q: event %q at version %d", r.typ, id, e.Type, e.StreamVersion)
		}
		if err := a.Apply(ev); err != nil {
			return zero, applyError(r.typ, id, e.Type, ev, e.StreamVersion, err)
		}
		b.version = e.StreamVersion
		stats.EventsRead++
	}
	stats.Version = b.version
	stats.Duration = time.Since(start)
	if r.cfg.OnLoad != nil {
		r.cfg.OnLoad(stats)
	}
	return a, nil
}

// Save appends the events recorded on a since it was loaded (or created
// with New), expecting the stream to still be at the loaded version. On
// success a is at the new version with nothing uncommitted, its
// SavedPosition is the log position of its last event (what Client.Await
// waits for, for read-your-writes), and a snapshot
// is written if one is due (after the append has committed; a failed
// snapshot write is logged and does not fail the save). Saving an aggregate
// with no uncommitted events does nothing.
//
// Errors: eventstore.ErrWrongExpectedVersion when another writer appended
// to the stream since a was loaded (load again and retry, or use Update);
// eventstore.ErrUnknownEventType for an unregistered event; ErrInvalidID.
// On error a is unchanged (but for the event IDs below) and nothing is
// written, with one exception: when ctx ends (or the connection is lost)
// while the append is on its way to the database, the error matches
// eventstore.ErrOutcomeUnknown (and ctx's error, when ctx ended): the
// events may have been written. (One that matches eventstore.ErrNotWritten
// was never sent.)
//
// Retrying. The first Save that tries to append a's uncommitted events
// gives them their event IDs (UUIDv7), and a keeps them until a Save
// succeeds. So after ErrOutcomeUnknown, Save a again, unchanged (record
// nothing more on it first): the events go with the same IDs and the same
// expected version. If the first attempt was written, that is an
// idempotent re-append: Save returns nil and a is at the stored version,
// with nothing written twice. If it was not, the events are appended now,
// or, if another writer appended to the stream meanwhile, Save fails with
// ErrWrongExpectedVersion (then load again and re-run the command, as after
// any conflict). A Save of a with more events recorded after the first
// attempt fails with eventstore.ErrEventIDConflict if that attempt was
// written. (Update, which loads again and re-runs the command, would apply
// it twice after a written attempt: load and check first.) Events whose
// IDs the aggregate package chose are idempotent for types with personal
// data too (eventstore.PersonalData seals them alike on each attempt).
func (r *Repository[A]) Save(ctx context.Context, a A) error {
	return r.save(ctx, nil, a)
}

// SaveTx is Save appending inside tx (eventstore.Store.AppendTx): the events
// commit with tx or not at all. The append takes the log's ordering lock,
// held until tx ends, so make it the last statement of tx and commit
// promptly. No snapshot is written (SaveTx cannot know when tx commits);
// the next Save that reaches a snapshot boundary writes one. On error a is
// unchanged, and tx has failed (roll it back; retry the whole transaction
// on eventstore.ErrWrongExpectedVersion).
func (r *Repository[A]) SaveTx(ctx context.Context, tx pgx.Tx, a A) error {
	if tx == nil {
		return errors.Newf("aggregate %s: SaveTx with a nil transaction", r.typ)
	}
	return r.save(ctx, tx, a)
}

func (r *Repository[A]) save(ctx context.Context, tx pgx.Tx, a A) error {
	if isNil(a) {
		return errors.Newf("aggregate %s: Save(nil)", r.typ)
	}
	b := a.root()
	stream, err := r.stream(b.id)
	if err != nil {
		return err
	}
	if len(b.uncommitted) == 0 {
		return nil
	}
	var md eventstore.Metadata
	if r.cfg.Metadata != nil {
		md = r.cfg.Metadata(ctx)
	}
	md = withCause(ctx, md)
	// The events keep the IDs a first attempt gave them until a Save
	// succeeds: see Save. A first attempt's IDs are fresh (UUIDv7 made
	// now): the store need not look them up, as it does for a Save made
	// again, whose IDs may be stored.
	if len(b.ids) == 0 {
		ctx = freshids.With(ctx)
	}
	for len(b.ids) < len(b.uncommitted) {
		id, err := uuid.NewV7()
		if err != nil {
			return errors.Wrapf(err, "aggregate %s %q: event ID", r.typ, b.id)
		}
		b.ids = append(b.ids, id)
	}
	events := make([]eventstore.EventData, len(b.uncommitted))
	for i, e := range b.uncommitted {
		events[i] = eventstore.EventData{ID: b.ids[i], Data: e, Metadata: md}
	}
	var res eventstore.AppendResult
	if tx != nil {
		res, err = r.store.AppendTx(ctx, tx, stream, eventstore.Exact(b.version), events...)
	} else {
		res, err = r.store.Append(ctx, stream, eventstore.Exact(b.version), events...)
	}
	if err != nil {
		if errors.Is(err, eventstore.ErrOutcomeUnknown) {
			return errors.Wrapf(err, "aggregate %s %q: save %d event(s) at version %d (it may have been written: "+
				"Save the same aggregate again, unchanged, to find out)", r.typ, b.id, len(events), b.version)
		}
		return errors.Wrapf(err, "aggregate %s %q: save %d event(s) at version %d", r.typ, b.id, len(events), b.version)
	}
	before := b.version
	b.version, b.position = res.StreamVersion, res.Position()
	b.uncommitted, b.ids = nil, nil
	if s := r.cfg.Snapshots; tx == nil && s != nil && b.version/int64(s.Every) > before/int64(s.Every) {
		r.saveSnapshot(ctx, a, stream)
	}
	return nil
}

// Create runs command on a new aggregate with the given ID and saves it,
// creating its stream. It fails with ErrAlreadyExists (which also matches
// eventstore.ErrWrongExpectedVersion) when the stream has events already.
// A command that records nothing creates nothing. The command's own error
// is returned as is; a nil command is an error.
func (r *Repository[A]) Create(ctx context.Context, id string, command func(A) error) (A, error) {
	var zero A
	if command == nil {
		return zero, errors.Newf("aggregate %s %q: Create with a nil command", r.typ, id)
	}
	a, err := r.New(id)
	if err != nil {
		return zero, err
	}
	if err := command(a); err != nil {
		return zero, err
	}
	if err := r.Save(ctx, a); err != nil {
		if errors.Is(err, eventstore.ErrWrongExpectedVersion) {
			err = mark(err, ErrAlreadyExists)
		}
		return zero, err
	}
	return a, nil
}

// Update loads the aggregate, runs command on it and saves it. When the
// save loses a race against another writer (eventstore.ErrWrongExpectedVersion)
// it waits a short jittered backoff, loads again and re-runs command, up to
// Config.UpdateRetries times; command must therefore have no side effects
// other than recording events. When the budget is spent the error matches
// ErrConflict (and eventstore.ErrWrongExpectedVersion).
//
// The command's own error is returned as is, and nothing is saved (a nil
// command is an error). Update of a missing aggregate fails with
// ErrNotFound (use Create, or CreateOrUpdate).
func (r *Repository[A]) Update(ctx context.Context, id string, command func(A) error) (A, error) {
	return r.update(ctx, id, command, "Update", r.Load)
}

// CreateOrUpdate is Update for an aggregate that any command may start (a
// library book whose history begins with its first loan): command runs on
// the aggregate as loaded, or on a new one (New) when its stream has no
// events, and the save expects what it ran on. A concurrent first command
// that wins the race to create the stream is a conflict like any other:
// the aggregate is loaded again, with the winner's events, and command runs
// again on it, so the rules decide (retried as Update retries, and with its
// errors; a deleted stream fails with eventstore.ErrStreamDeleted, as
// Load does).
func (r *Repository[A]) CreateOrUpdate(ctx context.Context, id string, command func(A) error) (A, error) {
	return r.update(ctx, id, command, "CreateOrUpdate", func(ctx context.Context, id string) (A, error) {
		a, err := r.Load(ctx, id)
		return r.orNew(id, a, err)
	})
}

// orNew returns a new aggregate with the given ID when err, a load's, is
// ErrNotFound, and a, err otherwise.
func (r *Repository[A]) orNew(id string, a A, err error) (A, error) {
	if errors.Is(err, ErrNotFound) {
		return r.New(id)
	}
	return a, err
}

// update is Update and CreateOrUpdate (op names it in errors), with load.
func (r *Repository[A]) update(ctx context.Context, id string, command func(A) error, op string, load func(context.Context, string) (A, error)) (A, error) {
	var zero A
	if command == nil {
		return zero, errors.Newf("aggregate %s %q: %s with a nil command", r.typ, id, op)
	}
	verb := "update"
	if op != "Update" {
		verb = "create or update"
	}
	attempts := r.cfg.UpdateRetries + 1
	var last error
	for attempt := 1; attempt <= attempts; attempt++ {
		if attempt > 1 {
			t := time.NewTimer(r.backoff(attempt - 1))
			select {
			case <-ctx.Done():
				t.Stop()
				return zero, errors.Wrapf(errors.CombineErrors(ctx.Err(), last), "aggregate %s %q: %s", r.typ, id, verb)
			case <-t.C:
			}
		}
		a, err := load(ctx, id)
		if err != nil {
			return zero, err
		}
		if err := command(a); err != nil {
			return zero, err
		}
		err = r.Save(ctx, a)
		if err == nil {
			return a, nil
		}
		if !errors.Is(err, eventstore.ErrWrongExpectedVersion) {
			return zero, err
		}
		last = err
	}
	if attempts == 1 {
		return zero, mark(errors.Wrapf(last, "aggregate %s %q: %s gave up: the aggregate changed concurrently, and retries are off (UpdateRetries -1)", r.typ, id, verb), ErrConflict)
	}
	return zero, mark(errors.Wrapf(last, "aggregate %s %q: %s gave up after %d attempts: the aggregate kept changing concurrently", r.typ, id, verb, attempts), ErrConflict)
}

// CreateTx is Create inside tx (see SaveTx): a stream that exists fails
// with ErrAlreadyExists, and tx has failed.
func (r *Repository[A]) CreateTx(ctx context.Context, tx pgx.Tx, id string, command func(A) error) (A, error) {
	var zero A
	if command == nil {
		return zero, errors.Newf("aggregate %s %q: CreateTx with a nil command", r.typ, id)
	}
	a, err := r.New(id)
	if err != nil {
		return zero, err
	}
	if err := command(a); err != nil {
		return zero, err
	}
	if err := r.SaveTx(ctx, tx, a); err != nil {
		if errors.Is(err, eventstore.ErrWrongExpectedVersion) {
			err = mark(err, ErrAlreadyExists)
		}
		return zero, err
	}
	return a, nil
}

// UpdateTx loads the aggregate in tx (LoadTx), runs command on it and saves
// it in tx (SaveTx): the command's business rules hold for what tx commits.
// It does not retry: a save that loses a race fails tx with
// eventstore.ErrWrongExpectedVersion, and the caller retries the whole
// transaction (the saga and projection runners do, by their RetryPolicy).
// The command's own error is returned as is, with nothing saved; tx is
// still usable then.
func (r *Repository[A]) UpdateTx(ctx context.Context, tx pgx.Tx, id string, command func(A) error) (A, error) {
	var zero A
	if command == nil {
		return zero, errors.Newf("aggregate %s %q: UpdateTx with a nil command", r.typ, id)
	}
	a, err := r.LoadTx(ctx, tx, id)
	if err != nil {
		return zero, err
	}
	if err := command(a); err != nil {
		return zero, err
	}
	if err := r.SaveTx(ctx, tx, a); err != nil {
		return zero, err
	}
	return a, nil
}

// CreateOrUpdateTx is CreateOrUpdate inside tx, without retries, as
// UpdateTx: command runs on the aggregate as loaded in tx, or on a new one
// when its stream has no events; a save that loses a race fails tx with
// eventstore.ErrWrongExpectedVersion (also when a concurrent first command
// created the stream), and the caller retries the whole transaction.
func (r *Repository[A]) CreateOrUpdateTx(ctx context.Context, tx pgx.Tx, id string, command func(A) error) (A, error) {
	var zero A
	if command == nil {
		return zero, errors.Newf("aggregate %s %q: CreateOrUpdateTx with a nil command", r.typ, id)
	}
	a, err := r.LoadTx(ctx, tx, id)
	if a, err = r.orNew(id, a, err); err != nil {
		return zero, err
	}
	if err := command(a); err != nil {
		return zero, err
	}
	if err := r.SaveTx(ctx, tx, a); err != nil {
		return zero, err
	}
	return a, nil
}

type causeKey struct{}

// WithCause returns a context whose Saves (Save, SaveTx and the functions
// built on them) give every event the causation and correlation IDs of
// cause where the event's metadata (from Config.Metadata) has none. Package
// saga uses it so that the events an instance's command records name the
// event that caused them.
func WithCause(ctx context.Context, cause eventstore.Metadata) context.Context {
	return context.WithValue(ctx, causeKey{}, cause)
}

func withCause(ctx context.Context, md eventstore.Metadata) eventstore.Metadata {
	c, ok := ctx.Value(causeKey{}).(eventstore.Metadata)
	if !ok {
		return md
	}
	if md.CausationID == "" {
		md.CausationID = c.CausationID
	}
	if md.CorrelationID == "" {
		md.CorrelationID = c.CorrelationID
	}
	return md
}

// backoff is the jittered pause before retry n (1-based).
func (r *Repository[A]) backoff(n int) time.Duration {
	d := r.cfg.UpdateBackoff
	limit := 100 * r.cfg.UpdateBackoff
	for i := 1; i < n && d < limit; i++ {
		d *= 2
	}
	d = min(d, limit)
	return time.Duration(float64(d) * (0.5 + rand.Float64()))
}
