package relay

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/annals-dev/annals/advisorylock"
	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/checkpoint"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/schemaname"
	"github.com/annals-dev/annals/internal/telemetry"
	"github.com/annals-dev/annals/migrations"
	"github.com/annals-dev/annals/projection"
	"github.com/annals-dev/annals/walsource"
)

// Config configures a Relay. A nil *Config means defaults.
type Config struct {
	// Name is the relay's subscriber name: its checkpoint, its lock (one
	// relay of a name leads cluster-wide) and its replication slot. Valid
	// UTF-8 without control characters but tab (CheckName). Defaults to
	// "relay".
	Name string
	// Schema is the annals schema. Defaults to "annals".
	Schema string
	// Types are event-type glob patterns, as for subscribers
	// (catchup.ParseFilter). Defaults to all types.
	Types []string
	// Prefix is the subject prefix, one or more tokens of letters, digits,
	// "-" and "_" separated by dots. Defaults to "annals".
	Prefix string
	// Subject is the subject template: literal tokens and the placeholders
	// {prefix}, {type} and {stream}, each value escaped into one token
	// (EscapeToken). Defaults to DefaultSubject, "{prefix}.{type}.{stream}".
	Subject string
	// Stream is the JetStream stream the relay creates (or checks) and
	// publishes to; it must hold only this relay's messages. Defaults to
	// "ANNALS".
	Stream string
	// Storage is the stream's storage. Defaults to file storage.
	Storage jetstream.StorageType
	// Replicas is the stream's replica count. Defaults to 1.
	Replicas int
	// MaxAge is how long the stream keeps messages; not less than
	// Duplicates (New refuses it). Defaults to 0: forever.
	// Keep it well above the longest outage of a relay process: a relay
	// skips what the stream's newest message shows published, and a stream
	// emptied by age shows nothing (see the package doc, "Why exactly once").
	MaxAge time.Duration
	// Duplicates is the stream's de-duplication window. It must exceed the
	// longest takeover (from a leader's last publish to its successor's
	// first): within it a re-publish after a crash is dropped by JetStream
	// even without the relay's own check (see the package doc). Defaults to
	// 10 minutes.
	Duplicates time.Duration
	// BatchSize is the number of events read and published (pipelined) per
	// batch; the checkpoint commits after each batch. Defaults to 500.
	BatchSize int
	// AckTimeout bounds the wait for a batch's acknowledgements. Defaults to
	// 10s.
	AckTimeout time.Duration
	// CheckpointInterval is how often the checkpoint commits while the relay
	// is busy (always through acknowledged events only); it also commits
	// whenever the relay is idle and when it stops. A crash costs no
	// duplicates however far behind the checkpoint is (see the package doc),
	// only re-reading. Defaults to 1s.
	CheckpointInterval time.Duration
	// WAL, when set, wakes the relay from its replication slot (package
	// walsource) instead of NOTIFY; the Wake's role needs the REPLICATION
	// attribute (or superuser, or a managed service's replication role).
	// When a leadership's WAL source has not started streaming within 10
	// seconds and the relay's own role is refused a replication
	// connection, Run fails with ErrNoReplication. CatchUp does not use
	// it. Defaults to nil: NOTIFY.
	WAL *walsource.Wake
	// AdoptStream takes a stream whose newest message (or whose metadata)
	// shows another origin (HeaderOrigin) as this relay's, provided the
	// relay's name matches and that message's position is within this log's
	// head; the stream's metadata is updated to this origin. Set it once,
	// when this database took over the log the stream holds (restored from
	// a dump, upgraded by pg_upgrade, renamed): otherwise the relay refuses
	// such a stream, for it may be another database's, whose newest
	// position this relay would take as published and skip its own events
	// up to. Defaults to false.
	AdoptStream bool
	// Owner names this process in the checkpoint and the instance registry.
	// Defaults to "host:pid:" and a random suffix.
	Owner string
	// PollInterval, LockRetryInterval and RetryBackoff go to the catch-up
	// engine (catchup.Config). Default to 1s, 20ms and 500ms.
	PollInterval      time.Duration
	LockRetryInterval time.Duration
	RetryBackoff      time.Duration
	// Lock configures the lock's connection. Defaults to advisorylock's.
	// Its FreezeTimeout also bounds how long the relay's checkpoint
	// commits may idle between their statements (a frozen relay's commit
	// is ended by the server after it, as its lock session is).
	Lock *advisorylock.Config
	// Logger receives leadership changes and publish failures. Defaults to
	// warnings and errors on slog.Default() (information and debug records
	// dropped).
	Logger *slog.Logger
	// OnCommitted is called after each checkpoint commit with the position
	// committed (for tests and metrics). Defaults to nothing.
	OnCommitted func(position int64)
}

