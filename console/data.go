package console

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/internal/leadership"
	"github.com/annals-dev/annals/internal/lockkey"
	"github.com/annals-dev/annals/internal/sqltmpl"
	"github.com/annals-dev/annals/internal/standby"
	"github.com/annals-dev/annals/projection"
)

// lagCountLimit bounds the exact count of lagging events per partition;
// beyond it the lag shown is head - position (an upper bound).
const lagCountLimit = 10_000

// Partition is one subscriber partition as the console shows it.
type Partition struct {
	Subscriber string
	Partition  int
	Position   int64
	Epoch      int64
	// Owner is the instance that claimed Epoch ("": none, as after an
	// operator's checkpoint set).
	Owner      string
	UpdatedAt  time.Time
	LagEvents  int64
	LagExact   bool
	LagSeconds float64
	// Leader is who leads the partition, by the rule of `annals status`
	// (package internal/leadership): the advisory lock, read live, has
	// the last word. "" when the lock is free (nobody leads, whatever a
	// heartbeat still lists) or held by a session nothing names.
	// LeaderEpoch is the epoch it leads at (nil: unknown).
	Leader      string
	LeaderEpoch *int64
	// LeaderStale reports a Leader that is a registered instance whose
	// heartbeat is stale: a hung process whose session still holds the
	// lock.
	LeaderStale bool
	// NoLiveInstance reports a lock held by a session that no live
	// instance's heartbeat lists (leadership.Unlisted), as `annals status`
	// says it (no_live_instance), when the holder is no registered
	// instance: a runner that died and left its lock on a pooler's server
	// session, a psql session, or a job that leads without heartbeats
	// (RunUntilCaughtUp, annals tail --subscriber). Leader then names the
	// checkpoint's last claimant, which may be gone; unless such a job
	// holds it, nobody processes the partition. It is false for a rebuild
	// (its owner is rebuild:..., and it leads without heartbeats), for a
	// registered instance with a stale heartbeat (LeaderStale says that),
	// and for one with a fresh heartbeat that has claimed the checkpoint
	// before its next heartbeat lists the partition (a takeover).
	NoLiveInstance bool
	// HeartbeatLeader is the live instance whose heartbeat lists the
	// partition, preferring one at Epoch, whether or not it holds the lock
	// ("": none); HeartbeatEpoch the epoch it lists.
	HeartbeatLeader string
	HeartbeatEpoch  *int64
	// LockHeld reports whether a session holds the partition's advisory
	// lock, LockPID its backend pid.
	LockHeld    bool
	LockPID     int32
	Stopped     string
	StoppedAt   *time.Time
	DeadLetters int64
	// Generation is set when the subscriber is a generation of a blue/green
	// read model (<read model>#g<N>, from read_model_generations; nil too
	// when the console's role may not read that table).
	Generation *Generation
	// Kind is the kind of subscriber the runner recorded for the name
	// (subscriber_layouts.kind, migration 0044: projection, observer,
	// saga, processor, relay, tail), as `annals status` reads it; "" when
	// unknown: a name only runners from before 0044 ran, a blue/green
	// generation, a schema before 0044, or a role that may not read
	// subscriber_layouts.
	Kind string
}

// KindText is the Kind column, as `annals status` prints it: the kind, or
// "-" when unknown.
func (p Partition) KindText() string {
	if p.Kind == "" {
		return "-"
	}
	return p.Kind
}

// Generation says which blue/green generation a subscriber runs, as
// `annals status` shows it.
type Generation struct {
	// ReadModel is the blue/green read model (the registered projection's
	// name).
	ReadModel string
	// Generation is its number.
	Generation int
	// State is building, live or retired.
	State string
}

// Retired reports a partition of a retired blue/green generation: a
// cut-over replaced it and it is kept for a rollback until it is dropped.
// Nothing runs it, so its stop (the cut-over's), its missing leader and its
// growing lag are expected: the console shows it as retired, and neither
// readiness nor annals_subscriber_led and the lag series judge it.
func (p Partition) Retired() bool { return p.Generation != nil && p.Generation.State == "retired" }

