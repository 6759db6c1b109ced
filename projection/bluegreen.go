package projection

import (
	"context"
	"crypto/md5"
	_ "embed"
	"encoding/hex"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/checkpoint"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/lockkey"
	"github.com/annals-dev/annals/internal/pgtx"
	"github.com/annals-dev/annals/internal/schemaname"
	"github.com/annals-dev/annals/internal/sqltmpl"
	"github.com/annals-dev/annals/internal/telemetry"
)

//go:embed bluegreen.sql
var blueGreenSQL string

// BlueGreen makes a projection's read model versioned, for rebuilds without
// downtime (see "Blue/green read models" in the package doc). Set it in
// Options.BlueGreen; the projection must have a setup (Typed.OnSetup, or
// implement Setupper) that creates its tables with unqualified names.
type BlueGreen struct {
	// Version is the version of the read model this code builds: bump it
	// when the handlers or the setup change what the read model holds. It
	// must be at least 1.
	Version int
	// ReaderSchema is the schema of the views readers query (the stable
	// names). Defaults to "public".
	ReaderSchema string
	// AutoRebuild makes a runner whose Version is newer than the live
	// generation's (a deploy) start a blue/green rebuild itself: it sets up
	// a new generation, replays into it beside the live one and cuts over
	// when it has caught up. Instances of this version cooperate (the
	// generation's subscriber lock elects one to replay each partition).
	// It does not build a version again that was live and rolled back
	// (Rollback), nor while a generation of a newer version is building.
	// Defaults to false: such a runner only waits for someone to run
	// Runner.RebuildBlueGreen.
	//
	// No cut-over moves readers to an older version than the live
	// generation's (only Rollback does): a building generation of an older
	// version (a straggling instance of the previous deploy, an interrupted
	// rebuild) is retired without going live, with a warning (see
	// ErrCutoverOlderVersion).
	AutoRebuild bool
	// Retention is how long a retired generation is kept for rollback
	// before a runner drops its schema. Negative: never dropped
	// automatically. Defaults to 24h.
	Retention time.Duration
	// CheckInterval is how often a running runner looks at the projection's
	// generations (a new one to build, a cut-over to try, one to drop).
	// Defaults to 1s.
	CheckInterval time.Duration
	// CutoverAttempts bounds the cut-over attempts of one RebuildBlueGreen
	// that find the new generation behind the live one (it catches up and
	// tries again). Defaults to 20.
	CutoverAttempts int
	// CutoverLockTimeout bounds each wait of a cut-over transaction: for
	// this process's batches of the live generation in flight, for the
	// live generation's checkpoints (batches of other processes in
	// flight), for the catch-up of the new generation to their position
	// once it holds them (a batch under way at the deadline is finished,
	// not cut off), and for the views (readers holding them in long
	// transactions); the attempt then fails and is retried. The live read
	// model is not updated from the first of these waits to the end of the
	// transaction, each of those waits up to CutoverLockTimeout, plus the
	// lock of the new generation's checkpoints and a batch finished after
	// the deadline (not measured; no test bounds the total). RebuildBlueGreen
	// keeps its catch-up short: it catches up outside the transaction
	// first, until what is left would take half of CutoverLockTimeout at
	// the pace it measured. Defaults to 2s.
	CutoverLockTimeout time.Duration
}

func (b BlueGreen) withDefaults() BlueGreen {
	if b.ReaderSchema == "" {
		b.ReaderSchema = "public"
	}
	if b.Retention == 0 {
		b.Retention = 24 * time.Hour
	}
	if b.CheckInterval <= 0 {
		b.CheckInterval = time.Second
	}
	if b.CutoverAttempts <= 0 {
		b.CutoverAttempts = 20
	}
	if b.CutoverLockTimeout <= 0 {
		b.CutoverLockTimeout = 2 * time.Second
	}
	return b
}

// GenerationState is the state of a read-model generation.
type GenerationState string

// The states of a generation: building (replaying, readers do not see it),
// live (readers see it), retired (kept for rollback, no longer updated; or,
// with no LiveSince, set aside before it went live because a newer version
// went live first), dropped (its schema is gone).
const (
	GenerationBuilding GenerationState = "building"
	GenerationLive     GenerationState = "live"
	GenerationRetired  GenerationState = "retired"
	GenerationDropped  GenerationState = "dropped"
)

// Generation is one generation of a blue/green read model.
type Generation struct {
	Projection string `json:"projection"`
	Generation int    `json:"generation"`
	Version    int    `json:"version"`
	// Schema is the PostgreSQL schema of the generation's read model:
	// rm_<name>_g<N>, or, when a schema of that name already existed as
	// the generation was created (another annals schema of the database
	// with a blue/green projection of the same name, say),
	// rm_<name>_g<N>_<tag> (tag: 8 hex digits of the MD5 of the annals
	// schema's name). Code that needs a generation's schema reads it here
	// (ListGenerations), not from the name.
	Schema     string          `json:"schema"`
	Reader     string          `json:"reader_schema"`
	Subscriber string          `json:"subscriber"`
	State      GenerationState `json:"state"`
	CreatedBy  string          `json:"created_by"`
	CreatedAt  time.Time       `json:"created_at"`
	// LiveSince is when it first went live (nil: never), and LiveAgain,
	// when a rollback made it live again, the last time it went live (nil
	// otherwise). A generation rolled back to before migration 0039 (or by
	// an older binary) has the time it last went live then as LiveSince.
	LiveSince *time.Time `json:"live_since,omitempty"`
	LiveAgain *time.Time `json:"live_again,omitempty"`
	RetiredAt *time.Time `json:"retired_at,omitempty"`
	DroppedAt *time.Time `json:"dropped_at,omitempty"`
	// CutoverMS is the duration of the cut-over transaction that made it
	// live (without its COMMIT), and CutoverPosition the position it had
	// reached then.
	CutoverMS       *float64 `json:"cutover_ms,omitempty"`
	CutoverPosition *int64   `json:"cutover_position,omitempty"`
	// Replaced is the generation that was live before the cut-over that
	// made this one live, which Rollback goes back to: nil for none, and
	// for a generation cut over before migration 0030 recorded it. A
	// rollback that makes a generation live again leaves it as it was.
	Replaced *int `json:"replaced,omitempty"`
	// Unresolved is the number of unresolved dead letters (open, or
	// released for re-delivery) of its subscriber. A building generation is
	// not cut over while it has any: its read model lacks their events
	// (see ErrCutoverDeadLetters).
	Unresolved int `json:"unresolved_dead_letters"`
}

// Cutover reports a cut-over (or a rollback): readers moved from generation
// From (0: none) to To.
type Cutover struct {
	Projection string `json:"projection"`
	From       int    `json:"from"`
	To         int    `json:"to"`
	// FromPosition is where the old generation stopped (its highest
	// partition checkpoint), ToPosition where the new one stood (its lowest).
	FromPosition int64 `json:"from_position"`
	ToPosition   int64 `json:"to_position"`
	// Views is the number of views pointed at the new generation.
	Views int `json:"views"`
	// Duration is the cut-over transaction's duration, BEGIN to COMMIT.
	Duration time.Duration `json:"duration_ns"`
	// CatchUp is the part of Duration spent bringing the new generation up
	// to the old one's position while the old one was held: readers kept
	// reading the old generation meanwhile (only the view swap after it
	// makes them wait).
	CatchUp time.Duration `json:"catch_up_ns"`
	// Attempts is the number of cut-over transactions tried.
	Attempts int `json:"attempts"`
}

var (
	// ErrNotBlueGreen is returned for a projection registered without
	// Options.BlueGreen where a blue/green one is needed.
	ErrNotBlueGreen = errors.New("projection: the projection has no blue/green read model (Options.BlueGreen)")
	// ErrCutoverBehind is returned by a cut-over attempt that found the new
	// generation behind the live one; nothing changed.
	ErrCutoverBehind = errors.New("projection: the new generation is behind the live one")
	// ErrNoRollback is returned by Rollback when the generation the live
	// one replaced is no longer kept (dropped), or there is none.
	ErrNoRollback = errors.New("projection: no earlier generation to roll back to")
	// ErrNotLive is returned by RollbackFrom when the generation it is to
	// roll back from is not the live one (a rollback of it landed already:
	// its answer was lost, and this is a retry), and nothing was changed.
	ErrNotLive = errors.New("projection: the generation is not the live one")
	// ErrNoGenerations is returned for a projection without generations.
	ErrNoGenerations = errors.New("projection: the projection has no read-model generations")
	// ErrCutoverDeadLetters is returned by a cut-over attempt that found
	// unresolved dead letters (open, or released and not yet re-delivered)
	// of the new generation: its read model lacks their events (and, under
	// ParkStream, the later events of their streams), so readers are not
	// moved to it; nothing changed. The cut-over waits until an operator
	// resolves them: annals dlq retry (the events are re-delivered) or
	// annals dlq skip (a deliberate choice to do without them), with
	// --subscriber <name>#g<N>.
	ErrCutoverDeadLetters = errors.New("projection: the new generation has unresolved dead letters")
	// ErrCutoverOlderVersion is returned by a cut-over (and by
	// Runner.RebuildBlueGreen) whose generation is of an older
	// BlueGreen.Version than the live generation's: readers are never moved
	// back a version by a cut-over (a straggling instance of an earlier
	// deploy, an interrupted rebuild finishing late). The generation is
	// retired without going live (its LiveSince stays nil), so that nothing
	// runs or retries it; the live one is untouched. Going back to an older
	// read model is Rollback's job, or a deploy of the older code under a
	// newer Version.
	ErrCutoverOlderVersion = errors.New("projection: the new generation's version is older than the live generation's")
	// ErrForgedGeneration is returned by a cut-over, a rollback, a
	// runner's round of its blue/green projections, RebuildBlueGreen and
	// DropRetired when a row of read_model_generations they would act on names another
	// schema or subscriber than annals gives that generation
	// (rm_<name>_g<N>, or rm_<name>_g<N>_<tag> when that was taken, see
	// Generation.Schema; <name>#g<N>), or a reader schema that is not the
	// read model's: any runner role may write the rows, and the views,
	// schemas and checkpoints they name are changed as the caller's role.
	// Nothing is changed; see who wrote read_model_generations.
	ErrForgedGeneration = errors.New("projection: a generation's row names what annals does not give it")
	// ErrGenerationInUse is returned by DropRetired when objects of other
	// schemas depend on the schema of a generation its row says is
	// retired: the reader schema's views of it (it is the one readers read,
	// whatever the row says: any runner role may write
	// read_model_generations), or views, foreign keys, triggers … of
	// someone's own. DROP SCHEMA ... CASCADE would drop them too. Nothing
	// is dropped; the error names the schema and how many there are.
	ErrGenerationInUse = errors.New("projection: objects of other schemas depend on a retired generation's schema")
	// ErrForeignGenerationSchema is returned by a runner's round of its
	// blue/green projections, a cut-over, RebuildBlueGreen and a rollback
	// when the schema of a generation they would run handlers in or point
	// readers at is owned by a role this one is not a member of (and not a
	// superuser), or is missing: any runner role may insert a generation's
	// row and has CREATE on the database, so another service's runner
	// could make the schema annals names the generation itself, and then
	// read and change everything this service's handlers write into it and
	// its readers read. Nothing is run or changed; the error names the
	// owner.
	ErrForeignGenerationSchema = errors.New("projection: a generation's schema is owned by another role")
)