// Relay publishes the event log to JetStream, exactly once and in order.
type Relay struct {
	pool   *pgxpool.Pool
	js     jetstream.JetStream
	store  *eventstore.Store // the log's head (lastStored)
	cfg    Config
	filter catchup.Filter
	subj   subjects

	// origin is where the log is (HeaderOrigin), read once (loadOrigin).
	originMu sync.Mutex
	origin   string

	// failures counts the leaderships in a row that ended in a failure
	// (a publish, or the stream's state at the start) without the
	// checkpoint moving; lastFailure is the newest. CatchUp gives up on
	// them (catchUpAttempts).
	failures     atomic.Int64
	firstFailure atomic.Int64 // when the streak began (Unix nanoseconds)
	lastFailure  atomic.Pointer[error]

	// warnedStream is the creation time (Unix nanoseconds) of the last
	// stream warnBehind told about: a leadership that finds it empty, or
	// made again, does not tell again.
	warnedStream atomic.Int64
	// toldRefused is the position of the last event a refill stopped at,
	// refused though the stream had stored it (publisher.stopRefill): the
	// leaderships that stop there again do not log it again at ERROR.
	toldRefused atomic.Int64
	// toldLost is the last empty stream errorLostEmpty told about, and its
	// loss: its creation time and its last sequence.
	toldLost atomic.Pointer[[2]int64]
	// provedRewound is the last stream whose rewind under it this process
	// found and recorded (rewound): a leadership that finds it so again
	// does not search again.
	provedRewound atomic.Pointer[provedRewound]

	// walStartTimeout, when positive, replaces walStartTimeout; onWALCheck
	// receives wakeFor's verdict on each leadership (tests).
	walStartTimeout time.Duration
	onWALCheck      func(error)
	// onStarted, when set, is called at the end of each leadership's
	// successful start, the stream read (tests).
	onStarted func()
}

// unreachable adds to err, when the relay's NATS connection is not
// connected (a server down or restarting, the connection reconnecting), a
// word saying so: the errors of JetStream calls made meanwhile ("context
// deadline exceeded", "timeout waiting for ack") do not tell an outage
// from a slow server.
func (r *Relay) unreachable(err error) error {
	if st := r.js.Conn().Status(); st != nats.CONNECTED {
		return errors.Wrapf(err, "the NATS connection is %s (no NATS server answers; the relay tries again at each leadership)", st)
	}
	return err
}

// failed records a leadership's failure (see Relay.failures).
func (r *Relay) failed(err error) {
	r.lastFailure.Store(&err)
	if r.failures.Add(1) == 1 {
		r.firstFailure.Store(time.Now().UnixNano())
	}
}

// catchUpAttempts is how many leaderships in a row may fail without the
// checkpoint moving, over at least catchUpPatience, before CatchUp gives
// up: a failure that retrying cannot mend (an event over max_payload)
// would otherwise keep a batch job (annals relay nats --once) running until
// it is killed, while a short outage (JetStream restarting) is waited out.
const (
	catchUpAttempts = 5
	catchUpPatience = 10 * time.Second
)

