package catchup

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/advisorylock"
	"github.com/annals-dev/annals/internal/lockkey"
	"github.com/annals-dev/annals/internal/telemetry"
)

// heldWarnEvery is how often, at most, the WARN about a partition held by a
// session that no live instance lists is repeated while it stays so.
const heldWarnEvery = time.Minute

// heldRun is a run of polls that found a partition this process wants (a
// balanced one while its member is owed partitions, an unbalanced one
// always) held by another session: the input of Config.HolderWarnAfter. A
// healthy fleet has none for long: a member owed a partition gets it
// within a poll or two of a handover, so the statement that looks at the
// holder (HeldLocks) runs only for runs past HolderWarnAfter, at most once
// per HolderWarnAfter per run.
type heldRun struct {
	sub     *Subscription
	since   time.Time // first seen held
	pid     int32     // the holder's backend pid as last seen (0: not known yet)
	checked time.Time // the last look at the holder
	warned  time.Time // the last WARN of this run (zero: none, or cleared since)
}

// heldSeen is what one poll saw of the wanted partitions held by another
// session; its zero value (Config.HolderWarnAfter unset) records nothing.
type heldSeen struct {
	now  map[string]int32 // held now: the holder's pid (0: unknown)
	keep map[string]bool  // not looked at in this poll: their run goes on
}

func (h heldSeen) held(k string, pid int32) {
	if h.now != nil {
		h.now[k] = pid
	}
}

func (h heldSeen) keepRun(k string) {
	if h.keep != nil {
		h.keep[k] = true
	}
}

// watchHeld ends the runs of the partitions that this poll did not find
// held (an INFO for those that had been warned of), starts or continues
// the others, and looks at the holders of those held past
// Config.HolderWarnAfter that have not been looked at for as long.
func (s *sessions) watchHeld(ctx context.Context, sb *advisorylock.Standby, st state, hs heldSeen) {
	if hs.now == nil {
		return
	}
	log := s.e.cfg.Logger
	now := time.Now()
	for k, r := range s.heldBy {
		if _, ok := hs.now[k]; ok || hs.keep[k] {
			continue
		}
		delete(s.heldBy, k)
		if !r.warned.IsZero() {
			why := "its lock is free, or this instance leads it or is owed no more partitions"
			if st.byKey[k] == nil {
				why = "this instance no longer stands by for it"
			}
			log.InfoContext(ctx, "annals: the partition is no longer held by a session that no live instance lists: "+why,
				slog.String("subscriber", r.sub.Name), slog.Int("partition", r.sub.Partition), slog.Int("pid", int(r.pid)))
		}
	}
	after := s.e.cfg.HolderWarnAfter
	var due []string
	for k, pid := range hs.now {
		r := s.heldBy[k]
		if r == nil || (pid != 0 && r.pid != 0 && pid != r.pid) {
			// A new run, or another holder (a handover between other
			// instances): held for long is counted afresh.
			if r != nil && !r.warned.IsZero() {
				log.InfoContext(ctx, "annals: the partition is no longer held by a session that no live instance lists: another session holds it now",
					slog.String("subscriber", r.sub.Name), slog.Int("partition", r.sub.Partition), slog.Int("pid", int(r.pid)), slog.Int("new_pid", int(pid)))
			}
			r = &heldRun{sub: st.byKey[k][0].sub, since: now, pid: pid}
			s.heldBy[k] = r
		}
		if now.Sub(r.since) >= after && now.Sub(r.checked) >= after {
			due = append(due, k)
		}
	}
	if len(due) > 0 {
		s.checkHeld(ctx, sb, due, now)
	}
}