// State is retired (a retired blue/green generation nobody leads: see
// Retired), running (a live instance leads it), stopped (halted by the Stop
// policy), leader stale (its leader's session holds the lock but its
// heartbeat is stale: a hung process), no live instance (a session holds
// the lock that no live instance lists: see NoLiveInstance) or standing by
// (nobody leads).
func (p Partition) State() string {
	switch {
	case p.Retired() && !p.LockHeld:
		return "retired"
	case p.Stopped != "":
		return "stopped"
	case p.Leader != "" && p.LeaderStale:
		return "leader stale"
	case p.NoLiveInstance:
		return "no live instance"
	case p.Leader != "":
		return "running"
	}
	return "standing by"
}

// GenerationNote says, for a partition of a blue/green generation that is
// building or live, which generation of which read model it is and what
// that means, as `annals status` says it under its table ("" for any other
// partition; a retired one's LeaderText says it). A building generation
// catches up from the start of the log, so its lag is expected: its
// led, stopped and lag series stay, and annals_read_model_generation
// (state "building") lets an alert leave it out.
func (p Partition) GenerationNote() string {
	g := p.Generation
	if g == nil {
		return ""
	}
	switch g.State {
	case "building":
		return fmt.Sprintf("generation %d of %s: being built; readers get it at the cut-over", g.Generation, g.ReadModel)
	case "live":
		return fmt.Sprintf("generation %d of %s: serves the readers", g.Generation, g.ReadModel)
	}
	return ""
}

// LeaderText is the Leader column, as `annals status` words it: the
// leader (with the epoch it leads at when that is not the checkpoint's;
// "OWNER (lock held by backend PID, no live instance)" when no live
// instance holds its lock: NoLiveInstance), or "none" with why: whose lock
// is free, the last owner, or the backend holding the lock; for a retired
// blue/green generation whose lock is free, "retired (generation N of
// <read model>)".
func (p Partition) LeaderText() string {
	switch {
	case p.Retired() && !p.LockHeld:
		return fmt.Sprintf("retired (generation %d of %s)", p.Generation.Generation, p.Generation.ReadModel)
	case p.Leader != "" && p.LeaderEpoch != nil && *p.LeaderEpoch != p.Epoch:
		return fmt.Sprintf("%s (at epoch %d)", p.Leader, *p.LeaderEpoch)
	case p.Leader != "" && p.NoLiveInstance:
		return fmt.Sprintf("%s (lock held by backend %d, no live instance)", p.Leader, p.LockPID)
	case p.Leader != "":
		return p.Leader
	case p.NoLiveInstance:
		return fmt.Sprintf("none (lock held by backend %d, no live instance)", p.LockPID)
	case p.LockHeld:
		return fmt.Sprintf("none (lock held by backend %d)", p.LockPID)
	case p.HeartbeatLeader != "":
		return fmt.Sprintf("none (%s's lock is free)", p.HeartbeatLeader)
	case p.Owner != "":
		return fmt.Sprintf("none (last: %s)", p.Owner)
	}
	return "none"
}

// NoLiveInstanceNote says, for a partition whose lock a session holds that
// no live instance lists (NoLiveInstance), which backend holds it, what
// that means and how to free it, as `annals status` says it on its NO LIVE
// INSTANCE line ("" for any other partition).
func (p Partition) NoLiveInstanceNote() string {
	if !p.NoLiveInstance {
		return ""
	}
	return fmt.Sprintf("Lock held by %s, which no live instance lists in its heartbeat. "+
		"Unless a catch-up (Runner.RunUntilCaughtUp) or 'annals tail --subscriber' holds it, nobody processes the partition: "+
		"a session left holding the lock (a pooler's server session, a psql session). "+
		"Ending it frees the partition: SELECT pg_terminate_backend(%d); behind PgBouncer, RECONNECT on its admin console",
		p.heldBy(), p.LockPID)
}

// heldBy is "backend PID", the session holding the lock, with the
// checkpoint's last claimant when there is one.
func (p Partition) heldBy() string {
	s := fmt.Sprintf("backend %d", p.LockPID)
	if p.Owner != "" {
		s += " (last claimed by " + p.Owner + ")"
	}
	return s
}