// New returns a Relay reading through pool and publishing on nc.
func New(pool *pgxpool.Pool, nc *nats.Conn, cfg *Config) (*Relay, error) {
	if pool == nil || nc == nil {
		return nil, errors.New("relay: pool and NATS connection are required")
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	var err error
	if c.Schema, err = schemaname.Resolve(c.Schema); err != nil {
		return nil, err
	}
	def := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	def(&c.Name, "relay")
	if err := CheckName(c.Name); err != nil {
		return nil, err
	}
	def(&c.Prefix, "annals")
	def(&c.Stream, "ANNALS")
	if c.Duplicates <= 0 {
		c.Duplicates = 10 * time.Minute
	}
	if c.MaxAge > 0 && c.Duplicates > c.MaxAge {
		// JetStream refuses such a stream ("duplicates window can not be
		// larger then max age"), later and less clearly.
		return nil, errors.Newf("relay: the duplicate window (Duplicates %v) must not exceed MaxAge (%v)", c.Duplicates, c.MaxAge)
	}
	if c.BatchSize <= 0 {
		c.BatchSize = 500
	}
	if c.AckTimeout <= 0 {
		c.AckTimeout = 10 * time.Second
	}
	if c.CheckpointInterval <= 0 {
		c.CheckpointInterval = time.Second
	}
	if c.Replicas <= 0 {
		c.Replicas = 1
	}
	if c.Logger == nil {
		c.Logger = telemetry.DefaultLogger()
	}
	r := &Relay{pool: pool, cfg: c}
	if r.store, err = eventstore.New(pool, &eventstore.Config{Schema: c.Schema}); err != nil {
		return nil, err
	}
	if r.filter, err = catchup.ParseFilter(c.Types); err != nil {
		return nil, errors.Wrap(err, "relay")
	}
	if r.subj, err = parseSubject(c.Prefix, c.Subject); err != nil {
		return nil, err
	}
	if r.js, err = jetstream.New(nc, jetstream.WithPublishAsyncTimeout(c.AckTimeout),
		jetstream.WithPublishAsyncMaxPending(max(4*c.BatchSize, 1024))); err != nil {
		return nil, errors.Wrap(err, "relay: JetStream")
	}
	return r, nil
}

// SubjectFilter returns the stream's subject filter: the template with each
// placeholder as "*" (default "annals.*.*").
func (r *Relay) SubjectFilter() string { return r.subj.filter }

// StreamConfig returns the JetStream stream configuration EnsureStream
// creates.
func (r *Relay) StreamConfig() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        r.cfg.Stream,
		Description: "annals event log relayed by " + r.cfg.Name,
		Subjects:    []string{r.subj.filter},
		Retention:   jetstream.LimitsPolicy,
		Storage:     r.cfg.Storage,
		Replicas:    r.cfg.Replicas,
		MaxAge:      r.cfg.MaxAge,
		Duplicates:  r.cfg.Duplicates,
		Discard:     jetstream.DiscardOld,
		DenyDelete:  true,
		DenyPurge:   true,
	}
}

// ErrStreamMismatch is matched by EnsureStream when the stream exists with
// a configuration the relay cannot publish exactly once into, or holds
// another publisher's messages: another relay's (by name), or those of a
// relay of another log (another cluster, database or schema: see
// HeaderOrigin), which this relay would take as its own and skip its own
// events up to.
var ErrStreamMismatch = errors.New("relay: the JetStream stream does not fit the relay")

