package walsource

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/poolconn"
	"github.com/annals-dev/annals/internal/schemaname"
	"github.com/annals-dev/annals/internal/telemetry"
)

// Commit is one committed transaction that appended events, as decoded from
// the WAL.
type Commit struct {
	// LSN is the end of the transaction in the WAL: the position a consumer
	// confirms once it has checkpointed Last.
	LSN pglogrepl.LSN
	// Events are the transaction's events in position order.
	Events []eventstore.Event
	// Last is the position of the last event.
	Last int64
}

// Config configures a Source. A nil *Config is invalid: Slot is required.
type Config struct {
	// Schema is the annals schema. Defaults to "annals".
	Schema string
	// Slot is the replication slot (see SlotName); created if missing.
	// Required.
	Slot string
	// Confirmed returns the position through which the consumer's checkpoint
	// has committed. The Source confirms (flushes) the slot only through the
	// end of the last transaction whose events are all at or below it, so
	// the slot keeps everything the consumer has not durably processed.
	// Defaults to nil: each transaction is confirmed once OnCommit returned
	// (for a consumer that only needs wake-ups).
	Confirmed func(ctx context.Context) (int64, error)
	// OnCommit receives each transaction that appended events, in commit
	// order (a transaction the slot re-sends after a reconnect is received
	// again: consumers skip positions they have). Required.
	OnCommit func(Commit)
	// OnStreaming is called each time streaming starts (after every
	// reconnect) and with false when it stops. Defaults to nothing.
	OnStreaming func(streaming bool)
	// StatusInterval is how often the Source asks Confirmed and sends a
	// standby status update. Defaults to 500ms.
	StatusInterval time.Duration
	// Logger receives reconnects, the re-creation of an invalidated slot,
	// and a permanent failure (see Run). Defaults to warnings and errors on
	// slog.Default() (information and debug records dropped).
	Logger *slog.Logger
}

// Source streams the events table's inserts from a logical replication slot
// (pgoutput) and confirms them as the consumer checkpoints.
type Source struct {
	pool        *pgxpool.Pool
	cfg         Config
	schema      string
	publication string

	decoded    atomic.Int64
	reconnects atomic.Int64
	statuses   atomic.Int64

	mu      sync.Mutex
	pending []Commit // received, not yet confirmed (Events dropped)
	flushed pglogrepl.LSN
}

// New returns a Source whose replication connections are made from pool's
// connection config (the role needs the REPLICATION attribute) and whose
// other statements (publication, slot, Confirmed) run on pool.
func New(pool *pgxpool.Pool, cfg *Config) (*Source, error) {
	if pool == nil {
		return nil, errors.New("walsource: pool is nil")
	}
	if cfg == nil || cfg.Slot == "" || cfg.OnCommit == nil {
		return nil, errors.New("walsource: Config.Slot and Config.OnCommit are required")
	}
	c := *cfg
	var err error
	if c.Schema, err = schemaname.Resolve(c.Schema); err != nil {
		return nil, err
	}
	if c.StatusInterval <= 0 {
		c.StatusInterval = 500 * time.Millisecond
	}
	if c.Logger == nil {
		c.Logger = telemetry.DefaultLogger()
	}
	return &Source{pool: pool, cfg: c, schema: c.Schema, publication: PublicationName(c.Schema)}, nil
}

// Decoded returns how many events the Source has decoded from the WAL.
func (s *Source) Decoded() int64 { return s.decoded.Load() }

// Reconnects returns how many times the Source has had to reconnect.
func (s *Source) Reconnects() int64 { return s.reconnects.Load() }

// StatusUpdates returns how many standby status updates the Source has sent.
func (s *Source) StatusUpdates() int64 { return s.statuses.Load() }

// Flushed returns the LSN the Source last confirmed to the server.
func (s *Source) Flushed() pglogrepl.LSN {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.flushed
}