// checkHeld looks, in one statement on the lock session, at the holders of
// the partitions due, and logs those that no live instance lists.
func (s *sessions) checkHeld(ctx context.Context, sb *advisorylock.Standby, due []string, now time.Time) {
	n := len(due)
	subs, parts := make([]string, n), make([]int32, n)
	k1, k2, r1, r2 := make([]int32, n), make([]int32, n), make([]*int32, n), make([]*int32, n)
	for i, k := range due {
		r := s.heldBy[k]
		r.checked = now
		subs[i], parts[i] = r.sub.Name, int32(r.sub.Partition)
		k1[i], k2[i] = lockkey.Pair(k)
		if s.e.cfg.RebuildKey != nil {
			if rk := s.e.cfg.RebuildKey(r.sub.Name); rk != "" {
				a, b := lockkey.Pair(rk)
				r1[i], r2[i] = &a, &b
			}
		}
	}
	type row struct {
		i                         int64
		pid                       *int32
		listed, owner             *string
		idle                      *float64
		rebuild                   bool
		user, app, addr, state    *string
		backendStart, stateChange *time.Time
	}
	var rows []row
	err := sb.Do(ctx, func(conn *pgx.Conn) error {
		rs, err := conn.Query(ctx, s.e.q["HeldLocks"], subs, parts, k1, k2, r1, r2, s.e.cfg.HolderWarnAfter.Microseconds())
		if err != nil {
			return err
		}
		var r row
		_, err = pgx.ForEachRow(rs, []any{&r.i, &r.pid, &r.listed, &r.owner, &r.idle, &r.rebuild,
			&r.user, &r.app, &r.addr, &r.backendStart, &r.state, &r.stateChange}, func() error {
			rows = append(rows, r)
			r = row{}
			return nil
		})
		return err
	})
	log := s.e.cfg.Logger
	if err != nil {
		// Best effort: the poll goes on (a lost session fails its next
		// statement); the partitions are looked at again later.
		log.DebugContext(ctx, "annals: looking at the holders of held partitions failed", telemetry.Err(err))
		return
	}
	for _, x := range rows {
		if x.i < 1 || int(x.i) > n {
			continue
		}
		r := s.heldBy[due[x.i-1]]
		sub, part := slog.String("subscriber", r.sub.Name), slog.Int("partition", r.sub.Partition)
		switch {
		case x.pid == nil:
			continue // free now: the next poll takes it
		case r.pid == 0:
			// An unbalanced partition: its holder is known from now on, and
			// a WARN waits for a second look to find the same one.
			r.pid = *x.pid
			continue
		case *x.pid != r.pid:
			r.pid, r.since = *x.pid, now // another holder: counted afresh
			continue
		}
		cleared := func(why string, attrs ...any) {
			if !r.warned.IsZero() {
				r.warned = time.Time{}
				log.InfoContext(ctx, "annals: the partition's lock is no longer held by a session that no live instance lists: "+why,
					append([]any{sub, part, slog.Int("pid", int(r.pid))}, attrs...)...)
			}
		}
		switch {
		case x.listed != nil:
			log.DebugContext(ctx, "annals: standing by: a live instance leads the partition", sub, part,
				slog.String("leader", *x.listed), slog.Int("pid", int(r.pid)))
			cleared("a live instance lists it", slog.String("leader", *x.listed))
		case x.rebuild:
			log.DebugContext(ctx, "annals: standing by: a rebuild leads the partition", sub, part, slog.Int("pid", int(r.pid)))
			cleared("a rebuild of the subscriber runs")
		case now.Sub(r.warned) < heldWarnEvery:
		default:
			r.warned = now
			attrs := []any{sub, part, slog.Int("pid", int(r.pid)),
				slog.Duration("held_for", roundAge(now.Sub(r.since)))}
			if x.owner != nil && *x.owner != "" {
				attrs = append(attrs, slog.String("last_claimed_by", *x.owner))
			}
			if x.idle != nil {
				attrs = append(attrs, slog.Duration("checkpoint_unchanged_for", roundAge(time.Duration(*x.idle*float64(time.Second)))))
			}
			attrs = append(attrs, activityAttrs(x.user, x.app, x.addr, x.state, x.backendStart, x.stateChange)...)
			log.WarnContext(ctx, "annals: the partition has no leader: a session that no live instance lists in its heartbeat "+
				"has held its lock for long, so this instance stands by and nobody processes it. It may be a job that leads "+
				"without heartbeats (Runner.RunUntilCaughtUp, annals tail --subscriber); if not, the session was left holding "+
				"the lock (a runner frozen with its heartbeat, a runner's lock session through a transaction-mode PgBouncer, a psql "+
				"session, the backend of a killed process the server has not noticed yet): end it with SELECT pg_terminate_backend(pid), or on PgBouncer with "+
				"RECONNECT (server_idle_timeout bounds it); see docs/operations.md",
				attrs...)
		}
	}
}

// roundAge rounds an age for a log record: to the second from 10 s on.
func roundAge(d time.Duration) time.Duration {
	if d < 10*time.Second {
		return d.Round(10 * time.Millisecond)
	}
	return d.Round(time.Second)
}

// activityAttrs are the log attributes of what pg_stat_activity shows of a
// backend; columns hidden from this role (another role's backend without
// pg_read_all_stats) are left out, and said to be.
func activityAttrs(user, app, addr, state *string, start, change *time.Time) []any {
	var attrs []any
	str := func(key string, v *string) {
		if v != nil {
			attrs = append(attrs, slog.String(key, *v))
		}
	}
	str("usename", user)
	str("application_name", app)
	str("client_addr", addr)
	if start != nil {
		attrs = append(attrs, slog.Time("backend_start", start.UTC()))
	}
	str("state", state)
	if change != nil {
		attrs = append(attrs, slog.Time("state_change", change.UTC()))
	}
	if state == nil && start == nil {
		attrs = append(attrs, slog.String("activity", "hidden from this role (another role's backend: "+
			"a superuser or a role with pg_read_all_stats sees it in pg_stat_activity)"))
	}
	return attrs
}