// owned returns ErrForeignGenerationSchema when the schema of generation x
// of projection name is missing, or owned by a role the current one is not
// a member of and that is not a superuser (SchemaOwner). The schema annals
// makes for a generation (read_model_create_schema, with the caller's
// rights) is its creator's; runners of one read model run as one role.
func (g *generations) owned(ctx context.Context, db checkpoint.DB, name string, x Generation) error {
	var (
		owner string
		ok    bool
	)
	err := db.QueryRow(ctx, g.q["SchemaOwner"], x.Schema).Scan(&owner, &ok)
	if errors.Is(err, pgx.ErrNoRows) {
		return errors.Wrapf(ErrForeignGenerationSchema, "projection %q: the schema %q of generation %d is missing "+
			"(annals makes it with the generation's row: see who wrote read_model_generations)", name, x.Schema, x.Generation)
	}
	if err != nil {
		return errors.Wrapf(err, "projection %q: read the owner of schema %q", name, x.Schema)
	}
	if !ok {
		return errors.Wrapf(ErrForeignGenerationSchema, "projection %q: the schema %q of generation %d is owned by %q, "+
			"a role this one is not a member of: not used (another role made it before this runner: see who wrote "+
			"read_model_generations and who made the schema)", name, x.Schema, x.Generation, owner)
	}
	return nil
}

// olderThanLive returns the live generation of gens when gen is building
// and of an older version than it: a cut-over must not make gen live.
func olderThanLive(gens []Generation, gen Generation) (Generation, bool) {
	l := live(gens)
	if l == nil || gen.State != GenerationBuilding || gen.Version >= l.Version {
		return Generation{}, false
	}
	return *l, true
}

// abandon retires building generation gen, never live, because generation
// l, of a newer version, is live (olderThanLive), in tx, which holds the
// generations lock: its checkpoints are stopped with the reason returned
// (the epoch bump fences a leader replaying it), the runners of its version
// stop running it, and its schema is dropped after BlueGreen.Retention
// like any retired generation's. Its LiveSince stays nil, which tells it
// from a generation rolled back from.
func (g *generations) abandon(ctx context.Context, tx pgx.Tx, name string, gen, l Generation) (string, error) {
	reason := fmt.Sprintf("annals: generation %d (version %d) retired before it went live: generation %d, of the newer version %d, "+
		"is live, and a cut-over never moves readers back to an older version (Rollback does, on purpose)",
		gen.Generation, gen.Version, l.Generation, l.Version)
	return reason, g.retire(ctx, tx, name, gen, reason)
}

// retire stops generation gen of projection name where it is, in tx: its
// checkpoints get reason as their stop reason and a new epoch (fencing its
// leaders, announced), and it is marked retired.
func (g *generations) retire(ctx context.Context, tx pgx.Tx, name string, gen Generation, reason string) error {
	if err := gen.forged(g.schema, name); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, g.q["RetireCheckpoints"], gen.Subscriber, reason); err != nil {
		return errors.Wrapf(err, "projection %q: stop generation %d", name, gen.Generation)
	}
	if _, err := tx.Exec(ctx, g.q["MarkRetired"], name, gen.Generation); err != nil {
		return errors.Wrapf(err, "projection %q: retire generation %d", name, gen.Generation)
	}
	return nil
}

// logAbandoned says that gen was retired by abandon, and why.
func (r *Runner) logAbandoned(ctx context.Context, name string, gen, l Generation, reason string) {
	r.cfg.Logger.WarnContext(ctx, "annals: blue/green: a building generation of an older version than the live one was retired, not cut over",
		slog.String("projection", name), slog.Int("generation", gen.Generation), slog.Int("version", gen.Version),
		slog.Int("live_generation", l.Generation), slog.Int("live_version", l.Version), slog.String("why", reason))
}

// overtaken returns ErrCutoverOlderVersion, wrapped, when generation gen
// of a rebuild was retired before it went live because a newer version is
// live (abandon), and nil otherwise (or when the generations cannot be
// read): it says why a rebuild lost its generation.
func (r *Runner) overtaken(ctx context.Context, g *generations, name string, gen Generation) error {
	gens, err := g.list(context.WithoutCancel(ctx), r.pool, name)
	if err != nil {
		return nil
	}
	x, ok := generationOf(gens, gen.Subscriber)
	l := live(gens)
	if !ok || x.State != GenerationRetired || x.LiveSince != nil || l == nil || l.Version <= x.Version {
		return nil
	}
	return errors.Wrapf(ErrCutoverOlderVersion, "projection: blue/green rebuild %q: generation %d (version %d) was retired before it went live: "+
		"generation %d, of the newer version %d, is live", name, x.Generation, x.Version, l.Generation, l.Version)
}

// deadLetterWait is what a new generation's unresolved dead letters are.
type deadLetterWait struct {
	sub      string
	n        int   // unresolved
	released int   // of which released for re-delivery (status retry)
	first    int64 // the position of the first
}

// err returns the ErrCutoverDeadLetters of the wait, with what to do.
func (w deadLetterWait) err(name string, gen int) error {
	return errors.Wrapf(ErrCutoverDeadLetters, "%q: generation %d has %s", name, gen, w)
}

// String says what the wait is and what resolves it.
func (w deadLetterWait) String() string {
	s := fmt.Sprintf("%d unresolved dead letter%s (the first at position %d", w.n, plural(w.n), w.first)
	if w.released > 0 {
		s += fmt.Sprintf("; %d released, waiting for re-delivery", w.released)
	}
	return s + fmt.Sprintf("): the cut-over waits until they are resolved: annals dlq list --subscriber '%s', "+
		"then annals dlq retry (re-deliver) or annals dlq skip (do without them)", w.sub)
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// unresolved reads the unresolved dead letters of subscriber sub.
func (g *generations) unresolved(ctx context.Context, db checkpoint.DB, sub string) (deadLetterWait, error) {
	w := deadLetterWait{sub: sub}
	err := db.QueryRow(ctx, g.q["Unresolved"], sub).Scan(&w.n, &w.released, &w.first)
	return w, errors.Wrapf(err, "projection: read the dead letters of %q", sub)
}

// blueGreenReg is what a blue/green registration keeps besides the usual.
type blueGreenReg struct {
	cfg   BlueGreen
	p     Projection
	setup Setupper
	cut   CommitCutter
}

// generationSchemas returns the two names annals may give generation gen
// of projection name in annals schema schema (resolved:
// schemaname.Resolve), and no other:
//
//   - unscoped, rm_<name>_g<gen>, the name annals has always given and
//     still gives whenever no schema of that name exists yet;
//   - scoped, rm_<name>_g<gen>_<tag>, tag being 8 hex digits of the MD5 of
//     the annals schema's name, which a new generation takes when the
//     unscoped name is already taken (another annals schema of the database
//     with a blue/green projection of the same name, a leftover of one, or
//     anything else), or is taken under it by a concurrent creation
//     (createGeneration).
//
// The two forms cannot give the same name, whatever the projection's name:
// an unscoped name ends in _g and decimal digits, a scoped one in _ and 8
// hex digits (no g). The projection's name is lower-cased, every character
// outside [a-z0-9_] replaced by _, and (when that changed the name or it
// is long) a hash of the name added, within PostgreSQL's 63 bytes.
func generationSchemas(schema, name string, gen int) (unscoped, scoped string) {
	h := md5.Sum([]byte(schema))
	return generationSchema(name, gen), rmSchema(name, "_g"+strconv.Itoa(gen)+"_"+hex.EncodeToString(h[:4]))
}

// generationSchema returns rm_<name>_g<gen>: the unscoped name of
// generation gen of projection name (generationSchemas).
func generationSchema(name string, gen int) string {
	return rmSchema(name, "_g"+strconv.Itoa(gen))
}

// rmSchema returns rm_<name><suffix>, with the name lower-cased, every
// character outside [a-z0-9_] replaced by _, and (when that changed the
// name or it is long) a hash of the name added, within PostgreSQL's 63
// bytes.
func rmSchema(name, suffix string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(name) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') || r == '_' {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	s := b.String()
	if s != name || len("rm_"+s+suffix) > 63 {
		h := md5.Sum([]byte(name))
		tag := "_" + hex.EncodeToString(h[:4])
		s = s[:min(len(s), 63-len("rm_")-len(tag)-len(suffix))] + tag
	}
	return "rm_" + s + suffix
}

// generationSubscriber is the subscriber (checkpoints, lock) of a generation.
func generationSubscriber(name string, gen int) string {
	return name + "#g" + strconv.Itoa(gen)
}

// forged returns an error (ErrForgedGeneration) when x's row names another
// schema or subscriber than annals could have given generation
// x.Generation of projection name in annals schema schema
// (forgedSchema, generationSubscriber): any runner role may write
// read_model_generations, and what the row names is changed as the
// caller's role (views pointed at the schema, handlers run with it first
// on the search_path, the subscriber's checkpoints fenced). As DropRetired
// checks the schema it drops.
func (x Generation) forged(schema, name string) error {
	if err := forgedSchema(schema, name, x.Generation, x.Schema); err != nil {
		return err
	}
	if want := generationSubscriber(name, x.Generation); x.Subscriber != want {
		return errors.Wrapf(ErrForgedGeneration, "projection %q: generation %d names subscriber %q, not %q as annals names it "+
			"(a row annals did not write, or changed: see who wrote read_model_generations)", name, x.Generation, x.Subscriber, want)
	}
	return nil
}

// forgedSchema returns an error (ErrForgedGeneration) when got is neither
// name annals could have given generation gen of projection name in annals
// schema schema: the unscoped one or the scoped one (generationSchemas).
func forgedSchema(schema, name string, gen int, got string) error {
	unscoped, scoped := generationSchemas(schema, name, gen)
	if got == unscoped || got == scoped {
		return nil
	}
	return errors.Wrapf(ErrForgedGeneration, "projection %q: generation %d names schema %q, not %q or %q as annals names it "+
		"(a row annals did not write, or changed: see who wrote read_model_generations)", name, gen, got, unscoped, scoped)
}

// checkName refuses a subscriber name that ends like a generation's
// subscriber (#g and digits: <name>#g<N>). Such a name is reserved: a
// subscriber under it would share a blue/green generation's checkpoints,
// lock and dead letters, each moving the other's checkpoint past events it
// never handled.
func checkName(name string) error {
	i := strings.LastIndex(name, "#g")
	if i < 0 || i+2 == len(name) || strings.TrimLeft(name[i+2:], "0123456789") != "" {
		return nil
	}
	return errors.Newf("projection: %q: names ending in #g and digits are reserved for the subscribers of blue/green generations (<name>#g<N>); choose another name", name)
}

// generations is the registry of one schema's blue/green read models.
type generations struct {
	schema string
	q      map[string]string
}

func newGenerations(schema string) (*generations, error) {
	schema, err := schemaname.Resolve(schema)
	if err != nil {
		return nil, err
	}
	q, err := sqltmpl.Named("bluegreen.sql", blueGreenSQL, sqltmpl.NewData(schema))
	if err != nil {
		return nil, err
	}
	return &generations{schema: schema, q: q}, nil
}

// beginGenerations begins a transaction on db for a change under the
// generations lock: READ COMMITTED (pgtx.ReadCommitted) when db can begin
// one with options (a pool, a connection), else with db.Begin (a caller's
// transaction, whose savepoint keeps the caller's isolation). Every
// transaction that takes the generations lock is READ COMMITTED, so that
// what it reads after the lock shows what the lock's previous holder
// committed: under REPEATABLE READ or SERIALIZABLE it would keep the
// snapshot taken before the wait, and miss (or fail to serialize with) the
// generation another process just created, cut over, rolled back or
// dropped.
func beginGenerations(ctx context.Context, db interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}) (pgx.Tx, error) {
	if b, ok := db.(interface {
		BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
	}); ok {
		return b.BeginTx(ctx, pgtx.ReadCommitted)
	}
	return db.Begin(ctx)
}

