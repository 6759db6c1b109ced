package eventstore

import (
	"context"
	_ "embed"
	"sync"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/annals-dev/annals/internal/lockfallback"
	"github.com/annals-dev/annals/internal/schemaname"
	"github.com/annals-dev/annals/internal/sqltmpl"
	"github.com/annals-dev/annals/internal/telemetry"
)

//go:embed queries.sql
var queriesSQL string

// DefaultMaxEventBytes is the default limit on one event's data plus metadata.
const DefaultMaxEventBytes = 1 << 20

// Config configures a Store. A nil *Config means defaults.
type Config struct {
	// Schema is the PostgreSQL schema holding the annals tables (created by
	// the migrations package). Defaults to "annals".
	Schema string
	// Registry names Go event types for appends and decodes reads.
	// Defaults to a new, empty Registry.
	Registry *Registry
	// MaxEventBytes is the largest accepted size of one event's data plus
	// metadata, in bytes (the JSON as sent); larger events are rejected with
	// ErrInvalidEvent before anything is sent. At most MaxEventBytesLimit
	// (64 MiB), which the SQL function enforces. Defaults to
	// DefaultMaxEventBytes (1 MiB): far above any event that records a fact,
	// small enough that one append cannot hold a connection or the append
	// lock for long.
	MaxEventBytes int
	// PageSize is how many events ReadAll and ReadStream fetch per query.
	// Defaults to 500.
	PageSize int
	// TracerProvider traces appends (a span per append, whose W3C trace
	// context is stored in each event's metadata as "traceparent").
	// Defaults to the global provider (otel.GetTracerProvider).
	TracerProvider trace.TracerProvider
	// MeterProvider receives annals.append.duration and annals.append.events.
	// Defaults to the global provider (otel.GetMeterProvider).
	MeterProvider metric.MeterProvider
	// GroupCommit configures how concurrent Append calls are coalesced into
	// one transaction. Defaults to on, with the defaults of GroupCommit.
	GroupCommit GroupCommit
	// Clock is the time stream reads apply a stream's maximum age with
	// (see SetStreamRetention). Defaults to time.Now.
	Clock func() time.Time
	// Inline lists projections applied in the transaction of every append
	// through this Store (Append, AppendTx, Transact, the encoded appends):
	// see InlineProjection and the package documentation. An Append whose
	// events no inline projection handles keeps the group-commit path.
	// Defaults to none.
	Inline []InlineProjection
	// KEK wraps the per-subject data keys of personal data (see
	// PersonalData, NewLocalKEK). Without it, appends of event types with
	// personal data fail (ErrNoKEK) and reads leave their fields encrypted,
	// except those of forgotten subjects, which read redacted. New attaches
	// the store's key ring to Registry (replacing one without a KEK), so
	// decodes through the registry decrypt too. Defaults to none.
	KEK KeyEncrypter
	// KeyCacheSize bounds the number of subjects whose data keys are kept
	// unwrapped in memory (least recently used evicted). Defaults to
	// DefaultKeyCacheSize.
	KeyCacheSize int
	// KeyCacheTTL is how long a cached key (or a subject's absence) is
	// trusted: a subject forgotten by another process is decrypted here for
	// at most this long. Defaults to DefaultKeyCacheTTL.
	KeyCacheTTL time.Duration
}

// Store appends events to and reads events from the annals schema through a
// connection pool. It is safe for concurrent use.
type Store struct {
	pool     *pgxpool.Pool
	schema   string
	registry *Registry
	maxBytes int
	pageSize int
	q        queries
	tel      *telemetry.Append
	group    *committer // nil when group commit is disabled
	lc       lifecycleQueries
	clock    func() time.Time
	inline   *inline // nil without inline projections
	keys     *keyring
	// appendFns holds, by session user (the session_authorization the
	// server reports), the *appendChoice of the SQL function of appends
	// through the Append query (see appendFunction).
	appendFns sync.Map
	// param names what appendFunction reads of a session (tests name
	// parameters no server reports, as proxies that do not report them).
	param appendParams
	// inlineLock chooses how the retry lock of inline appends is taken:
	// through inline_stream_lock, or pg_advisory_xact_lock on a schema
	// migrated before 0034 (see lockInlineStream).
	inlineLock lockfallback.Switch
	// mode is the pool's DefaultQueryExecMode, read once (Pool.Config
	// copies the configuration).
	mode pgx.QueryExecMode
	// loneMode is prepended to the arguments of a lone append's statement:
	// QueryExecModeExec on a pool in QueryExecModeSimpleProtocol (see
	// New), else nothing.
	loneMode []any
}

// appendParams are the names under which appendFunction finds what it
// reads of a session.
type appendParams struct {
	// sessionUser and superuser are the reported parameters
	// (paramSessionUser, paramSuperuser).
	sessionUser, superuser string
	// connKey is the key of the Store's answer in a connection's
	// CustomData, when the session's user is not reported.
	connKey string
}

