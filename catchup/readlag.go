package catchup

import (
	"context"
	_ "embed"
	"log/slog"
	"time"

	"github.com/annals-dev/annals/internal/sqltmpl"
	"github.com/annals-dev/annals/internal/telemetry"
)

//go:embed readlag.sql
var readLagSQL string

// readLagQueries are the statements of readlag.sql (they name no schema).
var readLagQueries = func() map[string]string {
	q, err := sqltmpl.Named("readlag.sql", readLagSQL, sqltmpl.NewData(""))
	if err != nil {
		panic(err)
	}
	return q
}()

// DefaultReadLagCheck is Config.ReadLagCheck's default.
const DefaultReadLagCheck = 5 * time.Second

// readLagLogEvery is how often a replica that stays behind is logged
// again at WARN.
const readLagLogEvery = time.Minute

// readLag watches a live leadership that reads from Config.ReadPool for a
// replica that stays behind the primary (see Config.ReadLagCheck): a
// replica whose replay is paused, or lags, holds the subscriber back
// without an error, and without this the leadership would wait in silence
// while its lag grows.
//
// When a read from the replica finds nothing new, and ReadLagCheck has
// passed since the last mark, the replica's head (as that read saw it) is
// compared with the primary's head at the mark: below it, the replica has
// not replayed within ReadLagCheck what the primary had committed then.
// Then the primary's head is read again as the next mark (one statement on
// the primary per ReadLagCheck/2 at most, shared by the engine's
// leaderships, only while one finds nothing new to read).
type readLag struct {
	// mark is the primary's head at markAt (zero markAt: no mark yet).
	mark   int64
	markAt time.Time
	// behindSince is the mark the replica was first found behind (zero:
	// not behind); warnedAt, when it was last logged at WARN.
	behindSince time.Time
	warnedAt    time.Time
}

// idle is called by a live leadership whose read from the replica found
// nothing new; readHead is the replica's head as that read saw it. It
// logs, at WARN at most once per readLagLogEvery, while the replica stays
// behind a mark, and at INFO once it has caught up with one again.
func (l *readLag) idle(ctx context.Context, e *Engine, sub *Subscription, readHead int64) {
	every := e.cfg.ReadLagCheck
	if e.cfg.ReadPool == nil || every < 0 {
		return
	}
	now := time.Now()
	if !l.markAt.IsZero() && now.Sub(l.markAt) < every {
		return
	}
	sample, err := e.primaryHead(ctx, every)
	if err != nil {
		// The primary is unreachable: its own failures are logged where
		// they stop the leadership; compare again from a new mark.
		l.markAt = time.Time{}
		return
	}
	head := sample.head
	switch {
	case l.markAt.IsZero():
	case readHead < l.mark:
		if l.behindSince.IsZero() {
			l.behindSince = l.markAt
		}
		if l.warnedAt.IsZero() || now.Sub(l.warnedAt) >= readLagLogEvery {
			l.warnedAt = now
			var paused bool
			pausedErr := e.cfg.ReadPool.QueryRow(ctx, readLagQueries["ReplayPaused"]).Scan(&paused)
			attrs := []any{slog.String("subscriber", sub.Name), slog.Int("partition", sub.Partition),
				slog.Int64("replica_head", readHead), slog.Int64("primary_head", head),
				slog.Int64("behind_events", head-readHead), slog.Duration("behind_for", now.Sub(l.behindSince).Round(time.Millisecond))}
			msg := "annals: the read replica (ReadPool) is behind the primary; the subscriber reads no further than the replica has replayed, and waits"
			switch {
			case pausedErr != nil:
				attrs = append(attrs, slog.String("replay_paused", "unknown"), telemetry.Err(pausedErr))
			case paused:
				attrs = append(attrs, slog.Bool("replay_paused", true))
				msg = "annals: the read replica (ReadPool) is behind the primary: its WAL replay is paused (SELECT pg_wal_replay_resume() on the replica); the subscriber reads no further than the replica has replayed, and waits"
			default:
				attrs = append(attrs, slog.Bool("replay_paused", false))
			}
			e.cfg.Logger.WarnContext(ctx, msg, attrs...)
		}
	case !l.behindSince.IsZero():
		e.cfg.Logger.InfoContext(ctx, "annals: the read replica (ReadPool) has caught up with the primary",
			slog.String("subscriber", sub.Name), slog.Int("partition", sub.Partition), slog.Int64("replica_head", readHead),
			slog.Duration("was_behind_for", now.Sub(l.behindSince).Round(time.Millisecond)))
		l.behindSince, l.warnedAt = time.Time{}, time.Time{}
	}
	l.mark, l.markAt = head, sample.at
}

// headSample is the primary's head and when it was read.
type headSample struct {
	head int64
	at   time.Time
}

// primaryHead returns the primary's head as read at most every/2 ago by
// any leadership of the engine, reading it when none is that fresh: the
// partitions of a subscriber (up to 1024) share one statement on the
// primary per interval rather than one each.
func (e *Engine) primaryHead(ctx context.Context, every time.Duration) (headSample, error) {
	if s := e.headSample.Load(); s != nil && time.Since(s.at) < every/2 {
		return *s, nil
	}
	at := time.Now()
	h, err := e.Head(ctx)
	if err != nil {
		return headSample{}, err
	}
	s := &headSample{head: h, at: at}
	e.headSample.Store(s)
	return *s, nil
}