func (g *generations) lock(ctx context.Context, tx pgx.Tx, name string) error {
	k1, k2 := lockkey.Pair(g.schema + ":generations:" + name)
	_, err := tx.Exec(ctx, g.q["GenLock"], k1, k2)
	return errors.Wrapf(err, "projection %q: lock the generations", name)
}

func (g *generations) list(ctx context.Context, db checkpoint.DB, name string) ([]Generation, error) {
	rows, err := db.Query(ctx, g.q["Generations"], name)
	if err != nil {
		return nil, errors.Wrapf(err, "projection %q: read the generations", name)
	}
	var out []Generation
	var x Generation
	var state string
	var last *time.Time
	_, err = pgx.ForEachRow(rows, []any{&x.Generation, &x.Version, &x.Schema, &x.Reader, &x.Subscriber, &state,
		&x.CreatedBy, &x.CreatedAt, &x.LiveSince, &last, &x.RetiredAt, &x.DroppedAt, &x.CutoverMS, &x.CutoverPosition, &x.Replaced, &x.Unresolved}, func() error {
		x.Projection, x.State = name, GenerationState(state)
		if last != nil && x.LiveSince != nil && !last.Equal(*x.LiveSince) {
			x.LiveAgain = last
		}
		last = nil
		out = append(out, x)
		x = Generation{}
		return nil
	})
	return out, errors.Wrapf(err, "projection %q: read the generations", name)
}

func live(gens []Generation) *Generation {
	for i := range gens {
		if gens[i].State == GenerationLive {
			return &gens[i]
		}
	}
	return nil
}

// positions returns the lowest and highest checkpoint of a subscriber and
// the number of its rows (locked FOR UPDATE with lockRows).
func (g *generations) positions(ctx context.Context, db checkpoint.DB, sub string, lockRows bool) (lo, hi int64, n int, err error) {
	q := g.q["Positions"]
	if lockRows {
		q = g.q["LockCheckpoints"]
	}
	rows, err := db.Query(ctx, q, sub)
	if err != nil {
		return 0, 0, 0, errors.Wrapf(err, "projection: read the checkpoints of %q", sub)
	}
	var part int
	var pos int64
	lo = -1
	_, err = pgx.ForEachRow(rows, []any{&part, &pos}, func() error {
		if lo < 0 || pos < lo {
			lo = pos
		}
		hi = max(hi, pos)
		n++
		return nil
	})
	return max(lo, 0), hi, n, errors.Wrapf(err, "projection: read the checkpoints of %q", sub)
}

// create registers generation (the next number) of reg's projection in
// state, creates its schema and runs the projection's setup in it, in tx
// (which holds the generations lock). A live first generation also gets
// its views.
func (r *Runner) createGeneration(ctx context.Context, tx pgx.Tx, g *generations, name string, bg *blueGreenReg, state GenerationState) (Generation, error) {
	var n int
	if err := tx.QueryRow(ctx, g.q["NextGeneration"], name).Scan(&n); err != nil {
		return Generation{}, errors.Wrapf(err, "projection %q: number the generation", name)
	}
	gen := Generation{Projection: name, Generation: n, Version: bg.cfg.Version,
		Reader: bg.cfg.ReaderSchema, Subscriber: generationSubscriber(name, n), State: state, CreatedBy: r.cfg.InstanceID}
	var err error
	if gen.Schema, err = g.makeSchema(ctx, tx, gen); err != nil {
		return Generation{}, err
	}
	if _, err := tx.Exec(ctx, g.q["SearchPath"], gen.Schema); err != nil {
		return Generation{}, errors.Wrapf(err, "projection %q: search_path", name)
	}
	if err := safely(func() error { return bg.setup.Setup(ctx, tx) }); err != nil {
		return Generation{}, errors.Wrapf(err, "projection %q: setup version %d in %s", name, bg.setup.SetupVersion(), gen.Schema)
	}
	var rels int
	if err := tx.QueryRow(ctx, g.q["Relations"], gen.Schema).Scan(&rels); err != nil {
		return Generation{}, errors.Wrapf(err, "projection %q: list the relations of %s", name, gen.Schema)
	}
	if rels == 0 {
		return Generation{}, errors.Newf("projection %q: the setup created nothing in schema %s (create the tables with unqualified names)", name, gen.Schema)
	}
	if state == GenerationLive {
		if _, err := tx.Exec(ctx, g.q["SwapViews"], gen.Reader, nil, gen.Schema); err != nil {
			return Generation{}, errors.Wrapf(err, "projection %q: create the views of generation %d", name, n)
		}
	}
	r.cfg.Logger.InfoContext(ctx, "annals: read-model generation set up", slog.String("projection", name),
		slog.Int("generation", n), slog.Int("version", gen.Version), slog.String("schema", gen.Schema), slog.String("state", string(state)))
	return gen, nil
}