type queries struct {
	append, appendJSONB, appendFunction, appendJSONUsable, appendBatch, appendOne, readAll, readStream, streamVersion, head, storedIDs,
	inlineWritten, inlineStreamLock, inlineStreamLockDirect string
}

// New returns a Store on pool. The schema must have been migrated (see the
// migrations package); New itself does not touch the database.
func New(pool *pgxpool.Pool, cfg *Config) (*Store, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if pool == nil {
		return nil, errors.New("eventstore: pool is nil")
	}
	var err error
	if c.Schema, err = schemaname.Resolve(c.Schema); err != nil {
		return nil, err
	}
	if c.Registry == nil {
		c.Registry = NewRegistry()
	}
	if c.MaxEventBytes < 0 || c.PageSize < 0 {
		return nil, errors.New("eventstore: MaxEventBytes and PageSize must not be negative")
	}
	if c.MaxEventBytes > MaxEventBytesLimit {
		return nil, errors.Newf("eventstore: MaxEventBytes %d is over MaxEventBytesLimit (%d)", c.MaxEventBytes, MaxEventBytesLimit)
	}
	if c.MaxEventBytes == 0 {
		c.MaxEventBytes = DefaultMaxEventBytes
	}
	if c.PageSize == 0 {
		c.PageSize = 500
	}
	named, err := sqltmpl.Named("queries.sql", queriesSQL, sqltmpl.NewData(c.Schema))
	if err != nil {
		return nil, err
	}
	tel, err := telemetry.NewAppend(c.TracerProvider, c.MeterProvider)
	if err != nil {
		return nil, err
	}
	gc, err := c.GroupCommit.withDefaults()
	if err != nil {
		return nil, err
	}
	// A lone append in the simple protocol would be reported as not sent
	// when its connection is lost while the server runs it: pgx (v5.12)
	// marks that error safe to retry, as if the query had never left. Sent
	// in the extended protocol with text arguments (QueryExecModeExec, as
	// the pool's arguments are meant: typed by their Go type) it is an
	// outcome unknown, as in every other mode. (A group's append_batch goes
	// in the extended protocol in every mode already.)
	mode := pool.Config().ConnConfig.DefaultQueryExecMode
	var loneMode []any
	if mode == pgx.QueryExecModeSimpleProtocol {
		loneMode = []any{pgx.QueryExecModeExec}
	}
	s := &Store{
		mode:     mode,
		loneMode: loneMode,
		tel:      tel,
		pool:     pool,
		schema:   c.Schema,
		param:    appendParams{sessionUser: paramSessionUser, superuser: paramSuperuser, connKey: "annals/eventstore.appendFunction " + c.Schema},
		registry: c.Registry,
		maxBytes: c.MaxEventBytes,
		pageSize: c.PageSize,
		q: queries{
			append:                 named["Append"],
			appendJSONB:            named["AppendJSONB"],
			appendFunction:         named["AppendFunction"],
			appendJSONUsable:       named["AppendJSONUsable"],
			appendBatch:            named["AppendBatch"],
			appendOne:              named["AppendOne"],
			readAll:                named["ReadAll"],
			readStream:             named["ReadStream"],
			streamVersion:          named["StreamVersion"],
			head:                   named["Head"],
			storedIDs:              named["StoredIDs"],
			inlineWritten:          named["InlineWritten"],
			inlineStreamLock:       named["InlineStreamLock"],
			inlineStreamLockDirect: named["InlineStreamLockDirect"],
		},
	}
	if s.inline, err = newInline(c.Inline); err != nil {
		return nil, err
	}
	if !gc.Disabled {
		s.group = newCommitter(s, gc)
	}
	if s.clock = c.Clock; s.clock == nil {
		s.clock = time.Now
	}
	if s.lc, err = newLifecycleQueries(c.Schema); err != nil {
		return nil, err
	}
	if s.keys, err = newKeyring(pool, c.Schema, c.KEK, c.KeyCacheSize, c.KeyCacheTTL); err != nil {
		return nil, err
	}
	if old := c.Registry.keys.Load(); c.KEK != nil || old == nil || old.kek == nil {
		c.Registry.keys.Store(s.keys)
	}
	return s, nil
}

// Schema returns the schema the store works in.
func (s *Store) Schema() string { return s.schema }

// Registry returns the store's event type registry.
func (s *Store) Registry() *Registry { return s.registry }

// Pool returns the store's connection pool.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Head returns the position of the newest committed event (0 for an empty
// log). Because positions are commit order, every event at or below it is
// visible to any reader that starts after Head returns.
func (s *Store) Head(ctx context.Context) (int64, error) {
	var head int64
	err := s.pool.QueryRow(ctx, s.q.head).Scan(&head)
	return head, errors.Wrap(err, "eventstore: read head")
}
