package saga

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/cockroachdb/errors"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/failure"
	"github.com/annals-dev/annals/internal/recovered"
	"github.com/annals-dev/annals/internal/schemaname"
	"github.com/annals-dev/annals/internal/sqltmpl"
	"github.com/annals-dev/annals/internal/telemetry"
	"github.com/annals-dev/annals/projection"
	"github.com/annals-dev/annals/scheduler"
)

//go:embed queries.sql
var queriesSQL string

// pruneBatch bounds the rows one prune deletes, so that a prune never makes
// a batch transaction long.
const pruneBatch = 1000

// runtime is the untyped part of a registered saga.
type runtime struct {
	name      string
	store     *eventstore.Store
	sched     *scheduler.Scheduler
	clock     projection.Clock
	retention time.Duration
	pruneInt  time.Duration
	logger    *slog.Logger
	q         map[string]string

	mu        sync.Mutex
	lastPrune time.Time
	// appendedBy is the event whose Handle last appended an effect: the
	// runner commits right after it (see adapter.CommitAfter).
	appendedBy uuid.UUID
}

// appended notes that the handling of event took the log's ordering lock.
func (rt *runtime) appended(event uuid.UUID) {
	rt.mu.Lock()
	rt.appendedBy = event
	rt.mu.Unlock()
}

func newRuntime(name string, cfg *Config) (*runtime, error) {
	q, err := queries(cfg.Store.Schema())
	if err != nil {
		return nil, err
	}
	rt := &runtime{name: name, store: cfg.Store, sched: cfg.Scheduler, clock: cfg.Clock,
		retention: cfg.Retention, pruneInt: cfg.PruneInterval, logger: cfg.Logger, q: q}
	if rt.clock == nil {
		rt.clock = wallClock{}
	}
	if rt.pruneInt == 0 {
		rt.pruneInt = DefaultPruneInterval
	}
	if rt.logger == nil {
		rt.logger = telemetry.DefaultLogger()
	}
	return rt, nil
}

func queries(schema string) (map[string]string, error) {
	schema, err := schemaname.Resolve(schema)
	if err != nil {
		return nil, err
	}
	return sqltmpl.Named("queries.sql", queriesSQL, sqltmpl.NewData(schema))
}

func (rt *runtime) owner(id string) string { return Owner(rt.name, id) }

// Owner returns the scheduler owner tag of the timers of saga name's
// instance id: "saga:<len(name)>:<name>:<id>", e.g. "saga:5:order:o-17".
// The name's length makes the tag unambiguous although names and IDs may
// contain colons: saga "order" instance "fulfil:1" and saga "order:fulfil"
// instance "1" get different tags, so completing one never cancels the
// other's timers.
//
// A tag that cannot be a timer's owner (scheduler.CheckOwner: longer than
// scheduler.MaxOwnerBytes, or with a control character such as a tab or a
// newline, which an instance ID may hold) is replaced by
// "saga-sha256:<hex>", the SHA-256 of that tag in 64 hex digits: any ID
// can schedule timers, and the hashed tags of two instances differ as
// their plain ones do (no plain tag starts with "saga-sha256:").
func Owner(name, id string) string {
	tag := plainOwner(name, id)
	if scheduler.CheckOwner(tag) == nil {
		return tag
	}
	sum := sha256.Sum256([]byte(tag))
	return "saga-sha256:" + hex.EncodeToString(sum[:])
}

// plainOwner is the owner tag of saga name's instance id before Owner
// hashed the tags that cannot be an owner: timers stored by an earlier
// annals (which did not check owners) may have it.
func plainOwner(name, id string) string { return fmt.Sprintf("saga:%d:%s:%s", len(name), name, id) }

// cancelTimers cancels the pending timers of instance id: those owned by
// Owner, and, where that is a hash, those an earlier annals stored under
// the plain tag (one that PostgreSQL could store: valid UTF-8, no NUL).
func (rt *runtime) cancelTimers(ctx context.Context, tx pgx.Tx, id string) error {
	owners := []string{rt.owner(id)}
	if plain := plainOwner(rt.name, id); plain != owners[0] && utf8.ValidString(plain) && !strings.ContainsRune(plain, 0) {
		owners = append(owners, plain)
	}
	for _, o := range owners {
		if _, err := rt.sched.CancelOwned(ctx, tx, o); err != nil {
			return errors.Wrapf(err, "saga %q instance %q: cancel its timers", rt.name, id)
		}
	}
	return nil
}

// prune deletes completed instances older than the retention, at most once
// per PruneInterval, in the batch transaction.
func (rt *runtime) prune(ctx context.Context, tx pgx.Tx) error {
	if rt.retention <= 0 {
		return nil
	}
	now := rt.clock.Now()
	rt.mu.Lock()
	due := rt.lastPrune.IsZero() || now.Sub(rt.lastPrune) >= rt.pruneInt
	if due {
		rt.lastPrune = now
	}
	rt.mu.Unlock()
	if !due {
		return nil
	}
	tag, err := tx.Exec(ctx, rt.q["Prune"], rt.name, now.Add(-rt.retention), pruneBatch)
	if err != nil {
		return errors.Wrapf(err, "saga %q: prune completed instances", rt.name)
	}
	if n := tag.RowsAffected(); n > 0 {
		rt.logger.InfoContext(ctx, "annals: pruned completed saga instances", slog.String("saga", rt.name),
			slog.Int64("deleted", n), slog.Duration("retention", rt.retention))
	}
	return nil
}