// makeSchema registers generation gen (its row) and creates its schema, in
// tx, under the name annals gives it (generationSchemas), which it
// returns: the unscoped rm_<name>_g<N> when no schema of that name exists,
// else the scoped rm_<name>_g<N>_<tag>. The generations lock is per annals
// schema, so another annals schema of the database may be creating the
// unscoped name at the same time: the CREATE SCHEMA that loses (42P06 once
// the other committed, 23505 on pg_namespace while it had not) is undone
// to a savepoint taken before the row, and the generation registered and
// created again under the scoped name. A scoped name taken too (a leftover
// of an annals schema of the same name) is an error.
func (g *generations) makeSchema(ctx context.Context, tx pgx.Tx, gen Generation) (string, error) {
	unscoped, scoped := generationSchemas(g.schema, gen.Projection, gen.Generation)
	var taken bool
	if err := tx.QueryRow(ctx, g.q["SchemaExists"], unscoped).Scan(&taken); err != nil {
		return "", errors.Wrapf(err, "projection %q: look for schema %s", gen.Projection, unscoped)
	}
	if taken {
		return scoped, g.insertSchema(ctx, tx, gen, scoped)
	}
	sp, err := tx.Begin(ctx)
	if err != nil {
		return "", errors.Wrapf(err, "projection %q: savepoint", gen.Projection)
	}
	err = g.insertSchema(ctx, sp, gen, unscoped)
	if err == nil {
		return unscoped, errors.Wrapf(sp.Commit(ctx), "projection %q: release the savepoint", gen.Projection)
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || (pgErr.Code != "42P06" && pgErr.Code != "23505") || !errors.Is(err, errCreateSchema) {
		return "", err
	}
	if err := sp.Rollback(ctx); err != nil {
		return "", errors.Wrapf(err, "projection %q: roll back to the savepoint", gen.Projection)
	}
	return scoped, g.insertSchema(ctx, tx, gen, scoped)
}

// errCreateSchema marks an error of read_model_create_schema (insertSchema).
var errCreateSchema = errors.New("create the schema")

// insertSchema inserts generation gen's row naming schema and creates the
// schema (read_model_create_schema reads the name from the row).
func (g *generations) insertSchema(ctx context.Context, tx pgx.Tx, gen Generation, schema string) error {
	name, n := gen.Projection, gen.Generation
	if _, err := tx.Exec(ctx, g.q["InsertGeneration"], name, n, gen.Version, schema, gen.Reader, gen.Subscriber, string(gen.State), gen.CreatedBy); err != nil {
		return errors.Wrapf(err, "projection %q: register generation %d", name, n)
	}
	if _, err := tx.Exec(ctx, g.q["CreateSchema"], name, n); err != nil {
		return errors.Wrapf(errors.Mark(err, errCreateSchema), "projection %q: create the schema %s of generation %d", name, schema, n)
	}
	return nil
}

// ensureGenerations creates what this runner's version needs: the first
// generation (live at once: there is nothing older to serve) when the
// projection has none, or with AutoRebuild a building generation when the
// live one is older and nothing blocks it (rebuildBlocker: once rolled
// back, a version is not rebuilt by itself again). A building generation
// of this version while a newer version is live is retired (abandon): it
// must never be cut over. It returns the generations.
func (r *Runner) ensureGenerations(ctx context.Context, g *generations, name string, bg *blueGreenReg) ([]Generation, error) {
	gens, err := g.list(ctx, r.pool, name)
	if err != nil {
		return nil, err
	}
	if !r.staleBuilding(gens, bg) && !r.wantsGeneration(gens, bg) {
		return gens, nil
	}
	type abandoned struct {
		gen, live Generation
		reason    string
	}
	var retired []abandoned
	err = pgx.BeginTxFunc(ctx, r.pool, pgtx.ReadCommitted, func(tx pgx.Tx) error {
		if err := g.lock(ctx, tx, name); err != nil {
			return err
		}
		if gens, err = g.list(ctx, tx, name); err != nil {
			return err
		}
		for _, x := range gens {
			if l, stale := olderThanLive(gens, x); stale && x.Version == bg.cfg.Version {
				reason, err := g.abandon(ctx, tx, name, x, l)
				if err != nil {
					return err
				}
				retired = append(retired, abandoned{gen: x, live: l, reason: reason})
			}
		}
		if len(retired) > 0 {
			if gens, err = g.list(ctx, tx, name); err != nil {
				return err
			}
		}
		if !r.wantsGeneration(gens, bg) {
			return nil
		}
		state := GenerationBuilding
		if len(gens) == 0 {
			state = GenerationLive
		}
		_, err := r.createGeneration(ctx, tx, g, name, bg, state)
		return err
	})
	if err != nil {
		return nil, err
	}
	for _, x := range retired {
		r.logAbandoned(ctx, name, x.gen, x.live, x.reason)
	}
	return g.list(ctx, r.pool, name)
}

// staleBuilding reports whether a generation of bg's version is building
// while a newer version is live.
func (r *Runner) staleBuilding(gens []Generation, bg *blueGreenReg) bool {
	return slices.ContainsFunc(gens, func(x Generation) bool {
		_, stale := olderThanLive(gens, x)
		return stale && x.Version == bg.cfg.Version
	})
}

func (r *Runner) wantsGeneration(gens []Generation, bg *blueGreenReg) bool {
	if len(gens) == 0 {
		return true
	}
	l := live(gens)
	if !bg.cfg.AutoRebuild || l == nil || l.Version >= bg.cfg.Version {
		return false
	}
	_, blocked := rebuildBlocker(gens, bg.cfg.Version)
	return !blocked
}

// rebuildBlocker returns the generation that keeps AutoRebuild from
// building version v while an older version is live, and why: the newest
// generation of version v or a newer one that is building, or that was
// live and left it by a rollback. Generations of those versions that do
// not block it: one retired before it went live (abandon: a newer version
// was live then), and one that a cut-over replaced (cutOverFrom): the
// generation that replaced it decides if it is of version v or newer, and
// a cut-over to an older version (which annals made before it refused
// them) rolled nothing back.
func rebuildBlocker(gens []Generation, v int) (string, bool) {
	for i := len(gens) - 1; i >= 0; i-- {
		x := gens[i]
		if x.Version < v {
			continue
		}
		switch {
		case x.State == GenerationBuilding || x.State == GenerationLive:
			return fmt.Sprintf("generation %d, of version %d, is %s", x.Generation, x.Version, x.State), true
		case x.LiveSince == nil:
			continue
		}
		if cutOver(gens, x) {
			continue
		}
		return fmt.Sprintf("version %d (generation %d) was live and rolled back (projections rollback)", x.Version, x.Generation), true
	}
	return "", false
}

// cutOver reports whether a cut-over retired x (retired or dropped):
// whether a generation records x as Replaced and went live no earlier than
// x was retired (a cut-over retires the old generation and makes the new
// one live in one transaction, in that order). A generation that none such
// replaced was retired by a rollback.
func cutOver(gens []Generation, x Generation) bool {
	if x.RetiredAt == nil {
		return false
	}
	return slices.ContainsFunc(gens, func(y Generation) bool {
		return y.Replaced != nil && *y.Replaced == x.Generation && y.lastLive() != nil && !x.RetiredAt.After(*y.lastLive())
	})
}

// lastLive is the last time g went live: LiveAgain, else LiveSince.
func (g Generation) lastLive() *time.Time {
	if g.LiveAgain != nil {
		return g.LiveAgain
	}
	return g.LiveSince
}

// generationProjection runs a projection's handlers in a generation's
// schema: before the first event of each transaction it sets the
// transaction's search_path to the schema (pipelined with BEGIN by the
// batch transaction), so unqualified names resolve to the generation's
// tables.
type generationProjection struct {
	p      Projection
	schema string
	q      string // SearchPath

	mu   sync.Mutex
	last pgx.Tx // the transaction the search_path was set in (kept: its address cannot be reused)
}

func (g *generationProjection) Name() string { return g.p.Name() }

func (g *generationProjection) Handle(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	g.mu.Lock()
	fresh := g.last != tx
	g.last = tx
	g.mu.Unlock()
	if fresh {
		if _, err := tx.Exec(ctx, g.q, g.schema); err != nil {
			g.mu.Lock()
			g.last = nil
			g.mu.Unlock()
			return errors.Wrapf(err, "projection %q: set the search_path to %s", g.p.Name(), g.schema)
		}
	}
	return g.p.Handle(ctx, tx, e)
}

// generationSubs returns the subscriptions of one generation of reg, or
// ErrForgedGeneration when its row names another schema or subscriber than
// annals gives it (its handlers would run in that schema), or
// ErrForeignGenerationSchema when another role owns the schema (or it is
// missing): the handlers would write what that role may read and change.
// A schema this role owns stays its own (only its owner may give it away).
func (r *Runner) generationSubs(ctx context.Context, reg *registration, g *generations, gen Generation, wrap func(catchup.Processor) catchup.Processor) ([]*catchup.Subscription, error) {
	if err := gen.forged(g.schema, reg.name); err != nil {
		return nil, err
	}
	if err := g.owned(ctx, r.pool, reg.name, gen); err != nil {
		return nil, err
	}
	bg := reg.bg
	var subs []*catchup.Subscription
	for part := range reg.opts.Partitions {
		var proc catchup.Processor = &txProcessor{
			p:   &generationProjection{p: bg.p, schema: gen.Schema, q: g.q["SearchPath"]},
			f:   r.failures(gen.Subscriber, reg.opts),
			cut: bg.cut,
		}
		// Held while a cut-over on this pool holds the generation's
		// checkpoints (see cutover).
		proc = &gatedProcessor{Processor: proc, gates: leaderGates, key: r.gateOf(gen.Subscriber)}
		if wrap != nil {
			proc = wrap(proc)
		}
		subs = append(subs, &catchup.Subscription{
			Name: gen.Subscriber, Partition: part, Partitions: reg.opts.Partitions, PartitionBy: reg.opts.PartitionBy,
			Filter: reg.filter, BatchSize: reg.opts.BatchSize, Processor: proc,
			// Balanced as a projection without BlueGreen is: the runners of
			// the generation's version share its partitions (TakeOver, a
			// rebuild's, ignores it).
			Balance: true, SyncCommits: reg.opts.SyncCommits,
		})
	}
	return subs, nil
}

// leaderGate holds the batches of this process's leaders of one generation
// (those whose processors are on one pool) while a cut-over on that pool
// holds the generation's checkpoints (see cutover): a batch that reached
// its commit then would wait for the cut-over's commit holding a
// connection of the pool, and the cut-over's own catch-up needs the pool.
//
// A gate exists only while it is used: from the first enter or hold on it
// to the last leave, failed enter or release, it is in its gateSet; then
// it goes (its state is that of a new gate: open, nothing in flight).
type leaderGate struct {
	refs     int           // enters (waiting or in flight) and holds not yet ended
	held     int           // cut-overs holding the gate
	opened   chan struct{} // closed when the gate opens again (made by the first hold)
	inFlight int           // Process and Redeliver calls under way
	drained  chan struct{} // closed when inFlight falls to 0; nil when nobody waits for it
}

// gateKey names the gate of a generation subscriber's leaders on a pool.
type gateKey struct {
	pool       *pgxpool.Pool
	schema     string
	subscriber string
}

// gateSet holds the gates in use, by pool and generation subscriber: the
// leaders that a cut-over on a pool must keep off it are those on the
// same pool, whichever Runner runs them.
type gateSet struct {
	mu sync.Mutex // guards m and every gate in it
	m  map[gateKey]*leaderGate
}

// leaderGates are the gates of this process.
var leaderGates = &gateSet{m: map[gateKey]*leaderGate{}}

// gateOf returns the key of generation subscriber sub's gate on r's pool.
func (r *Runner) gateOf(sub string) gateKey {
	return gateKey{pool: r.pool, schema: r.cfg.Schema, subscriber: sub}
}

// ref returns k's gate, made if none is in use, counting one more use.
// s.mu is held.
func (s *gateSet) ref(k gateKey) *leaderGate {
	g := s.m[k]
	if g == nil {
		g = &leaderGate{}
		s.m[k] = g
	}
	g.refs++
	return g
}

// unref ends a use of k's gate g, which goes once none is left. s.mu is
// held.
func (s *gateSet) unref(k gateKey, g *leaderGate) {
	if g.refs--; g.refs == 0 {
		delete(s.m, k)
	}
}

// gateLease is what enter needs of a leader's *catchup.Lease.
type gateLease interface {
	Stopping() <-chan struct{}
	Lost() <-chan struct{}
	Err() error
}

// enter waits while k's gate is held, then counts a call in flight (leave
// ends it): it returns true, or false when the leadership is ending
// meanwhile (with lease.Err when its lock is lost, nil when the run stops,
// ctx's error when ctx ends otherwise). A run that stops is told so even
// when ctx has ended too (after the ShutdownTimeout both are): the batch
// was not started, not failed.
func (s *gateSet) enter(ctx context.Context, k gateKey, lease gateLease) (bool, error) {
	s.mu.Lock()
	g := s.ref(k)
	for {
		if g.held == 0 {
			g.inFlight++
			s.mu.Unlock()
			return true, nil
		}
		opened := g.opened
		s.mu.Unlock()
		var err error
		select {
		case <-opened:
		case <-lease.Stopping():
		case <-lease.Lost():
			err = lease.Err()
		case <-ctx.Done():
			err = ctx.Err()
		}
		s.mu.Lock()
		if isClosed(opened) {
			continue
		}
		if isClosed(lease.Stopping()) {
			err = nil
		}
		s.unref(k, g)
		s.mu.Unlock()
		return false, err
	}
}

// isClosed reports whether ch is closed (false for a nil ch).
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// leave ends a call that enter counted.
func (s *gateSet) leave(k gateKey) {
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.m[k]
	if g.inFlight--; g.inFlight == 0 && g.drained != nil {
		close(g.drained)
		g.drained = nil
	}
	s.unref(k, g)
}

// hold closes k's gate (calls that have not entered wait) and waits, up to
// wait, for the calls in flight to end; drained says whether they did. A
// call can be in flight for long without a connection (a handler's retry
// waiting for its delay): the cut-over then goes on, as it did before the
// gate. release opens the gate again (once every hold is released).
func (s *gateSet) hold(ctx context.Context, k gateKey, wait time.Duration) (release func(), drained bool) {
	s.mu.Lock()
	g := s.ref(k)
	if g.held == 0 {
		g.opened = make(chan struct{})
	}
	g.held++
	var ch chan struct{}
	if g.inFlight > 0 {
		if g.drained == nil {
			g.drained = make(chan struct{})
		}
		ch = g.drained
	}
	s.mu.Unlock()
	var once sync.Once
	release = func() {
		once.Do(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			if g.held--; g.held == 0 {
				close(g.opened)
			}
			s.unref(k, g)
		})
	}
	if ch == nil {
		return release, true
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ch:
		return release, true
	case <-t.C:
	case <-ctx.Done():
	}
	return release, false
}

// gatedProcessor passes a generation's batches and re-deliveries through
// its leaderGate: they wait while a cut-over on this pool holds the
// generation's checkpoints, before they take a connection.
type gatedProcessor struct {
	catchup.Processor
	gates *gateSet
	key   gateKey
}

func (p *gatedProcessor) Process(ctx context.Context, lease *catchup.Lease, b catchup.Batch) (int64, error) {
	ok, err := p.gates.enter(ctx, p.key, lease)
	if !ok {
		return b.After, err // nothing done: the batch is read again, or the leadership ends
	}
	defer p.gates.leave(p.key)
	return p.Processor.Process(ctx, lease, b)
}

func (p *gatedProcessor) Redeliver(ctx context.Context, lease *catchup.Lease) error {
	ok, err := p.gates.enter(ctx, p.key, lease)
	if !ok {
		return err
	}
	defer p.gates.leave(p.key)
	return p.Processor.Redeliver(ctx, lease)
}

// NextIdle forwards the wrapped processor's (catchup.IdleDeadliner).
func (p *gatedProcessor) NextIdle() time.Time { return nextIdle(p.Processor) }