// EnsureStream creates the stream unless it exists (with Metadata naming
// the relay and its origin, MetadataRelay and MetadataOrigin), and checks an
// existing one: it must take the relay's subjects (one of its subjects must
// cover SubjectFilter by NATS wildcard rules: "annals.*.*", "annals.*.>",
// "annals.>"), keep messages by limits (not interest or work queue, which delete
// them), de-duplicate over at least Duplicates, and be this relay's: its
// metadata, when it has the relay's entries, must name this relay and
// origin, and its newest message must have been published by this relay
// (Annals-Relay), from this log (Annals-Origin, unless absent: a relay
// older than the header), at a position not above this log's head, and be
// this log's event at that position (Annals-Event-Id). When that message
// shows this log rewound under the stream (this relay's, of this origin,
// past the head or another event than the log's at its position; or of
// another origin, when earlier messages are this log's events), the
// refusal comes after the relay found and recorded where the two last
// agree (Rewound); each stream it creates after carries the rewinds
// recorded in its metadata (Rewinds.Stamp).
//
// It first checks the schema (checkSchema): on one not migrated it fails
// with migrations.ErrNotMigrated before it looks at, or makes, a stream. A
// stream JetStream refuses because its subjects overlap another stream's
// (error code 10065: a second relay with the default prefix) fails with
// the advice to give the relay a prefix or subject template of its own.
func (r *Relay) EnsureStream(ctx context.Context) (jetstream.Stream, error) {
	if err := r.checkSchema(ctx); err != nil {
		return nil, err
	}
	origin, err := r.loadOrigin(ctx)
	if err != nil {
		return nil, err
	}
	want := r.StreamConfig()
	want.Metadata = map[string]string{MetadataRelay: r.cfg.Name, MetadataOrigin: origin}
	s, err := r.js.Stream(ctx, want.Name)
	created := false
	var stamp map[string]string
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		// Rewinds found under earlier streams: stamped, so that
		// consumers past where one of them and the log agree stop at
		// once.
		var rs Rewinds
		if rs, err = r.loadRewinds(ctx); err != nil {
			return nil, err
		}
		stamp = rs.Stamp()
		maps.Copy(want.Metadata, stamp)
		s, err = r.js.CreateStream(ctx, want)
		created = err == nil
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			s, err = r.js.Stream(ctx, want.Name)
		}
		if subjectsOverlap(err) {
			return nil, errors.Wrapf(err, "relay: stream %s: its subjects (%s) overlap those of another stream on the server, another relay's if that one has the same prefix; "+
				"give each relay a subject prefix of its own (relay.Config.Prefix, annals relay nats --prefix) or subject template (Config.Subject, --subject)",
				want.Name, want.Subjects[0])
		}
	}
	if err != nil {
		return nil, errors.Wrapf(r.unreachable(err), "relay: stream %s", want.Name)
	}
	if created {
		if stamp != nil {
			r.cfg.Logger.WarnContext(ctx, "annals: the relay made its JetStream stream anew after it had found the log rewound under an earlier one; "+
				"stamped with where the streams found rewound and the log last agree: consumers past it stop when they move to the new stream (natsconsumer.ErrLogRewound)",
				slog.String("relay", r.cfg.Name), slog.String("stream", want.Name), slog.String("rewinds", stamp[MetadataRewinds]))
		}
		if err := r.warnIfBehind(ctx, s); err != nil {
			return nil, err
		}
	}
	got := s.CachedInfo().Config
	covered := false
	for _, sub := range got.Subjects {
		covered = covered || subjectCovers(sub, want.Subjects[0])
	}
	switch {
	case !covered:
		return nil, errors.Wrapf(ErrStreamMismatch, "%s takes %v, not %s", want.Name, got.Subjects, want.Subjects[0])
	case got.Retention != jetstream.LimitsPolicy:
		return nil, errors.Wrapf(ErrStreamMismatch, "%s has %s retention; the relay needs limits", want.Name, got.Retention)
	case got.Duplicates < want.Duplicates:
		return nil, errors.Wrapf(ErrStreamMismatch, "%s de-duplicates over %v, less than %v", want.Name, got.Duplicates, want.Duplicates)
	}
	// Another publisher's newest message: refused now, not at every
	// leadership (it would stand by and try again for ever).
	if _, err := r.lastStored(ctx, s); errors.Is(err, ErrStreamMismatch) {
		return nil, err
	}
	if name, ok := got.Metadata[MetadataRelay]; ok && name != r.cfg.Name {
		return nil, errors.Wrapf(ErrStreamMismatch, "stream %s was made by relay %q, not %q: one relay per stream", want.Name, name, r.cfg.Name)
	}
	if o, ok := got.Metadata[MetadataOrigin]; ok && !sameOrigin(o, origin) {
		if !r.cfg.AdoptStream {
			return nil, errors.Wrapf(ErrStreamMismatch, "stream %s was made for the log at %s, not this one (%s): one relay per stream "+
				"(if this database took over that log, restored or upgraded, adopt the stream: relay.Config.AdoptStream, annals relay nats --adopt-stream)",
				want.Name, o, origin)
		}
		got.Metadata[MetadataOrigin] = origin
		if s, err = r.js.UpdateStream(ctx, got); err != nil {
			return nil, errors.Wrapf(err, "relay: adopt stream %s", want.Name)
		}
		r.cfg.Logger.WarnContext(ctx, "annals: the relay adopted a stream made for another origin",
			slog.String("relay", r.cfg.Name), slog.String("stream", want.Name), slog.String("was", o), slog.String("origin", origin))
	}
	return s, nil
}

