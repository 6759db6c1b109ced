package console

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"slices"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/internal/sqltmpl"
)

// lagCountLimit bounds the exact count of lagging events per partition;
// beyond it the lag shown is head - position (an upper bound).
const lagCountLimit = 10_000

// Partition is one subscriber partition as the console shows it.
type Partition struct {
	Subscriber  string
	Partition   int
	Position    int64
	Epoch       int64
	Owner       string
	UpdatedAt   time.Time
	LagEvents   int64
	LagExact    bool
	LagSeconds  float64
	Leader      string
	Stopped     string
	StoppedAt   *time.Time
	DeadLetters int64
}

// State is running (a live instance leads it), stopped (halted by the Stop
// policy) or standing by (no live leader).
func (p Partition) State() string {
	switch {
	case p.Stopped != "":
		return "stopped"
	case p.Leader != "":
		return "running"
	}
	return "standing by"
}

// Instance is a runner instance.
type Instance struct {
	ID, Host     string
	PID          int
	StartedAt    time.Time
	LastBeat     time.Time
	Leads        []Lead
	Live         bool
	HeartbeatAge float64
}

// Lead is a subscriber partition an instance leads.
type Lead struct {
	Subscriber string `json:"subscriber"`
	Partition  int    `json:"partition"`
	Epoch      int64  `json:"epoch"`
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
	pool  *pgxpool.Pool
	q     map[string]string
	stale time.Duration
	log   *slog.Logger
}

func newReader(pool *pgxpool.Pool, schema string, stale time.Duration) (*reader, error) {
	q, err := sqltmpl.Named("queries.sql", queriesSQL, sqltmpl.NewData(schema))
	if err != nil {
		return nil, err
	}
	return &reader{pool: pool, q: q, stale: stale, log: slog.New(slog.NewTextHandler(io.Discard, nil))}, nil
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
// not nil).
func (c *reader) partitions(ctx context.Context, db queryer, head int64, sub *string) ([]Partition, error) {
	rows, err := db.Query(ctx, c.q["Subscribers"], c.stale.Microseconds(), lagCountLimit, sub)
	if err != nil {
		return nil, errors.Wrap(err, "read the checkpoints")
	}
	var out []Partition
	var p Partition
	var counted int64
	_, err = pgx.ForEachRow(rows, []any{&p.Subscriber, &p.Partition, &p.Position, &p.Epoch, &p.Owner, &p.UpdatedAt,
		&counted, &p.LagSeconds, &p.Leader, &p.Stopped, &p.StoppedAt, &p.DeadLetters}, func() error {
		p.LagEvents, p.LagExact = counted, true
		if counted > lagCountLimit {
			p.LagEvents, p.LagExact = max(head-p.Position, counted), false
		}
		out = append(out, p)
		p = Partition{}
		return nil
	})
	return out, errors.Wrap(err, "read the checkpoints")
}

func (c *reader) instanceList(ctx context.Context, db queryer) ([]Instance, error) {
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