// cutover tries once to make generation to of name live: in one
// transaction it locks the live generation's checkpoints (waiting for its
// leader's batch in flight and holding the next), then the new one's, and
// gives up with ErrCutoverBehind unless every partition of the new one has
// reached the old one's highest position; else it points the reader views
// at the new schema, stops and fences the old generation where it is, and
// flips the states. A generation that is no longer building (another
// process cut over) returns a Cutover with To = 0. A generation of an older
// version than the live one's is never made live: it is retired in the
// same transaction (abandon, under the generations lock, so that two
// racing cut-overs see each other's result) and the cut-over fails with
// ErrCutoverOlderVersion.
//
// Between the two locks catchUp brings the new generation to the old one's
// position (the old one is held there; readers still read it). While the
// old generation's checkpoints are locked its leaders cannot commit, and a
// leader that reaches its commit waits for the cut-over's, holding a
// connection of its pool; catchUp, and nothing else the transaction waits
// for, must then not need one of r's pool, or the two wait for each other
// for good (every leader of a generation of P partitions in this process
// waiting on a pool of P+1 or fewer, the transaction holding the last).
// So:
//
//   - the transaction reads on its own connection (catchUp gets it too, to
//     poll the new generation's checkpoints);
//   - before it locks the old generation's checkpoints, it holds the old
//     generation's leaderGate on r's pool: this process's leaders of it
//     (whichever Runner on this pool runs them) finish the batch in hand
//     (waited for up to BlueGreen.CutoverLockTimeout) and start no other
//     until the transaction ends, so they hold no connection meanwhile.
//     A batch so held fails its commit afterwards if the cut-over went
//     through (the old generation is fenced), and goes on as usual if not;
//     the fence, not the gate, is what keeps the old generation from
//     moving past the cut-over;
//   - catchUp runs under a deadline of CutoverLockTimeout, like the
//     transaction's lock waits: a catch-up that does not make it in that
//     time (leaders of other processes or Runners on this pool held up as
//     above, a pool too small for the catch-up, writers faster than the
//     new generation) ends the attempt with ErrCutoverBehind, which rolls
//     back and releases the rows; callers retry. The deadline stops it
//     between batches: RebuildBlueGreen's drive reads on the pool, but its
//     batches commit on the sessions holding its partitions' locks, and a
//     statement cut off there would close the session and lose the lock
//     (catchup.Engine.DriveWithin). A catch-up cut off once it had reached the
//     position (looking for released dead letters) does not fail the
//     attempt: the new generation's checkpoints decide.
func (r *Runner) cutover(ctx context.Context, g *generations, name string, bg *blueGreenReg, to, partitions int,
	catchUp func(ctx context.Context, tx pgx.Tx, from, target int64) error) (Cutover, error) {
	lockTimeout := bg.cfg.CutoverLockTimeout
	c := Cutover{Projection: name, To: to, Attempts: 1}
	start := time.Now()
	var stale *Generation // the live generation, newer than generation to
	var abandoned Generation
	var reason string
	release := func() {} // the old generation's leaderGate, once held
	// Released however the transaction ends (a panic in it included).
	defer func() { release() }()
	// Read committed (pgtx.ReadCommitted): the transaction's reads see the
	// leaders' commits.
	err := pgx.BeginTxFunc(ctx, r.pool, pgtx.ReadCommitted, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, g.q["LockTimeout"], strconv.FormatInt(lockTimeout.Milliseconds(), 10)+"ms"); err != nil {
			return err
		}
		if err := g.lock(ctx, tx, name); err != nil {
			return err
		}
		gens, err := g.list(ctx, tx, name)
		if err != nil {
			return err
		}
		var next *Generation
		for i := range gens {
			if gens[i].Generation == to {
				next = &gens[i]
			}
		}
		if next == nil || next.State != GenerationBuilding {
			c.To = 0
			return nil
		}
		// Any runner role may write the rows: the views are made where
		// they say, as this role.
		if err := next.forged(g.schema, name); err != nil {
			return err
		}
		if next.Reader != bg.cfg.ReaderSchema {
			return errors.Wrapf(ErrForgedGeneration, "projection %q: generation %d names reader schema %q, not %q as "+
				"BlueGreen.ReaderSchema says: not cut over (a row annals did not write, or changed: see who wrote read_model_generations)",
				name, to, next.Reader, bg.cfg.ReaderSchema)
		}
		if l := live(gens); l != nil {
			if err := l.forged(g.schema, name); err != nil {
				return err
			}
		}
		// Another role may have made the schema the row names before this
		// runner did: readers would read what it owns.
		if err := g.owned(ctx, tx, name, *next); err != nil {
			return err
		}
		// Readers never go back a version by a cut-over: the generation is
		// set aside for good, so that nothing runs or retries it.
		if l, older := olderThanLive(gens, *next); older {
			if reason, err = g.abandon(ctx, tx, name, *next, l); err != nil {
				return err
			}
			stale, abandoned, c.From = &l, *next, l.Generation
			return nil
		}
		// A generation with unresolved dead letters lacks events: readers
		// never get a partial read model. (Looked at again below, once its
		// checkpoints are locked; here to spare the live one the wait.)
		if next.Unresolved > 0 {
			w, err := g.unresolved(ctx, tx, next.Subscriber)
			if err != nil {
				return err
			}
			return w.err(name, to)
		}
		old := live(gens)
		var from any
		var short error     // the catch-up's, cut off by its deadline
		var shortFrom int64 // where that catch-up started
		if old != nil {
			c.From = old.Generation
			var drained bool
			release, drained = leaderGates.hold(ctx, r.gateOf(old.Subscriber), lockTimeout)
			if !drained && ctx.Err() == nil {
				r.cfg.Logger.DebugContext(ctx, "annals: blue/green cut-over: a batch of the live generation in this process is still in flight; locking its checkpoints anyway",
					slog.String("projection", name), slog.Int("generation", old.Generation), slog.Duration("waited", lockTimeout))
			}
			if _, c.FromPosition, _, err = g.positions(ctx, tx, old.Subscriber, true); err != nil {
				return err
			}
			from = old.Schema
		}
		if catchUp != nil && old != nil {
			// The old generation is held at FromPosition: bring the new one
			// there (readers still read the old one), then lock it too.
			lo, _, _, err := g.positions(ctx, tx, next.Subscriber, false)
			if err != nil {
				return err
			}
			if lo < c.FromPosition {
				t := time.Now()
				cctx, cancel := context.WithTimeout(ctx, lockTimeout)
				err := catchUp(cctx, tx, lo, c.FromPosition)
				expired := cctx.Err() != nil && ctx.Err() == nil
				cancel()
				c.CatchUp = time.Since(t)
				switch {
				case err != nil && expired && !errors.Is(err, ErrCutoverBehind):
					// Cut off by the deadline, perhaps once there (a drive
					// that reached its target looks on for released dead
					// letters): the checkpoints, locked below, say.
					short, shortFrom = err, lo
				case err != nil:
					return err
				}
			}
		}
		lo, _, n, err := g.positions(ctx, tx, next.Subscriber, true)
		if err != nil {
			return err
		}
		c.ToPosition = lo
		if n < partitions || lo < c.FromPosition {
			if short != nil {
				return errors.Wrapf(ErrCutoverBehind, "%q: generation %d did not reach generation %d's position %d within %s "+
					"(BlueGreen.CutoverLockTimeout) from %d: %v", name, to, c.From, c.FromPosition, lockTimeout, shortFrom, short)
			}
			return errors.Wrapf(ErrCutoverBehind, "%q: generation %d is at %d (%d of %d partitions started), generation %d at %d",
				name, to, lo, n, partitions, c.From, c.FromPosition)
		}
		// Its checkpoints are locked: every event they passed was handled or
		// dead-lettered, and its dead letter committed.
		if w, err := g.unresolved(ctx, tx, next.Subscriber); err != nil || w.n > 0 {
			if err != nil {
				return err
			}
			return w.err(name, to)
		}
		if err := tx.QueryRow(ctx, g.q["SwapViews"], next.Reader, from, next.Schema).Scan(&c.Views); err != nil {
			return errors.Wrapf(err, "projection %q: point the views at generation %d", name, to)
		}
		if old != nil {
			reason := fmt.Sprintf("annals: generation %d retired by the cut-over to generation %d", old.Generation, to)
			if err := g.retire(ctx, tx, name, *old, reason); err != nil {
				return err
			}
		}
		var replaced *int
		if old != nil {
			replaced = &old.Generation
		}
		ms := float64(time.Since(start).Microseconds()) / 1000
		_, err = tx.Exec(ctx, g.q["MarkLive"], name, to, ms, c.ToPosition, replaced)
		return errors.Wrap(err, "projection: make the new generation live")
	})
	// Committed or rolled back: the old generation's leaders here go on
	// (fenced, if it went through).
	release()
	c.Duration = time.Since(start)
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && (pgErr.Code == "55P03" || pgErr.Code == "40P01") { // lock_not_available, deadlock
			return c, errors.Wrapf(ErrCutoverBehind, "%q: cut-over lock wait: %s", name, pgErr.Message)
		}
		return c, err
	}
	if stale != nil {
		r.logAbandoned(ctx, name, abandoned, *stale, reason)
		return c, errors.Wrapf(ErrCutoverOlderVersion, "%q: generation %d is version %d, and generation %d, live, is version %d: "+
			"generation %d was retired, not cut over", name, to, abandoned.Version, stale.Generation, stale.Version, to)
	}
	if c.To != 0 {
		r.cfg.Logger.InfoContext(ctx, "annals: read model cut over", slog.String("projection", name),
			slog.Int("from", c.From), slog.Int("to", c.To), slog.Int64("position", c.ToPosition),
			slog.Int("views", c.Views), slog.Duration("duration", c.Duration))
	}
	return c, nil
}