// jsErrCodeStreamSubjectOverlap is JetStream's error code for a stream
// whose subjects overlap those of another stream (JSStreamSubjectOverlapErr),
// which nats.go does not name.
const jsErrCodeStreamSubjectOverlap jetstream.ErrorCode = 10065

// subjectsOverlap reports whether err is JetStream's refusal of a stream
// whose subjects overlap another's.
func subjectsOverlap(err error) bool {
	var jsErr jetstream.JetStreamError
	return errors.As(err, &jsErr) && jsErr.APIError() != nil && jsErr.APIError().ErrorCode == jsErrCodeStreamSubjectOverlap
}

// checkSchema fails, marked migrations.ErrNotMigrated and saying to
// migrate, when the relay's schema lacks the tables (or, older than
// migration 0037, the columns) the relay uses: the schema does not exist,
// was never migrated, or is not the one migrated.
func (r *Relay) checkSchema(ctx context.Context) error {
	q, err := r.queries()
	if err != nil {
		return err
	}
	_, err = r.pool.Exec(ctx, q["Migrated"])
	switch {
	case err == nil:
		return nil
	case migrations.IsNotMigrated(err):
		return errors.Wrapf(migrations.MarkNotMigrated(err), "relay: schema %q is missing or not migrated: run '%s'", r.cfg.Schema, r.migrateHint())
	default:
		return errors.Wrapf(notMigrated(err), "relay: check schema %q", r.cfg.Schema)
	}
}

// warnIfBehind logs, for a stream EnsureStream has just created, that the
// stream lacks the events up to the relay's checkpoint when that is past 0
// (the stream was lost, deleted, or Config.Stream changed), and how to
// publish them (warnBehind).
func (r *Relay) warnIfBehind(ctx context.Context, s jetstream.Stream) error {
	cps, err := checkpoint.New(r.cfg.Schema)
	if err != nil {
		return err
	}
	cp, err := cps.Load(ctx, r.pool, r.cfg.Name, 0)
	if errors.Is(err, checkpoint.ErrNotFound) || err == nil && cp.Position == 0 {
		return nil
	}
	if err != nil {
		return errors.Wrap(err, "relay: read the checkpoint")
	}
	r.warnBehind(ctx, fmt.Sprintf("the relay created its JetStream stream %s (it was lost or deleted, or is new)", r.cfg.Stream),
		cp.Position, s.CachedInfo().Created)
	return nil
}

// warnBehind logs that the stream, which what describes, lacks the events
// up to the checkpoint cp, and how to publish them (republishAdvice). The
// stream made at created is then told about (warnedStream).
func (r *Relay) warnBehind(ctx context.Context, what string, cp int64, created time.Time) {
	r.warnedStream.Store(created.UnixNano())
	r.cfg.Logger.WarnContext(ctx, fmt.Sprintf("annals: %s, and its checkpoint is at %d: "+
		"the stream holds only the events after the checkpoint. To publish the earlier ones too: %s",
		what, cp, r.republishAdvice()),
		slog.String("relay", r.cfg.Name), slog.String("stream", r.cfg.Stream), slog.Int64("checkpoint", cp))
}

// republishAdvice says how to publish the whole log again, into the stream
// made anew: the relay publishes only what is past both its checkpoint and
// the stream's newest message, so setting the checkpoint back is not
// enough once it has published into the stream.
func (r *Relay) republishAdvice() string {
	return fmt.Sprintf("stop every relay process named %s, delete the stream (with the nats CLI: nats stream rm %s -f; or JetStream's stream delete API, "+
		"jetstream.JetStream.DeleteStream: annals has no command for it), run `%s`, and start the relay again",
		shellQuote(r.cfg.Name), shellQuote(r.cfg.Stream), r.checkpointSetHint(0))
}