// Run streams until ctx ends, reconnecting with backoff (100 ms doubling to
// 1 s, jittered) after a failure that may pass (a lost connection, a
// server restarting, a slot still in use). It returns nil when ctx ends,
// and a *PermanentError when PostgreSQL refuses the stream for a reason
// that retrying cannot mend (a role without the REPLICATION attribute,
// wal_level below logical, ...): it logs that once, at ERROR, with what to
// do about it, and does not retry.
func (s *Source) Run(ctx context.Context) error {
	backoff := 100 * time.Millisecond
	for first := true; ; first = false {
		if !first {
			s.reconnects.Add(1)
		}
		streamed, err := s.stream(ctx)
		if s.cfg.OnStreaming != nil && streamed {
			s.cfg.OnStreaming(false)
		}
		if ctx.Err() != nil {
			return nil
		}
		if pe := (*PermanentError)(nil); errors.As(err, &pe) {
			s.cfg.Logger.ErrorContext(ctx, "annals: the WAL stream of replication slot "+s.cfg.Slot+" stopped for good, not retried "+
				"(a subscriber it woke polls instead): "+pe.Problem+"; "+pe.Fix,
				append([]any{slog.String("slot", s.cfg.Slot), slog.String("sqlstate", pe.Code)}, errAttrs(pe.Err)...)...)
			return err
		}
		if streamed {
			backoff = 100 * time.Millisecond
		}
		s.cfg.Logger.WarnContext(ctx, "annals: WAL stream ended; reconnecting",
			append([]any{slog.String("slot", s.cfg.Slot), slog.Duration("backoff", backoff)}, errAttrs(err)...)...)
		if sleep(ctx, backoff/2+rand.N(backoff/2+1)) != nil {
			return nil
		}
		backoff = min(backoff*2, time.Second)
	}
}