// RebuildBlueGreen rebuilds the blue/green projection name without
// downtime: it sets up a new generation of the read model for the
// registered BlueGreen.Version in a schema of its own (or continues one
// being built for that version: after a crash, from its checkpoints), takes
// its partitions' locks, replays the log into it from position 0 through the
// head in transactions of opts.BatchSize events while the live generation
// keeps being updated by its leaders, catches up again, and cuts over (see
// Cutover): readers move from the complete old read model to the complete
// new one in one transaction. The old generation is kept, stopped where
// readers last saw it, for Rollback until BlueGreen.Retention ends.
//
// It fails with ErrNotBlueGreen for a projection without Options.BlueGreen,
// and with ErrCutoverBehind when BlueGreen.CutoverAttempts attempts found
// the new generation behind (writers faster than the replay, or readers
// holding the views past CutoverLockTimeout): the new generation stays
// building, and a runner of this version (or the next call) continues it.
// Before each attempt it catches up outside the cut-over, again and again,
// until what is left would take at most half of CutoverLockTimeout at the
// pace it measured (or a round no longer shrinks it): the cut-over replays
// the rest while it holds the live generation, which is not updated
// meanwhile, within CutoverLockTimeout; a gap that would take longer at
// that pace fails the attempt at once. A cut-over whose COMMIT went
// through but whose answer was lost (the connection cut, or ctx ended,
// after it was sent) is reported as done, not as an error: the
// generation's state is read again when the cut-over fails.
// Like Rebuild, it holds the projection's rebuild lock (RebuildLockKey) for
// its whole run and fails at once with ErrRebuildRunning while another
// rebuild of the projection runs. A generation of the registered version
// (live or building) that was built with another partition layout than
// Options.Partitions and PartitionBy refuses it with a
// *catchup.PartitionLayoutError (catchup.ErrPartitionLayout), as it refuses
// Run: a blue/green read model changes its layout with a new
// BlueGreen.Version, and opts.NewLayout is refused.
//
// While the new generation has unresolved dead letters (its handlers
// failed on events; see ErrCutoverDeadLetters) it does not cut over: it
// waits, saying why in the log and in RebuildProgress.Waiting, and replays
// what is released meanwhile, until an operator retries (annals dlq retry)
// or skips (annals dlq skip) them on its subscriber <name>#g<N>, or ctx
// ends. A partition halted by the Stop policy waits the same way.
//
// With Config.ReadPool, the replay reads the events from the replica, up
// to the head the replica shows, and only what it has not replayed yet
// from the primary; the heads it replays through, the cut-over's checks
// and its catch-up inside the transaction stay on the primary (see
// "Blue/green read models" in the package doc).
func (r *Runner) RebuildBlueGreen(ctx context.Context, name string, opts *RebuildOptions) (_ Cutover, err error) {
	var o RebuildOptions
	if opts != nil {
		o = *opts
	}
	if err := nonNegative(fmt.Sprintf("projection: rebuild %q", name), opt("RebuildOptions.BatchSize", o.BatchSize),
		opt("RebuildOptions.LockTimeout", o.LockTimeout)); err != nil {
		return Cutover{}, err
	}
	if o.BatchSize == 0 {
		o.BatchSize = 5000
	}
	if o.LockTimeout == 0 {
		o.LockTimeout = time.Minute
	}
	reg, err := r.lookup(name)
	if err != nil {
		return Cutover{}, err
	}
	if reg.bg == nil {
		return Cutover{}, errors.Wrapf(ErrNotBlueGreen, "%q", name)
	}
	if o.NewLayout {
		return Cutover{}, errors.Newf("projection: rebuild %q: RebuildOptions.NewLayout does not apply: blue/green projections "+
			"change layout by raising BlueGreen.Version (to change Partitions or PartitionBy, register a new version: "+
			"its generation is built with the new layout beside the live one and cut over)", name)
	}
	bg := reg.bg
	g, err := newGenerations(r.cfg.Schema)
	if err != nil {
		return Cutover{}, err
	}
	// engine reads from the primary: the heads that decide when to try the
	// cut-over, and the catch-up inside it. With a ReadPool, the bulk of the
	// replay reads from the replica through rb.bulk (see drive).
	ecfg := catchup.Config{
		Schema: r.cfg.Schema, Owner: RebuildOwnerPrefix + r.cfg.InstanceID, RetryBackoff: r.cfg.RetryBackoff,
		ShutdownTimeout: r.cfg.ShutdownTimeout, Lock: r.cfg.Lock, Logger: r.cfg.Logger,
	}
	engine, err := catchup.NewEngine(r.pool, nil, &ecfg)
	if err != nil {
		return Cutover{}, err
	}
	rb := &rebuild{r: r, reg: reg, opts: o, engine: engine, log: r.cfg.Logger.With(slog.String("projection", name)),
		progress: RebuildProgress{Projection: name}}
	if r.cfg.ReadPool != nil {
		bcfg := ecfg
		bcfg.ReadPool = r.cfg.ReadPool
		// A batch read on a standby behind the head read on another one
		// waits this long, then the primary reads the rest (driveReplica).
		bcfg.ReadPoolWait = max(r.cfg.RetryBackoff, 100*time.Millisecond)
		if rb.bulk, err = catchup.NewEngine(r.pool, nil, &bcfg); err != nil {
			return Cutover{}, err
		}
	}
	if rb.cps, err = checkpoint.New(r.cfg.Schema); err != nil {
		return Cutover{}, err
	}
	if rb.q, err = sqltmpl.Named("rebuild.sql", rebuildSQL, sqltmpl.NewData(r.cfg.Schema)); err != nil {
		return Cutover{}, err
	}
	// Two builds of the projection (whatever their generations) would fence
	// each other's partitions halfway: the projection's rebuild lock, as
	// Rebuild takes it, lets one run and fails the other at once.
	ctx, stop, err := rb.lock(ctx)
	if err != nil {
		return Cutover{}, err
	}
	defer stop()
	defer func() { err = lockLost(ctx, err) }()
	// A generation of this version keeps the layout it was built with (Run
	// refuses another the same way): building one of the same version with
	// another layout would cut over to a generation that the instances of
	// this version still running the old layout are refused by.
	if err := r.checkGenerationLayouts(ctx, engine, g, reg); err != nil {
		return Cutover{}, err
	}
	// The generation to build: one building for this version, or a new one;
	// none while a newer version is live (it could never be cut over: one
	// building for this version is retired).
	var gen, newer Generation
	var retired []Generation
	var reasons []string
	err = pgx.BeginTxFunc(ctx, r.pool, pgtx.ReadCommitted, func(tx pgx.Tx) error {
		if err := g.lock(ctx, tx, name); err != nil {
			return err
		}
		gens, err := g.list(ctx, tx, name)
		if err != nil {
			return err
		}
		if l := live(gens); l != nil && l.Version > bg.cfg.Version {
			newer = *l
			for _, x := range gens {
				if _, stale := olderThanLive(gens, x); stale && x.Version == bg.cfg.Version {
					reason, err := g.abandon(ctx, tx, name, x, *l)
					if err != nil {
						return err
					}
					retired, reasons = append(retired, x), append(reasons, reason)
				}
			}
			return nil
		}
		for _, x := range gens {
			if x.State == GenerationBuilding && x.Version == bg.cfg.Version {
				gen = x
			}
		}
		if gen.Generation != 0 {
			return nil
		}
		gen, err = r.createGeneration(ctx, tx, g, name, bg, GenerationBuilding)
		return err
	})
	if err != nil {
		return Cutover{}, err
	}
	if newer.Generation != 0 {
		for i, x := range retired {
			r.logAbandoned(ctx, name, x, newer, reasons[i])
		}
		return Cutover{}, errors.Wrapf(ErrCutoverOlderVersion, "projection: blue/green rebuild %q: generation %d, live, is version %d, "+
			"newer than this runner's %d: a rebuild never moves readers back a version (projections rollback does, to the "+
			"generation the live one replaced; or deploy the older code under a newer BlueGreen.Version)",
			name, newer.Generation, newer.Version, bg.cfg.Version)
	}
	log := rb.log.With(slog.Int("generation", gen.Generation))
	rb.log = log
	subs, err := r.generationSubs(ctx, reg, g, gen, func(p catchup.Processor) catchup.Processor {
		return &countingProcessor{Processor: p, done: rb.advance}
	})
	if err != nil {
		return Cutover{}, err
	}
	for _, s := range subs {
		s.BatchSize = o.BatchSize
	}
	rb.subs = subs
	if err := rb.refuseConcurrent(ctx); err != nil {
		return Cutover{}, err
	}
	leases, err := rb.takeOver(ctx)
	defer func() {
		for _, l := range leases {
			engine.Release(context.WithoutCancel(ctx), l)
		}
	}()
	if err != nil {
		return Cutover{}, err
	}
	start := int64(-1)
	for _, l := range leases {
		if start < 0 || l.Start < start {
			start = l.Start
		}
	}
	head, err := engine.Head(ctx)
	if err != nil {
		return Cutover{}, err
	}
	// Progress counts from the generation's start: what its checkpoints
	// passed (a continued generation) is done already.
	starts := make([]int64, reg.opts.Partitions)
	for _, l := range leases {
		if l.Partition >= 0 && l.Partition < len(starts) {
			starts[l.Partition] = l.Start
		}
	}
	totals, done, err := rb.count(ctx, head, starts)
	if err != nil {
		return Cutover{}, err
	}
	for part, n := range totals {
		rb.progress.Total += n
		rb.progress.Done += done[part]
	}
	rb.base = rb.progress.Done
	rb.progress.Head = head
	rb.started = time.Now()
	log.InfoContext(ctx, "annals: blue/green rebuild: replaying", slog.Int64("from", start), slog.Int64("head", head), slog.String("schema", gen.Schema))
	var last error
	var pace replayPace
	lockTimeout := bg.cfg.CutoverLockTimeout
	for attempt := 1; attempt <= bg.cfg.CutoverAttempts; attempt++ {
		if attempt > 1 {
			if head, err = engine.Head(ctx); err != nil {
				return Cutover{}, err
			}
		}
		err := rb.settle(ctx, g, gen, subs, leases, head, bg.cfg.CheckInterval, &pace)
		if err == nil {
			err = rb.approach(ctx, subs, leases, &pace, lockTimeout/2)
		}
		if err != nil {
			if over := r.overtaken(ctx, g, name, gen); over != nil {
				return Cutover{}, errors.WithSecondaryError(over, err)
			}
			return Cutover{}, errors.Wrapf(err, "projection: blue/green rebuild %q: generation %d (it stays building; "+
				"running this again, or a runner of version %d, continues it)", name, gen.Generation, bg.cfg.Version)
		}
		// Within the cut-over, what was appended since approach looked is
		// replayed while the old generation is held, within
		// CutoverLockTimeout (a gap that would take longer at the pace
		// measured is not tried); its batches are not cut off by that
		// deadline (on the leases' lock sessions, that would lose the
		// locks): the catch-up stops between batches.
		rebuildCtx := ctx
		c, err := r.cutover(ctx, g, name, bg, gen.Generation, reg.opts.Partitions,
			func(ctx context.Context, _ pgx.Tx, from, target int64) error {
				gap := target - from
				if d, ok := pace.estimate(gap); ok && d > lockTimeout {
					return errors.Wrapf(ErrCutoverBehind, "%q: generation %d is %d positions behind, about %s of replay at its pace, "+
						"more than BlueGreen.CutoverLockTimeout (%s)", name, gen.Generation, gap, d.Round(time.Millisecond), lockTimeout)
				} else if !ok && gap > int64(o.BatchSize) {
					return errors.Wrapf(ErrCutoverBehind, "%q: generation %d is %d positions behind", name, gen.Generation, gap)
				}
				// From the primary, never the replica: target is the live
				// generation's position, which a lagging replica may not
				// show yet, and a drive waits for the replica to show it
				// while this transaction holds the live generation still
				// (it would reach the deadline, and every attempt with it).
				err := rb.driveAll(ctx, rebuildCtx, rb.engine, subs, leases, target, nil)
				if errors.Is(err, catchup.ErrStopped) {
					// A partition halted by the Stop policy: the checks on
					// the locked positions and dead letters that follow say
					// so (ErrCutoverBehind, ErrCutoverDeadLetters), and the
					// rebuild waits, as it does outside the transaction.
					return nil
				}
				return err
			})
		c.Attempts = attempt
		if err == nil {
			if c.To == 0 {
				// A runner of this version may have cut it over first.
				if gens, err := g.list(ctx, r.pool, name); err == nil {
					if x, ok := generationOf(gens, gen.Subscriber); ok && x.State == GenerationLive {
						rb.report(true)
						return Cutover{Projection: name, To: gen.Generation, Attempts: attempt}, nil
					}
				}
				if over := r.overtaken(ctx, g, name, gen); over != nil {
					return c, over
				}
				return c, errors.Newf("projection: blue/green rebuild %q: generation %d is no longer building (rolled back or cut over elsewhere)", name, gen.Generation)
			}
			rb.report(true)
			return c, nil
		}
		if errors.Is(err, ErrCutoverDeadLetters) {
			// Dead-lettered since settle looked: wait again; not an attempt.
			attempt--
			continue
		}
		if !errors.Is(err, ErrCutoverBehind) {
			if !errors.Is(err, ErrCutoverOlderVersion) && rb.wentLive(ctx, g, name, gen) {
				// The cut-over committed, but its answer was lost (the
				// connection cut, or ctx ended, after COMMIT was sent):
				// readers see the new generation. Failing would have the
				// caller build yet another one.
				log.WarnContext(ctx, "annals: blue/green rebuild: the cut-over's commit failed on the client, but the generation is live",
					slog.Int("from", c.From), telemetry.Err(err))
				rb.report(true)
				return c, nil
			}
			return c, err
		}
		last = err
		log.InfoContext(ctx, "annals: blue/green rebuild: behind at cut-over; catching up", slog.Int("attempt", attempt), telemetry.Err(err))
	}
	return Cutover{Projection: name, To: gen.Generation, Attempts: bg.cfg.CutoverAttempts},
		errors.Wrapf(last, "projection: blue/green rebuild %q: no cut-over after %d attempts", name, bg.cfg.CutoverAttempts)
}