// errorLostEmpty logs that the stream st, empty, lost messages it had
// acknowledged (what the relay recorded, a, says so: its last sequence is
// below a.seq), which the relay cannot publish again by itself (see
// publisher.behind), and how to; once per stream and last sequence
// (toldLost). cp is the checkpoint, from which the relay publishes on.
func (r *Relay) errorLostEmpty(ctx context.Context, st stored, a acks, cp int64) {
	key := [2]int64{st.created.UnixNano(), int64(st.seq)}
	if k := r.toldLost.Load(); k != nil && *k == key {
		return
	}
	r.toldLost.Store(&key)
	since := ", and the stream removed the messages before them since (MaxAge, a purge)"
	if st.seq == 0 {
		since = " (from before the relay's first publish into it)"
	}
	r.cfg.Logger.ErrorContext(ctx, fmt.Sprintf("annals: the relay's JetStream stream %s lost messages it had acknowledged, and holds none now: "+
		"its last sequence is %d, but it had acknowledged through sequence %d when the relay committed its checkpoint at %d. "+
		"The messages at sequences %d–%d are gone: JetStream acknowledges a message before it writes it to disk (sync_interval, 2 minutes by default), "+
		"so the server's machine crashed, or its store was restored from a backup%s. "+
		"No message is left to tell which events those were, so the relay cannot publish them again by itself: it publishes from its checkpoint, %d, on. "+
		"To publish them: %s. "+
		"To keep what JetStream acknowledges: sync_interval: always in the server's jetstream block, or a stream of 3 replicas",
		r.cfg.Stream, st.seq, a.seq, a.pos, st.seq+1, a.seq, since, cp, r.republishAdvice()),
		slog.String("relay", r.cfg.Name), slog.String("stream", r.cfg.Stream),
		slog.Uint64("first_lost_sequence", st.seq+1), slog.Int64("last_lost_sequence", a.seq),
		slog.Int64("acknowledged_checkpoint", a.pos), slog.Int64("checkpoint", cp))
}

// Run relays until ctx ends: it ensures the stream, then runs the relay's
// subscription in a projection.Runner, so it stands by until it leads (one
// leader cluster-wide), publishes from the checkpoint on, and stands by
// again if it loses the lead; the instance registers like any runner's, so
// annals status shows it leading. It returns nil when ctx ends, or an error
// if it cannot start.
func (r *Relay) Run(ctx context.Context) error {
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	runner, err := r.runner(ctx, cancel)
	if err != nil {
		if ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
			return nil // ended while it ensured the stream (Ctrl-C right after start)
		}
		return err
	}
	err = runner.Run(runCtx)
	// The WAL check's abort: ErrNoReplication, or the WAL source's
	// walsource.PermanentError.
	if cause := context.Cause(runCtx); ctx.Err() == nil && cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	return err
}

// CatchUp publishes every event up to the head as it is when called, then
// returns (for batch jobs and tests). It waits for the relay's lock. It
// fails when the relay's checkpoint has not reached that head when the run
// ends: JetStream refused the last publishes (a full stream with
// DiscardNew), which the relay logged and will try again; and it gives up,
// with the last failure, after five leaderships in a row, over ten seconds
// at least, that failed without moving the checkpoint (an event over the
// server's max_payload): retrying would not end.
func (r *Relay) CatchUp(ctx context.Context) error {
	runner, err := r.runner(ctx, func(error) {}) // no live leadership: no WAL
	if err != nil {
		return err
	}
	store, err := eventstore.New(r.pool, &eventstore.Config{Schema: r.cfg.Schema})
	if err != nil {
		return err
	}
	head, err := store.Head(ctx)
	if err != nil {
		return errors.Wrap(err, "relay: read the head")
	}
	// Give up after catchUpAttempts leaderships in a row that failed
	// without the checkpoint moving.
	r.failures.Store(0)
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-runCtx.Done():
				return
			case <-t.C:
				if n := r.failures.Load(); n >= catchUpAttempts && time.Since(time.Unix(0, r.firstFailure.Load())) >= catchUpPatience {
					last := errors.New("relay: failed")
					if e := r.lastFailure.Load(); e != nil {
						last = *e
					}
					cancel(errors.Wrapf(last, "relay %s: gave up after %d failed attempts in a row that did not move the checkpoint (a later run tries again)", r.cfg.Name, n))
					return
				}
			}
		}
	}()
	err = runner.RunUntilCaughtUp(runCtx)
	var gaveUp error
	if cause := context.Cause(runCtx); err != nil && ctx.Err() == nil && cause != nil && !errors.Is(cause, context.Canceled) {
		gaveUp = cause // judged below, with how far it got
	} else if err != nil {
		return err
	}
	cps, err := checkpoint.New(r.cfg.Schema)
	if err != nil {
		return err
	}
	cp, err := cps.Load(ctx, r.pool, r.cfg.Name, 0)
	if err != nil && !errors.Is(err, checkpoint.ErrNotFound) {
		return errors.Wrap(err, "relay")
	}
	if cp.Position < head {
		short := errors.Newf("relay %s: the checkpoint reached position %d, short of the head %d: JetStream did not acknowledge the rest (see the log); "+
			"a later run goes on from there, publishing nothing twice", r.cfg.Name, cp.Position, head)
		if gaveUp != nil {
			return errors.Wrap(gaveUp, short.Error())
		}
		if e := r.lastFailure.Load(); e != nil && r.failures.Load() > 0 {
			return errors.Wrap(*e, short.Error()) // why, as the log said
		}
		return short
	}
	return nil
}