// Instance is a runner instance.
type Instance struct {
	ID, Host  string
	PID       int
	StartedAt time.Time
	LastBeat  time.Time
	// Leads are the partitions its heartbeat lists; Leading those of them
	// it leads (by Partition.Leader, or with no checkpoint to say
	// otherwise), NotLeading the others.
	Leads      []Lead
	Leading    []Lead
	NotLeading []Lead
	// State is live, lost (a fresh heartbeat, but it leads none of the
	// partitions it lists: killed a moment ago, or its session dropped) or
	// stale (its heartbeat is older than the staleness threshold); Live
	// is State == "live".
	State        string
	Live         bool
	HeartbeatAge float64
}

// Lead is a subscriber partition an instance lists.
type Lead struct {
	Subscriber string `json:"subscriber"`
	Partition  int    `json:"partition"`
	Epoch      int64  `json:"epoch"`
	// LedBy is the partition's leader ("": nobody).
	LedBy string `json:"-"`
}

// Event is one event of the log, its data and metadata perhaps cut short:
// a page of many events reads the first listChars characters of each, an
// event's own page the first eventChars.
type Event struct {
	Position int64
	ID       uuid.UUID
	Stream   string
	Version  int64
	Type     string
	// Data and Metadata are the JSON text as stored ("" for no metadata),
	// or its first characters when DataBytes or MetadataBytes is more than
	// their length.
	Data          string
	DataBytes     int64
	Metadata      string
	MetadataBytes int64
	RecordedAt    time.Time
}

// DataCut reports whether Data is only the start of the event's data.
func (e Event) DataCut() bool { return int64(len(e.Data)) < e.DataBytes }

// MetadataCut reports whether Metadata is only the start of the metadata.
func (e Event) MetadataCut() bool { return int64(len(e.Metadata)) < e.MetadataBytes }

// What a read of events carries of each event's data and metadata, in
// characters: a page of the log or of a stream (50 events) and a live
// follow cut them to listChars, so that big events (up to 64 MiB each) make
// neither a page nor the console's memory big; an event's page shows up to
// eventChars, and /events/{pos}/data and /metadata serve them whole.
const (
	listChars  = 2000
	eventChars = 1 << 20
)

// reader holds what the console's pages, its metrics and its health checks
// read the database with.
type reader struct {
	pool   *pgxpool.Pool
	q      map[string]string
	schema string
	stale  time.Duration
	log    *slog.Logger
}

func newReader(pool *pgxpool.Pool, schema string, stale time.Duration) (*reader, error) {
	q, err := sqltmpl.Named("queries.sql", queriesSQL, sqltmpl.NewData(schema))
	if err != nil {
		return nil, err
	}
	return &reader{pool: pool, q: q, schema: schema, stale: stale, log: slog.New(slog.NewTextHandler(io.Discard, nil))}, nil
}

type queryer interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func (c *reader) head(ctx context.Context, db queryer) (int64, time.Time, error) {
	var head int64
	var now time.Time
	err := db.QueryRow(ctx, c.q["Head"]).Scan(&head, &now)
	return head, now, errors.Wrap(err, "read the head")
}

// partitions reads the subscriber partitions (of one subscriber when sub is
// not nil) with their leaders.
func (c *reader) partitions(ctx context.Context, db queryer, head int64, sub *string) ([]Partition, error) {
	parts, _, err := c.leadership(ctx, db, head, sub, lagCountLimit)
	return parts, err
}