// stream runs one replication connection until it fails or ctx ends.
func (s *Source) stream(ctx context.Context) (streamed bool, err error) {
	if _, err := EnsurePublication(ctx, s.pool, s.schema); err != nil {
		return false, s.permanent(ctx, stepPublication, "", err)
	}
	if _, err := EnsureSlot(ctx, s.pool, s.cfg.Slot); err != nil {
		return false, s.permanent(ctx, stepSlot, "", err)
	}
	conn, user, err := s.start(ctx)
	if isCode(err, "55000") {
		// object_not_in_prerequisite_state: among others, a slot that
		// max_slot_wal_keep_size invalidated (wal_status lost), which can
		// never be streamed again. Make it afresh and start once more.
		var recreated bool
		if recreated, err = s.recreateLost(ctx, err); recreated {
			conn, user, err = s.start(ctx)
		}
	}
	if err != nil {
		return false, s.permanent(ctx, stepStream, user, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	// Anything received but not confirmed on the last connection is sent
	// again from the slot's confirmed position.
	s.mu.Lock()
	s.pending = nil
	s.mu.Unlock()
	if s.cfg.OnStreaming != nil {
		s.cfg.OnStreaming(true)
	}
	d := decoder{schema: s.schema, relations: map[uint32]*pglogrepl.RelationMessage{}}
	var serverEnd pglogrepl.LSN
	nextStatus := time.Now().Add(s.cfg.StatusInterval)
	for {
		if ctx.Err() != nil {
			return true, nil
		}
		if !time.Now().Before(nextStatus) {
			if err := s.sendStatus(ctx, conn, serverEnd, false); err != nil {
				return true, err
			}
			nextStatus = time.Now().Add(s.cfg.StatusInterval)
		}
		rctx, cancel := context.WithDeadline(ctx, nextStatus)
		raw, err := conn.ReceiveMessage(rctx)
		cancel()
		if err != nil {
			if pgconn.Timeout(err) && ctx.Err() == nil {
				continue
			}
			return true, errors.Wrap(err, "walsource: receive")
		}
		switch msg := raw.(type) {
		case *pgproto3.ErrorResponse:
			return true, errors.Wrap(pgconn.ErrorResponseToPgError(msg), "walsource: replication error")
		case *pgproto3.CopyData:
			if len(msg.Data) == 0 {
				continue
			}
			switch msg.Data[0] {
			case pglogrepl.PrimaryKeepaliveMessageByteID:
				ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(msg.Data[1:])
				if err != nil {
					return true, errors.Wrap(err, "walsource: keepalive")
				}
				serverEnd = max(serverEnd, ka.ServerWALEnd)
				if ka.ReplyRequested {
					nextStatus = time.Now()
				}
			case pglogrepl.XLogDataByteID:
				xld, err := pglogrepl.ParseXLogData(msg.Data[1:])
				if err != nil {
					return true, errors.Wrap(err, "walsource: xlog data")
				}
				c, done, err := d.decode(xld.WALData)
				if err != nil {
					return true, err
				}
				if !done {
					continue
				}
				if len(c.Events) == 0 {
					continue
				}
				s.decoded.Add(int64(len(c.Events)))
				s.cfg.OnCommit(c)
				s.mu.Lock()
				s.pending = append(s.pending, Commit{LSN: c.LSN, Last: c.Last})
				s.mu.Unlock()
				if s.cfg.Confirmed == nil {
					nextStatus = time.Now()
				}
			}
		}
	}
}

// start opens a replication connection and starts streaming the slot on
// it; it returns the connection's role too ("" when the pool's
// BeforeConnect failed). A slot still active for another session ends that
// session (a former leader that lost its lease but not yet its connection;
// the caller holds the subscriber's lock now, so that session is stale)
// and fails: Run tries again.
//
// The connection's settings are the pool's, with the pool's BeforeConnect
// run on them at each connect (credentials that rotate, such as an IAM
// token, are supplied there); its AfterConnect is not run, since it expects
// a session that speaks the ordinary protocol.
func (s *Source) start(ctx context.Context) (*pgconn.PgConn, string, error) {
	pc, err := poolconn.Replication(ctx, s.pool, "annals walsource "+s.cfg.Slot)
	if err != nil {
		return nil, "", errors.Wrap(err, "walsource: connect for replication")
	}
	conn, err := pgconn.ConnectConfig(ctx, pc)
	if err != nil {
		return nil, pc.User, errors.Wrap(err, "walsource: connect for replication")
	}
	err = pglogrepl.StartReplication(ctx, conn, s.cfg.Slot, 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names '" + s.publication + "'"},
	})
	if err == nil {
		return conn, pc.User, nil
	}
	conn.Close(context.WithoutCancel(ctx))
	if isCode(err, "55006") {
		_, _ = s.pool.Exec(ctx, `SELECT pg_catalog.pg_terminate_backend(active_pid) FROM pg_catalog.pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, s.cfg.Slot)
	}
	return nil, pc.User, errors.Wrapf(err, "walsource: start replication on %s", s.cfg.Slot)
}

// recreateLost drops and creates again the slot when it has been
// invalidated (wal_status lost), which is why starting it failed with
// startErr, and reports whether it did. A new slot starts at the current
// WAL position: the commits between are not sent, and the (re)connect that
// follows tells the consumer (OnStreaming) to read from its own checkpoint.
func (s *Source) recreateLost(ctx context.Context, startErr error) (bool, error) {
	lost, err := slotLost(ctx, s.pool, s.cfg.Slot)
	if err != nil {
		return false, errors.CombineErrors(startErr, err)
	}
	if !lost {
		return false, startErr
	}
	s.cfg.Logger.WarnContext(ctx, "annals: replication slot invalidated (wal_status lost); dropping it and creating it again at the current WAL position (the commits before are not sent: the consumer reads from its checkpoint)",
		append([]any{slog.String("slot", s.cfg.Slot)}, errAttrs(startErr)...)...)
	if err := DropSlot(ctx, s.pool, s.cfg.Slot); err != nil {
		return false, err
	}
	if _, err := EnsureSlot(ctx, s.pool, s.cfg.Slot); err != nil {
		return false, err
	}
	return true, nil
}

// sendStatus confirms the slot through the last transaction the consumer
// has checkpointed (all of it when Confirmed is nil), and, when nothing
// received is unconfirmed, through the server's end as its keepalives report
// it: the walsender reports there the position it has decoded through, so
// no transaction with events lies before it unsent.
func (s *Source) sendStatus(ctx context.Context, conn *pgconn.PgConn, serverEnd pglogrepl.LSN, reply bool) error {
	confirmed := int64(-1)
	if s.cfg.Confirmed != nil {
		s.mu.Lock()
		unconfirmed := len(s.pending) > 0
		s.mu.Unlock()
		if unconfirmed {
			pos, err := s.cfg.Confirmed(ctx)
			if err != nil {
				s.cfg.Logger.WarnContext(ctx, "annals: reading the consumer's checkpoint failed",
					append([]any{slog.String("slot", s.cfg.Slot)}, errAttrs(err)...)...)
				pos = -1
			}
			confirmed = pos
		}
	}
	s.mu.Lock()
	flush := s.flushed
	i := 0
	for ; i < len(s.pending); i++ {
		if s.cfg.Confirmed != nil && s.pending[i].Last > confirmed {
			break
		}
		flush = max(flush, s.pending[i].LSN)
	}
	s.pending = s.pending[i:]
	if len(s.pending) == 0 {
		flush = max(flush, serverEnd)
	}
	s.flushed = flush
	s.mu.Unlock()
	err := pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: flush, WALFlushPosition: flush, WALApplyPosition: flush, ReplyRequested: reply,
	})
	s.statuses.Add(1)
	return errors.Wrap(err, "walsource: standby status update")
}

// sleep waits for d or until ctx ends (then returns its error).
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// errAttrs returns err as log attributes: its message and, when it carries
// a PostgreSQL error, that error's DETAIL and HINT, which the message leaves
// out (an invalidated slot's DETAIL is the reason why).
func errAttrs(err error) []any {
	attrs := []any{telemetry.Err(err)}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		if pgErr.Detail != "" {
			attrs = append(attrs, slog.String("detail", pgErr.Detail))
		}
		if pgErr.Hint != "" {
			attrs = append(attrs, slog.String("hint", pgErr.Hint))
		}
	}
	return attrs
}