// runner makes the relay's projection.Runner; abort ends its Run with an
// error (wakeFor).
func (r *Relay) runner(ctx context.Context, abort func(error)) (*projection.Runner, error) {
	stream, err := r.EnsureStream(ctx)
	if err != nil {
		return nil, err
	}
	cfg := &projection.Config{
		Schema: r.cfg.Schema, InstanceID: r.cfg.Owner, PollInterval: r.cfg.PollInterval,
		LockRetryInterval: r.cfg.LockRetryInterval, RetryBackoff: r.cfg.RetryBackoff,
		Lock: r.cfg.Lock, Logger: r.cfg.Logger,
	}
	if r.cfg.WAL != nil {
		cfg.Wake = r.wakeFor(abort)
	}
	runner, err := projection.NewRunner(r.pool, cfg)
	if err != nil {
		return nil, err
	}
	err = runner.RegisterProcessor(r.cfg.Name, func() catchup.Processor { return &publisher{r: r, stream: stream} },
		&projection.Options{Types: r.cfg.Types, BatchSize: r.cfg.BatchSize, Kind: "relay"})
	return runner, err
}

// stored is what a stream holds, as lastStored reads it.
type stored struct {
	// pos and id are the position and message ID of the newest message (0
	// and "" when the stream is empty).
	pos int64
	id  string
	// seq is the stream's last sequence, also when the messages up to it
	// are gone (0: the stream never held one).
	seq uint64
	// created is when the stream was made.
	created time.Time
	// maxMsgSize is the stream's max_msg_size (headers and data; 0 or
	// below: none), and fileStore whether it keeps its messages in files:
	// the limits a refill checks before it publishes (publisher.refusal).
	maxMsgSize int32
	fileStore  bool
}