// leadership reads the subscriber partitions (of one subscriber when sub is
// not nil), counting up to lagLimit lagging events of each, and the runner
// instances, and decides who leads each partition and each instance's
// state by package leadership's rule, as `annals status` does. The
// instances are nil when sub is not nil (what they lead of other
// subscribers is not read).
func (c *reader) leadership(ctx context.Context, db queryer, head int64, sub *string, lagLimit int64) ([]Partition, []Instance, error) {
	rows, err := db.Query(ctx, c.q["Subscribers"], c.stale.Microseconds(), lagLimit, sub)
	if err != nil {
		return nil, nil, errors.Wrap(err, "read the checkpoints")
	}
	var parts []Partition
	var p Partition
	var counted int64
	_, err = pgx.ForEachRow(rows, []any{&p.Subscriber, &p.Partition, &p.Position, &p.Epoch, &p.Owner, &p.UpdatedAt,
		&counted, &p.LagSeconds, &p.HeartbeatLeader, &p.HeartbeatEpoch, &p.Stopped, &p.StoppedAt, &p.DeadLetters}, func() error {
		p.LagEvents, p.LagExact = counted, true
		if counted > lagLimit {
			p.LagEvents, p.LagExact = max(head-p.Position, counted), false
		}
		parts = append(parts, p)
		p = Partition{} // the pointers must not be shared
		return nil
	})
	if err != nil {
		return nil, nil, errors.Wrap(err, "read the checkpoints")
	}
	if err := c.readLocks(ctx, db, parts); err != nil {
		return nil, nil, err
	}
	if err := c.readGenerations(ctx, db, parts, sub); err != nil {
		return nil, nil, err
	}
	if err := c.readKinds(ctx, db, parts, sub); err != nil {
		return nil, nil, err
	}
	ins, err := c.instanceRows(ctx, db)
	if err != nil {
		return nil, nil, err
	}
	fresh := make(map[string]bool, len(ins))
	for _, in := range ins {
		fresh[in.ID] = in.Live
	}
	type key struct {
		sub  string
		part int
	}
	leaders := make(map[key]string, len(parts))
	for i := range parts {
		p := &parts[i]
		facts := leadership.Facts{Epoch: p.Epoch, Owner: p.Owner, LockHeld: p.LockHeld,
			HeartbeatLeader: p.HeartbeatLeader, HeartbeatEpoch: p.HeartbeatEpoch}
		p.Leader, p.LeaderEpoch = leadership.Leader(facts)
		f, registered := fresh[p.Leader]
		p.LeaderStale = p.Leader != "" && registered && !f
		// A registered instance holding the lock is stale (LeaderStale) or
		// has just taken the partition over, before its next heartbeat
		// lists it; a rebuild leads without heartbeats.
		p.NoLiveInstance = leadership.Unlisted(facts) && !(p.Leader != "" && registered) &&
			!strings.HasPrefix(p.Owner, projection.RebuildOwnerPrefix)
		leaders[key{p.Subscriber, p.Partition}] = p.Leader
	}
	if sub != nil {
		return parts, nil, nil
	}
	for i := range ins {
		in := &ins[i]
		for _, l := range in.Leads {
			leader, known := leaders[key{l.Subscriber, l.Partition}]
			if !known {
				leader = in.ID // no checkpoint to say otherwise
			}
			l.LedBy = leader
			if leader == in.ID {
				in.Leading = append(in.Leading, l)
			} else {
				in.NotLeading = append(in.NotLeading, l)
			}
		}
		in.State = leadership.State(in.Live, len(in.Leads), len(in.Leading))
		in.Live = in.State == leadership.Live
	}
	return parts, ins, nil
}

// readLocks fills in which partitions' advisory locks a session holds, and
// its backend pid.
func (c *reader) readLocks(ctx context.Context, db queryer, parts []Partition) error {
	if len(parts) == 0 {
		return nil
	}
	k1, k2 := make([]int32, len(parts)), make([]int32, len(parts))
	for i, p := range parts {
		k1[i], k2[i] = lockkey.Pair(catchup.LockKey(c.schema, p.Subscriber, p.Partition))
	}
	locks, err := leadership.LockStates(ctx, db, k1, k2)
	if err != nil {
		return err
	}
	for i, l := range locks {
		parts[i].LockHeld, parts[i].LockPID = l.Held, l.PID
	}
	return nil
}

// readGenerations fills in the blue/green generations of the partitions
// (of subscriber sub when it is not nil), as `annals status` does: none when
// the role may not read read_model_generations.
func (c *reader) readGenerations(ctx context.Context, db queryer, parts []Partition, sub *string) error {
	if len(parts) == 0 {
		return nil
	}
	var can bool
	if err := db.QueryRow(ctx, c.q["CanReadGenerations"], c.schema).Scan(&can); err != nil || !can {
		return errors.Wrap(err, "read the blue/green generations")
	}
	rows, err := db.Query(ctx, c.q["Generations"], sub)
	if err != nil {
		return errors.Wrap(err, "read the blue/green generations")
	}
	gens := map[string]*Generation{}
	var (
		s string
		g Generation
	)
	_, err = pgx.ForEachRow(rows, []any{&s, &g.ReadModel, &g.Generation, &g.State}, func() error {
		x := g
		gens[s] = &x
		return nil
	})
	if err != nil {
		return errors.Wrap(err, "read the blue/green generations")
	}
	for i := range parts {
		parts[i].Generation = gens[parts[i].Subscriber]
	}
	return nil
}