// adapter runs a Saga as a projection.Projection.
type adapter[S any] struct {
	saga Saga[S]
	rt   *runtime
}

// Name returns the saga's name: the subscriber's.
func (a *adapter[S]) Name() string { return a.saga.Name() }

// SubscriberKind makes the runner's errors about the registration, such as
// a name registered twice, speak of a saga, not a projection.
func (a *adapter[S]) SubscriberKind() string { return "saga" }

// CommitAfter makes the runner commit the batch's transaction right after
// an event whose handling appended an effect (projection.CommitCutter): an
// append takes the log's ordering lock until its transaction commits, and
// the rest of the batch must not run while every writer waits for it.
func (a *adapter[S]) CommitAfter(e eventstore.Event) bool {
	a.rt.mu.Lock()
	defer a.rt.mu.Unlock()
	return a.rt.appendedBy == e.ID
}

// Handle runs one event in the batch transaction: correlate, load, Handle,
// save with a version check. The effects ran in tx during Handle.
func (a *adapter[S]) Handle(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	rt := a.rt
	var id string
	var ok bool
	var cerr error // a typed saga's event that does not decode
	if err := safely(func() error {
		if c, typed := a.saga.(correlator); typed {
			id, ok, cerr = c.correlate(e)
		} else {
			id, ok = a.saga.Correlate(e)
		}
		return nil
	}); err != nil {
		return errors.Wrapf(err, "saga %q: correlate event %s (%s)", rt.name, e.ID, e.Type)
	}
	if cerr != nil {
		return failure.Permanent(errors.Wrapf(cerr, "saga %q: correlate event %s (%s)", rt.name, e.ID, e.Type))
	}
	if !ok {
		return nil
	}
	if id == "" {
		return failure.Permanent(errors.Wrapf(eventstore.ErrInvalidEvent,
			"saga %q: Correlate returned an empty instance ID for event %s (%s, stream %s v%d)",
			rt.name, e.ID, e.Type, e.StreamID, e.StreamVersion))
	}
	if err := rt.prune(ctx, tx); err != nil {
		return err
	}
	inst := &Instance[S]{id: id, event: e, tx: tx, rt: rt}
	var raw []byte
	var completed bool
	err := tx.QueryRow(ctx, rt.q["Load"], rt.name, id).Scan(&raw, &inst.version, &completed)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		inst.isNew = true
	case err != nil:
		return errors.Wrapf(err, "saga %q instance %q: load state", rt.name, id)
	case completed:
		return nil // a completed instance ignores later events
	default:
		if err := json.Unmarshal(raw, &inst.State); err != nil {
			return failure.Permanent(errors.Wrapf(err, "saga %q instance %q: decode state %.200s into %T", rt.name, id, raw, inst.State))
		}
	}
	err = safely(func() error { return a.saga.Handle(ctx, inst, e) })
	inst.done = true
	if err != nil {
		return errors.Wrapf(err, "saga %q instance %q", rt.name, id)
	}
	b, err := json.Marshal(inst.State)
	if err != nil {
		return failure.Permanent(errors.Wrapf(err, "saga %q instance %q: encode state %T", rt.name, id, inst.State))
	}
	// A json.RawMessage, not a []byte: pgx sends a []byte as bytea text in
	// QueryExecModeExec and QueryExecModeSimpleProtocol, which the state
	// column refuses.
	state := json.RawMessage(b)
	now := rt.clock.Now()
	var tag interface{ RowsAffected() int64 }
	if inst.isNew {
		tag, err = tx.Exec(ctx, rt.q["Insert"], rt.name, id, state, inst.completed, now)
	} else {
		tag, err = tx.Exec(ctx, rt.q["Update"], rt.name, id, inst.version, state, inst.completed, now)
	}
	if err != nil {
		return errors.Wrapf(err, "saga %q instance %q: save state", rt.name, id)
	}
	if tag.RowsAffected() != 1 {
		return errors.Wrapf(ErrConflict, "saga %q instance %q: expected version %d", rt.name, id, inst.version)
	}
	if inst.completed && rt.sched != nil {
		if err := rt.cancelTimers(ctx, tx, id); err != nil {
			return err
		}
	}
	return nil
}

// safely calls fn, turning a panic into an error with its stack, as the
// runner would: recovered here, the error is wrapped with the saga's name
// (and instance) like any error of the saga's code.
func safely(fn func() error) error { return recovered.Call("handler", fn) }

// correlator is implemented by the typed sagas of this package, whose
// correlation decodes the event and can fail.
type correlator interface {
	correlate(e eventstore.Event) (string, bool, error)
}

type wallClock struct{}

func (wallClock) Now() time.Time                         { return time.Now() }
func (wallClock) After(d time.Duration) <-chan time.Time { return time.After(d) }