// lastStored returns what the stream holds: the position and message ID of
// its newest message, and its last sequence. It fails (ErrStreamMismatch) when
// that message is not this relay's: another publisher on the stream would
// break the order, and a relay of another log would have this relay skip
// its own events up to that position. A message of another log is told by
// its origin (HeaderOrigin, unless adopted), by a position this log has not
// reached, and by its event ID (HeaderEventID) differing from that of this
// log's event at its position (one index probe). Where retention has
// scavenged that event, a message without an origin (published by an older
// relay) or of an adopted origin is taken as this log's, with a warning.
func (r *Relay) lastStored(ctx context.Context, stream jetstream.Stream) (stored, error) {
	origin, err := r.loadOrigin(ctx)
	if err != nil {
		return stored{}, err
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return stored{}, errors.Wrap(err, "relay: stream info")
	}
	st := stored{seq: info.State.LastSeq, created: info.Created,
		maxMsgSize: info.Config.MaxMsgSize, fileStore: info.Config.Storage == jetstream.FileStorage}
	if info.State.Msgs == 0 || info.State.LastSeq == 0 {
		return st, nil
	}
	m, err := stream.GetMsg(ctx, info.State.LastSeq)
	if err != nil {
		return stored{}, errors.Wrapf(err, "relay: read message %d", info.State.LastSeq)
	}
	name, err := getExact(m.Header, HeaderRelay, HeaderRelayJSON)
	if err != nil {
		return stored{}, errors.Wrapf(ErrStreamMismatch, "the newest message of stream %s: %v", r.cfg.Stream, err)
	}
	if name != r.cfg.Name {
		return stored{}, errors.Wrapf(ErrStreamMismatch, "the newest message of stream %s was published by %q, not relay %q: one relay per stream",
			r.cfg.Stream, name, r.cfg.Name)
	}
	pos, err := strconv.ParseInt(m.Header.Get(HeaderPosition), 10, 64)
	if err != nil {
		return stored{}, errors.Wrapf(err, "relay: message %d has no position", info.State.LastSeq)
	}
	from := m.Header.Get(HeaderOrigin)
	if from != "" && !sameOrigin(from, origin) && !r.cfg.AdoptStream {
		// Adopting is the way out unless the stream shows this log
		// rewound (said): then it would not do, and said says why.
		said := r.rewoundElsewhere(ctx, stream, st, m)
		adopt := ""
		if said == "" {
			adopt = " (if this database took over that log, restored or upgraded, adopt the stream: relay.Config.AdoptStream, annals relay nats --adopt-stream)"
		}
		return stored{}, errors.Wrapf(ErrStreamMismatch, "the newest message of stream %s was published from the log at %s, not this one (%s): one relay per stream%s%s",
			r.cfg.Stream, from, origin, adopt, said)
	}
	head, err := r.store.Head(ctx)
	if err != nil {
		return stored{}, errors.Wrap(err, "relay: read the head")
	}
	// A message of this log's origin past its head, or not its event at
	// its position, shows this log rewound: where they last agree is
	// found and recorded (rewound) for the stream made next.
	ours := from != "" && (sameOrigin(from, origin) || r.cfg.AdoptStream)
	if pos > head {
		said := ""
		if ours {
			said = r.rewound(ctx, stream, st, false)
		}
		return stored{}, errors.Wrapf(ErrStreamMismatch, "the newest message of stream %s is event %d, past this log's head (%d): it was published from another database or schema "+
			"(or this database lost events since); one relay per stream%s", r.cfg.Stream, pos, head, said)
	}
	msgID := m.Header.Get(HeaderEventID)
	if msgID == "" {
		msgID = m.Header.Get(jetstream.MsgIDHeader)
	}
	q, err := r.queries()
	if err != nil {
		return stored{}, err
	}
	var eventID string
	err = r.pool.QueryRow(ctx, q["EventAt"], pos).Scan(&eventID)
	switch {
	case err == nil && eventID != msgID:
		// The position alone passes as long as this log is the longer;
		// past it, the relay would skip its own events up to it.
		said := ""
		if ours {
			said = r.rewound(ctx, stream, st, false)
		}
		return stored{}, errors.Wrapf(ErrStreamMismatch, "the newest message of stream %s is event %s at position %d, but this log's event there is %s: "+
			"it was published from another log (another database or schema, or this database before it lost its newest events); one relay per stream%s",
			r.cfg.Stream, msgID, pos, eventID, said)
	case errors.Is(err, pgx.ErrNoRows):
		// Scavenged by retention: the origin alone tells.
		if !sameOrigin(from, origin) {
			r.cfg.Logger.WarnContext(ctx, "annals: the newest message of the relay's stream is not marked as this log's (published by an older relay, or adopted), "+
				"and this log no longer holds its event (retention); taken as this log's, as its position is within the head",
				slog.String("relay", r.cfg.Name), slog.String("stream", r.cfg.Stream), slog.Int64("position", pos),
				slog.String("message_origin", from), slog.String("origin", origin))
		}
	case err != nil:
		return stored{}, errors.Wrapf(err, "relay: read the event at position %d", pos)
	}
	st.pos, st.id = pos, m.Header.Get(jetstream.MsgIDHeader)
	return st, nil
}