// readKinds fills in the kinds the runner recorded for the partitions
// subscribers (of subscriber sub when it is not nil), as `annals status`
// does: none when the role may not read subscriber_layouts, or the schema
// predates migration 0044.
func (c *reader) readKinds(ctx context.Context, db queryer, parts []Partition, sub *string) error {
	if len(parts) == 0 {
		return nil
	}
	var can bool
	if err := db.QueryRow(ctx, c.q["CanReadKinds"], c.schema).Scan(&can); err != nil || !can {
		return errors.Wrap(err, "read the subscriber kinds")
	}
	rows, err := db.Query(ctx, c.q["Kinds"], sub)
	if err != nil {
		return errors.Wrap(err, "read the subscriber kinds")
	}
	kinds := map[string]string{}
	var s, kind string
	if _, err := pgx.ForEachRow(rows, []any{&s, &kind}, func() error {
		kinds[s] = kind
		return nil
	}); err != nil {
		return errors.Wrap(err, "read the subscriber kinds")
	}
	for i := range parts {
		parts[i].Kind = kinds[parts[i].Subscriber]
	}
	return nil
}

// Standby is a physical standby streaming from the server, as `annals
// status` lists it (package standby reads it for both). Its details are
// nil for a role without pg_read_all_stats (Hidden).
type Standby = standby.Standby

// instanceList reads the runner instances with their states (see
// leadership).
func (c *reader) instanceList(ctx context.Context, db queryer) ([]Instance, error) {
	_, ins, err := c.leadership(ctx, db, 0, nil, 0)
	return ins, err
}

// instanceRows reads the runner instances as stored: Live is whether the
// heartbeat is fresh.
func (c *reader) instanceRows(ctx context.Context, db queryer) ([]Instance, error) {
	rows, err := db.Query(ctx, c.q["Instances"], c.stale.Microseconds())
	if err != nil {
		return nil, errors.Wrap(err, "read the instances")
	}
	var out []Instance
	var in Instance
	var leads []byte
	_, err = pgx.ForEachRow(rows, []any{&in.ID, &in.Host, &in.PID, &in.StartedAt, &in.LastBeat, &leads, &in.Live, &in.HeartbeatAge}, func() error {
		in.Leads = nil
		_ = json.Unmarshal(leads, &in.Leads) // a malformed leads column shows as none
		out = append(out, in)
		return nil
	})
	return out, errors.Wrap(err, "read the instances")
}

// deadLetterCounts returns subscriber → status → count.
func (c *reader) deadLetterCounts(ctx context.Context, db queryer) (map[string]map[string]int64, error) {
	rows, err := db.Query(ctx, c.q["DeadLetterCounts"])
	if err != nil {
		return nil, errors.Wrap(err, "count the dead letters")
	}
	out := map[string]map[string]int64{}
	var sub, status string
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&sub, &status, &n}, func() error {
		if out[sub] == nil {
			out[sub] = map[string]int64{}
		}
		out[sub][status] = n
		return nil
	})
	return out, errors.Wrap(err, "count the dead letters")
}

func scanEvents(rows pgx.Rows, err error) ([]Event, error) {
	if err != nil {
		return nil, errors.Wrap(err, "read events")
	}
	var out []Event
	var e Event
	_, err = pgx.ForEachRow(rows, []any{&e.Position, &e.ID, &e.Stream, &e.Version, &e.Type, &e.Data, &e.DataBytes, &e.Metadata, &e.MetadataBytes, &e.RecordedAt}, func() error {
		out = append(out, e)
		return nil
	})
	return out, errors.Wrap(err, "read events")
}

// readOnlyTx runs fn in a read-only REPEATABLE READ transaction, so that a
// page's several reads see one snapshot.
func (c *reader) readOnlyTx(ctx context.Context, fn func(pgx.Tx) error) error {
	return pgx.BeginTxFunc(ctx, c.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, fn)
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