// wentLive reports whether generation gen of name is live, read on a
// connection of its own (ctx may have ended): after a cut-over that failed,
// whether it committed all the same. It reads under the generations' lock,
// which the cut-over's transaction holds until it ends on the server: the
// client sees its connection cut before the server has run the COMMIT sent
// on it, and a read without the lock could find the state from before it
// (TestBlueGreenCutoverCommitLost failed so, now and then).
func (rb *rebuild) wentLive(ctx context.Context, g *generations, name string, gen Generation) bool {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	var live bool
	err := pgx.BeginTxFunc(ctx, rb.r.pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if err := g.lock(ctx, tx, name); err != nil {
			return err
		}
		gens, err := g.list(ctx, tx, name)
		if err != nil {
			return err
		}
		x, ok := generationOf(gens, gen.Subscriber)
		live = ok && x.State == GenerationLive
		return nil
	})
	return err == nil && live
}

// settle replays every partition of generation gen through head and,
// while the generation has unresolved dead letters (or a partition stopped
// by one, under the Stop policy), waits for an operator to resolve them
// (annals dlq retry or skip): every interval it replays what was released
// and appended meanwhile, and looks again. It says why it waits in the log
// (at once, when their number changes, and every minute) and in
// RebuildProgress.Waiting. It returns once the generation has none, or
// with an error (a partition stopped for another reason, ctx's end).
func (rb *rebuild) settle(ctx context.Context, g *generations, gen Generation, subs []*catchup.Subscription,
	leases []*catchup.Lease, head int64, interval time.Duration, pace *replayPace) error {
	var logged time.Time
	lastN := -1
	// stoppedClear counts the rounds in a row that found a partition
	// stopped but no dead letter: an operator's retry or skip between the
	// drive and the look resumes the partition, and the next drive finds it
	// running; only a stop that outlasts a second round is not a dead
	// letter's.
	stoppedClear := 0
	for {
		driven := rb.drive(ctx, subs, leases, head, pace)
		if driven != nil && !errors.Is(driven, catchup.ErrStopped) {
			return driven
		}
		w, err := g.unresolved(ctx, rb.r.pool, gen.Subscriber)
		if err != nil {
			return err
		}
		if w.n == 0 {
			if driven != nil {
				if stoppedClear++; stoppedClear < 2 {
					continue
				}
				return driven // stopped, and not by a dead letter of its own
			}
			if rb.wait("") {
				rb.log.InfoContext(ctx, "annals: blue/green rebuild: the dead letters are resolved; cutting over")
				rb.report(false)
			}
			return nil
		}
		stoppedClear = 0
		rb.wait(w.String())
		if w.n != lastN || time.Since(logged) >= time.Minute {
			lastN, logged = w.n, time.Now()
			rb.log.WarnContext(ctx, "annals: blue/green rebuild: the cut-over waits for the new generation's dead letters",
				slog.String("subscriber", gen.Subscriber), slog.Int("unresolved", w.n), slog.Int("released", w.released),
				slog.Int64("first_position", w.first), slog.String("why", w.String()))
			rb.report(false)
		}
		if err := sleepCtx(ctx, interval); err != nil {
			return errors.Wrapf(err, "waiting for %s", w)
		}
		if head, err = rb.engine.Head(ctx); err != nil {
			return err
		}
	}
}

// replayPace is how fast a blue/green rebuild's drives went through the
// log: the positions and the time of the last drive that covered some.
type replayPace struct {
	positions int64
	took      time.Duration
}

// estimate returns how long a drive through gap positions would take at
// the pace measured; ok is false while none was.
func (p *replayPace) estimate(gap int64) (d time.Duration, ok bool) {
	if p.positions <= 0 {
		return 0, false
	}
	// In float64, clamped: a conversion out of int64's range is undefined
	// (amd64 gives a negative duration, which would pass for a short one).
	f := float64(p.took) * float64(gap) / float64(p.positions)
	if f >= math.MaxInt64 {
		return time.Duration(math.MaxInt64), true
	}
	return time.Duration(f), true
}

// lowest returns the lowest start of leases (where the slowest partition
// is).
func lowest(leases []*catchup.Lease) int64 {
	lo := int64(-1)
	for _, l := range leases {
		if lo < 0 || l.Start < lo {
			lo = l.Start
		}
	}
	return max(lo, 0)
}

// drive replays every partition through head (read on the primary, by
// settle and approach), timed into pace: with a ReadPool, first from the
// replica through the head it shows (at most head), then from the primary
// through head, the rest that the replica had not replayed yet.
//
// The replica serves the bulk of the replay, never a decision: head, which
// says how far to go and when the cut-over may be tried, is the primary's,
// and so is everything the cut-over checks (the checkpoints it locks, the
// dead letters) and its own catch-up. A lagging replica shows a prefix of
// the log, and a drive through the head it shows does not wait for it
// (catchup.Engine.ReadHead; a standby behind the one that showed the head,
// at most catchup.Config.ReadPoolWait, see driveReplica): the events
// appended beyond it are read from the primary, so a replica far behind,
// or paused, does not hold the rebuild back (the primary reads more) and
// cannot make it stop short of head. Each partition's checkpoint is where both drives start
// (driveAll), so no event is replayed twice or skipped between them. The
// epochs (the fence), stop reasons and dead letters of each batch are read
// on the primary either way (catchup.Config.ReadPool).
//
// A partition that the replica's half leaves stopped by a dead letter (the
// Stop policy, catchup.ErrStopped) does not keep the others from the
// primary's half: it runs all the same, and finds the stopped partition
// stopped again (its stop reason is read on the primary).
func (rb *rebuild) drive(ctx context.Context, subs []*catchup.Subscription, leases []*catchup.Lease, head int64, pace *replayPace) error {
	from, t := lowest(leases), time.Now()
	err := rb.driveReplica(ctx, subs, leases, head)
	if err == nil || errors.Is(err, catchup.ErrStopped) {
		err = errors.Join(err, rb.driveAll(ctx, ctx, rb.engine, subs, leases, head, nil))
	}
	if err == nil && head > from {
		pace.positions, pace.took = head-from, time.Since(t)
	}
	return err
}

// errReplicaRead marks the failed read that ends the replica's half of a
// round (replay with rb.bulk).
var errReplicaRead = errors.New("projection: blue/green rebuild: reading from the read replica failed")

// driveReplica replays every partition from the replica (rb.bulk) through
// the head the replica shows, at most head; nothing without a ReadPool, or
// when the replica shows nothing past the slowest partition. The replica
// is never waited for nor read again within the round: a replica whose
// head cannot be read, or that fails a batch read (an error, or a standby
// that does not show what the head read on another one showed within
// catchup.Config.ReadPoolWait), leaves the rest of the round to the
// primary (logged), every partition from its committed checkpoint; the
// next round tries the replica again.
func (rb *rebuild) driveReplica(ctx context.Context, subs []*catchup.Subscription, leases []*catchup.Lease, head int64) error {
	if rb.bulk == nil {
		return nil
	}
	shown, err := rb.bulk.ReadHead(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return err
		}
		rb.log.WarnContext(ctx, "annals: blue/green rebuild: the read replica's head could not be read; replaying from the primary", telemetry.Err(err))
		return nil
	}
	through := min(shown, head)
	if through <= lowest(leases) {
		return nil
	}
	rctx, giveUp := context.WithCancelCause(ctx)
	defer giveUp(nil)
	if err := rb.driveAll(rctx, ctx, rb.bulk, subs, leases, through, giveUp); err != nil {
		return err
	}
	if cause := context.Cause(rctx); errors.Is(cause, errReplicaRead) {
		rb.log.WarnContext(ctx, "annals: blue/green rebuild: reading from the read replica failed; the primary replays the rest of the round",
			telemetry.Err(cause))
	}
	return ctx.Err()
}

// approach catches the new generation up with the head again and again,
// outside the cut-over, until what is left would take at most budget to
// replay at the pace of the last drive: the cut-over replays what is left
// while it holds the live generation (its leaders do not commit
// meanwhile), within BlueGreen.CutoverLockTimeout. A round that does not
// shrink what is left (writers as fast as the replay) ends it: the
// cut-over then tries with what is left. A partition stopped meanwhile (a
// dead letter) ends it too: the cut-over says so, and settle waits.
func (rb *rebuild) approach(ctx context.Context, subs []*catchup.Subscription, leases []*catchup.Lease, pace *replayPace, budget time.Duration) error {
	last := int64(-1)
	for {
		head, err := rb.engine.Head(ctx)
		if err != nil {
			return err
		}
		gap := head - lowest(leases)
		if gap <= 0 {
			return nil
		}
		if d, ok := pace.estimate(gap); ok && d <= budget {
			return nil
		}
		if last >= 0 && gap >= last {
			return nil
		}
		last = gap
		if err := rb.drive(ctx, subs, leases, head, pace); err != nil {
			if errors.Is(err, catchup.ErrStopped) {
				return nil
			}
			return err
		}
	}
}

// driveAll replays every partition through head with engine e,
// concurrently, its batches under procCtx (see replay). With giveUp (the
// replica's half of a round, driveReplica: ctx is giveUp's), a partition
// whose replay fails a read (errReplicaRead) cancels ctx with it, which
// ends the other partitions' replays between batches, and neither is an
// error: the primary's half replays the rest.
func (rb *rebuild) driveAll(ctx, procCtx context.Context, e *catchup.Engine, subs []*catchup.Subscription, leases []*catchup.Lease, head int64,
	giveUp context.CancelCauseFunc) error {
	errs := make([]error, len(subs))
	var wg sync.WaitGroup
	var mu sync.Mutex
	for i, s := range subs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := rb.replay(ctx, procCtx, e, s, leases[i], head)
			if giveUp != nil && err != nil && (errors.Is(err, errReplicaRead) || errors.Is(context.Cause(ctx), errReplicaRead)) {
				giveUp(err)
				err = nil
			}
			// The next drive starts where this one committed (Drive starts
			// at lease.Start): never replay an event twice. Also after a
			// drive cut short (the cut-over's catch-up deadline): it may have
			// committed batches.
			lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			lerr := leases[i].Do(lctx, func(conn *pgx.Conn) error {
				cp, err := rb.cps.Load(lctx, conn, s.Name, s.Partition)
				if err == nil {
					leases[i].Start = cp.Position
				}
				return err
			})
			cancel()
			if err == nil {
				err = lerr
			}
			mu.Lock()
			errs[i] = err
			mu.Unlock()
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Rollback makes the generation that the live one of the blue/green
// projection name replaced live again, in one transaction: the views point
// back at it, it resumes from its checkpoints (where it stopped at the
// cut-over; runners of its version catch it up), and the generation that
// was live is retired, stopped where it is. It needs no projection code:
// package projectioncmd and the annals CLI call it. It fails with
// ErrNoGenerations or ErrNoRollback and changes nothing.
//
// The generation it goes back to is the one the live generation's cut-over
// replaced (Generation.Replaced), if it is still kept (retired, not
// dropped); if it was dropped, Rollback fails with ErrNoRollback. After
// g1 → g2, a rollback to g1 and g3 built and cut over from g1, it goes back
// to g1, never to g2, which was rolled back from. A rollback leaves the
// Replaced of the generation it revives as it was, so rolling back again
// goes further down the chain of cut-overs (g1 back to what g1 replaced).
//
// A live generation that has no Replaced (cut over before migration 0030,
// or by an annals older than it) falls back to the earlier rule: the retired (not dropped)
// generation with the highest number below the live one's that was live
// once (not one retired before it went live: see ErrCutoverOlderVersion),
// whatever retired it, which after the sequence above is g2: look at
// ListGenerations first.
//
// A rollback is the one way readers go back to an older version: a
// cut-over never does (ErrCutoverOlderVersion).
//
// When db can begin a transaction with options (a pool, a connection), the
// rollback's transaction is READ COMMITTED whatever the session's
// default_transaction_isolation, so that it reads what a concurrent
// rollback or cut-over it waited for committed; in a transaction of the
// caller's (a pgx.Tx) it keeps the caller's isolation, which must be READ
// COMMITTED for that.
//
// Rollback is not idempotent: run again, it goes one step further down the
// chain. A caller that retries a rollback whose answer it did not get (the
// connection cut after COMMIT was sent) should use RollbackFrom with the
// generation it rolls back from.
func Rollback(ctx context.Context, db interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}, schema, name string) (Cutover, error) {
	return RollbackFrom(ctx, db, schema, name, 0)
}

// RollbackFrom is Rollback of generation from only: when from is not the
// live generation it fails with ErrNotLive, naming the live one, and
// changes nothing, so that a retry of a rollback that landed (its answer
// lost) does not roll back a second time. from 0 rolls back whichever
// generation is live, as Rollback does.
func RollbackFrom(ctx context.Context, db interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}, schema, name string, from int) (Cutover, error) {
	if from < 0 {
		return Cutover{}, errors.Newf("projection: rollback of %q from generation %d: want a generation number, or 0 for the live one", name, from)
	}
	g, err := newGenerations(schema)
	if err != nil {
		return Cutover{}, err
	}
	c := Cutover{Projection: name, Attempts: 1}
	start := time.Now()
	tx, err := beginGenerations(ctx, db)
	if err != nil {
		return c, errors.Wrap(err, "projection: rollback")
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := g.lock(ctx, tx, name); err != nil {
		return c, err
	}
	gens, err := g.list(ctx, tx, name)
	if err != nil {
		return c, err
	}
	cur := live(gens)
	if cur == nil {
		return c, errors.Wrapf(ErrNoGenerations, "%q has no live generation", name)
	}
	if from != 0 && cur.Generation != from {
		return c, errors.Wrapf(ErrNotLive, "%q: rollback from generation %d: generation %d is live; nothing changed (a rollback of %d landed already?)",
			name, from, cur.Generation, from)
	}
	var prev *Generation
	if cur.Replaced != nil {
		// The generation the live one's cut-over replaced, if kept.
		for i := range gens {
			if gens[i].Generation == *cur.Replaced {
				prev = &gens[i]
			}
		}
		if prev == nil || prev.State != GenerationRetired {
			state := "gone"
			if prev != nil {
				state = string(prev.State)
			}
			return c, errors.Wrapf(ErrNoRollback, "%q: generation %d is live and generation %d, which it replaced, is %s",
				name, cur.Generation, *cur.Replaced, state)
		}
	} else {
		// Cut over before the registry recorded what it replaced. A
		// generation retired before it went live (abandon) never served
		// readers: not one to go back to.
		for i := range gens {
			if gens[i].State == GenerationRetired && gens[i].Generation < cur.Generation && gens[i].LiveSince != nil {
				prev = &gens[i]
			}
		}
	}
	if prev == nil {
		return c, errors.Wrapf(ErrNoRollback, "%q: generation %d is live and no earlier one is kept", name, cur.Generation)
	}
	c.From, c.To = cur.Generation, prev.Generation
	// Any runner role may write the rows: the views are made where they
	// say, as this role. The reader schema is not derived from the name:
	// it must hold views annals made of either generation.
	for _, x := range []*Generation{cur, prev} {
		if err := x.forged(g.schema, name); err != nil {
			return c, err
		}
	}
	// The views are pointed at prev's schema: not at one another role made.
	if err := g.owned(ctx, tx, name, *prev); err != nil {
		return c, err
	}
	var views int
	if err := tx.QueryRow(ctx, g.q["ReaderViews"], prev.Reader, cur.Schema, prev.Schema).Scan(&views); err != nil {
		return c, errors.Wrapf(err, "projection %q: read the views of reader schema %q", name, prev.Reader)
	}
	if views == 0 {
		return c, errors.Wrapf(ErrForgedGeneration, "projection %q: generation %d names reader schema %q, which holds no view of "+
			"generation %d or %d: not rolled back (a row annals did not write, or changed: see who wrote read_model_generations)",
			name, prev.Generation, prev.Reader, cur.Generation, prev.Generation)
	}
	if _, c.FromPosition, _, err = g.positions(ctx, tx, cur.Subscriber, true); err != nil {
		return c, err
	}
	if c.ToPosition, _, _, err = g.positions(ctx, tx, prev.Subscriber, true); err != nil {
		return c, err
	}
	if err := tx.QueryRow(ctx, g.q["SwapViews"], prev.Reader, cur.Schema, prev.Schema).Scan(&c.Views); err != nil {
		return c, errors.Wrapf(err, "projection %q: point the views back at generation %d", name, prev.Generation)
	}
	reason := fmt.Sprintf("annals: generation %d retired by a rollback to generation %d", cur.Generation, prev.Generation)
	if err := g.retire(ctx, tx, name, *cur, reason); err != nil {
		return c, errors.Wrap(err, "projection: rollback")
	}
	if _, err := tx.Exec(ctx, g.q["ReviveCheckpoints"], prev.Subscriber); err != nil {
		return c, errors.Wrap(err, "projection: rollback: resume the previous generation")
	}
	ms := float64(time.Since(start).Microseconds()) / 1000
	if _, err := tx.Exec(ctx, g.q["MarkLiveAgain"], name, prev.Generation, ms, c.ToPosition); err != nil {
		return c, errors.Wrap(err, "projection: rollback")
	}
	if err := tx.Commit(ctx); err != nil {
		return c, errors.Wrap(err, "projection: rollback: commit")
	}
	c.Duration = time.Since(start)
	return c, nil
}

// ListGenerations returns the generations of the blue/green projection name
// (none for a projection that has none), oldest first.
func ListGenerations(ctx context.Context, db checkpoint.DB, schema, name string) ([]Generation, error) {
	g, err := newGenerations(schema)
	if err != nil {
		return nil, err
	}
	return g.list(ctx, db, name)
}

// DropRetired drops the schemas of the retired generations of name that
// were retired more than olderThan ago (0: all of them), each in a
// transaction under the generations lock, and marks them dropped. It
// returns the generations dropped. Runners do it by themselves after
// BlueGreen.Retention. A generation whose row names another schema than
// annals could have given it (rm_<name>_g<N>, or rm_<name>_g<N>_<tag>: see
// Generation.Schema) is an error
// (ErrForgedGeneration), and so is one whose schema objects of other
// schemas depend on (ErrGenerationInUse: the reader schema's views of a
// live generation another role marked retired, say); it and the ones after
// it are left as they are: any runner role may write the rows, and the
// drop (CASCADE) runs as this one. Its transactions are READ COMMITTED,
// as Rollback's are.
func DropRetired(ctx context.Context, db interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}, schema, name string, olderThan time.Duration) ([]int, error) {
	g, err := newGenerations(schema)
	if err != nil {
		return nil, err
	}
	var dropped []int
	for {
		tx, err := beginGenerations(ctx, db)
		if err != nil {
			return dropped, errors.Wrap(err, "projection: drop retired generations")
		}
		gen, err := func() (int, error) {
			defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
			if err := g.lock(ctx, tx, name); err != nil {
				return 0, err
			}
			var (
				gen    int
				schema string
			)
			err := tx.QueryRow(ctx, g.q["Expired"], name, max(olderThan, 0).Microseconds()).Scan(&gen, &schema)
			if errors.Is(err, pgx.ErrNoRows) {
				return 0, nil
			}
			if err != nil {
				return 0, errors.Wrapf(err, "projection %q: find retired generations", name)
			}
			// Every runner role may write read_model_generations: a row
			// naming another schema than annals gave the generation would
			// have this role drop that schema, whatever it holds.
			if err := forgedSchema(g.schema, name, gen, schema); err != nil {
				return 0, errors.Wrapf(err, "retired generation %d: not dropped", gen)
			}
			// Nor would a row naming the live generation's own schema,
			// marked retired by another runner role: the rows cannot tell
			// (that role may write every one of them, a live one included,
			// and make any generation look retired, newest or not, live or
			// not), the catalog can. Readers read a generation through the
			// reader schema's views, which depend on its tables (pg_depend),
			// and no runner role can drop or make another role's views; a
			// retired generation has none (its cut-over or rollback swapped
			// them away). Whatever else of another schema depends on it (a
			// view, a foreign key …) DROP ... CASCADE would drop as well.
			var deps int
			if err := tx.QueryRow(ctx, g.q["Dependents"], schema).Scan(&deps); err != nil {
				return 0, errors.Wrapf(err, "projection %q: read what depends on schema %q", name, schema)
			}
			if deps > 0 {
				return 0, errors.Wrapf(ErrGenerationInUse, "projection %q: retired generation %d's schema %q has %d object(s) "+
					"of other schemas depending on it (the reader schema's views: it is the one readers read?): not dropped "+
					"(see who wrote read_model_generations, and ListGenerations)", name, gen, schema, deps)
			}
			if _, err := tx.Exec(ctx, g.q["DropSchema"], name, gen); err != nil {
				return 0, errors.Wrapf(err, "projection %q: drop generation %d", name, gen)
			}
			if _, err := tx.Exec(ctx, g.q["MarkDropped"], name, gen); err != nil {
				return 0, errors.Wrapf(err, "projection %q: drop generation %d", name, gen)
			}
			return gen, errors.Wrap(tx.Commit(ctx), "projection: drop a retired generation: commit")
		}()
		if err != nil || gen == 0 {
			return dropped, err
		}
		dropped = append(dropped, gen)
	}
}
