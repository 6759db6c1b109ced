package catchup

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/advisorylock"
	"github.com/annals-dev/annals/internal/lockkey"
	"github.com/annals-dev/annals/internal/telemetry"
)

// heldWarnEvery is how often, at most, the WARN about a session that no
// live instance lists holding partitions of a subscriber is repeated (per
// holder and subscriber, whatever the number of partitions) while it
// stays so.
const heldWarnEvery = time.Minute

// heldListMax bounds the partitions a held-lock record lists by number;
// the record gives the count of all.
const heldListMax = 8

// heldRun is a run of polls that found a partition this process wants (a
// balanced one while its member is owed partitions, an unbalanced one
// always) held by another session: the input of Config.HolderWarnAfter. A
// healthy fleet has none for long: a member owed a partition gets it
// within a poll or two of a handover, so the statement that looks at the
// holder (HeldLocks) runs only once a run is past HolderWarnAfter, at most
// once per HolderWarnAfter per run (younger runs of the same holder join
// it: sameHolder).
type heldRun struct {
	sub     *Subscription
	since   time.Time // first seen held
	pid     int32     // the holder's backend pid as last seen (0: not known yet)
	checked time.Time // the last look at the holder
	warned  time.Time // the last WARN naming this run (zero: none, or cleared since)

	// What the last look found, while it found a session that no live
	// instance lists (foreign): the facts the WARN gives.
	foreign bool
	owner   string         // the checkpoint's last claimant ("": none)
	idle    *time.Duration // how long the checkpoint had been unchanged at the look
	act     []any          // what pg_stat_activity showed of the holder
}

// heldHolder is a session holding partitions of one subscriber: the unit
// of the held-lock WARN and of its once a minute.
type heldHolder struct {
	sub string
	pid int32
}

// heldSeen is what one poll saw of the wanted partitions held by another
// session; its zero value (Config.HolderWarnAfter unset) records nothing.
// Its maps are made at the first record: a poll that finds nothing held
// allocates nothing.
type heldSeen struct {
	on   bool
	now  map[string]int32 // held now: the holder's pid (0: unknown)
	keep map[string]bool  // not looked at in this poll: their run goes on
}

func (h *heldSeen) held(k string, pid int32) {
	if !h.on {
		return
	}
	if h.now == nil {
		h.now = map[string]int32{}
	}
	h.now[k] = pid
}

func (h *heldSeen) keepRun(k string) {
	if !h.on {
		return
	}
	if h.keep == nil {
		h.keep = map[string]bool{}
	}
	h.keep[k] = true
}

// heldInfoKey is one INFO of heldInfos: the holder, why its runs cleared
// and the record's further attributes (as text, to group by).
type heldInfoKey struct {
	heldHolder
	msg, extra string
}

// heldInfos gathers the INFOs of warned-of runs that end in one pass, so
// that a holder's partitions that clear together (its session ended: all
// its locks are free at once) make one record, not one per partition.
type heldInfos struct {
	order []heldInfoKey
	parts map[heldInfoKey][]int
	attrs map[heldInfoKey][]any
}

func (n *heldInfos) add(r *heldRun, msg string, attrs ...any) {
	if n.parts == nil {
		n.parts, n.attrs = map[heldInfoKey][]int{}, map[heldInfoKey][]any{}
	}
	k := heldInfoKey{heldHolder{r.sub.Name, r.pid}, msg, fmt.Sprint(attrs...)}
	if _, ok := n.parts[k]; !ok {
		n.order = append(n.order, k)
		n.attrs[k] = attrs
	}
	n.parts[k] = append(n.parts[k], r.sub.Partition)
}

func (n *heldInfos) log(ctx context.Context, log *slog.Logger) {
	for _, k := range n.order {
		attrs := append([]any{slog.String("subscriber", k.sub)}, partitionAttrs(n.parts[k])...)
		attrs = append(attrs, slog.Int("pid", int(k.pid)))
		log.InfoContext(ctx, k.msg, append(attrs, n.attrs[k]...)...)
	}
}

// partitionAttrs are the log attributes naming the partitions parts of a
// subscriber (sorted here): partition, the lowest (a single partition's
// record reads as it always did), partitions, their number, and
// partition_list, the first heldListMax of them.
func partitionAttrs(parts []int) []any {
	slices.Sort(parts)
	list := parts[:min(len(parts), heldListMax)]
	var b strings.Builder
	for i, p := range list {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(p))
	}
	if more := len(parts) - len(list); more > 0 {
		fmt.Fprintf(&b, ",… (%d more)", more)
	}
	return []any{slog.Int("partition", parts[0]), slog.Int("partitions", len(parts)), slog.String("partition_list", b.String())}
}

// watchHeld ends the runs of the partitions that this poll did not find
// held (an INFO per holder for those that had been warned of), starts or
// continues the others, and looks at the holders of those held past
// Config.HolderWarnAfter that have not been looked at for as long (and at
// the holder's other partitions of the subscriber: sameHolder).
func (s *sessions) watchHeld(ctx context.Context, sb *advisorylock.Standby, st state, hs heldSeen) {
	if !hs.on || (len(hs.now) == 0 && len(s.heldBy) == 0 && len(s.heldWarned) == 0) {
		return // nothing held, nothing to end
	}
	log := s.e.cfg.Logger
	now := time.Now()
	for h, at := range s.heldWarned {
		if now.Sub(at) >= heldWarnEvery {
			delete(s.heldWarned, h) // holds nothing back any more
		}
	}
	var infos heldInfos
	const gone = "annals: the partition is no longer held by a session that no live instance lists: "
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
			infos.add(r, gone+why)
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
				infos.add(r, gone+"another session holds it now", slog.Int("new_pid", int(pid)))
			}
			r = &heldRun{sub: st.byKey[k][0].sub, since: now, pid: pid}
			s.heldBy[k] = r
		}
		if now.Sub(r.since) >= after && now.Sub(r.checked) >= after {
			due = append(due, k)
		}
	}
	joined := sameHolder(s.heldBy, hs.now, due, now, after)
	infos.log(ctx, log)
	if len(due) > 0 {
		s.checkHeld(ctx, sb, due, joined, now)
	}
}

// sameHolder returns the partitions held now (held) that are not due but
// whose holder, a known pid, holds a due partition of the same subscriber,
// unless looked at within after. They join the look at that holder
// (checkHeld), so that its WARN names them too: a runner's partitions
// start waiting one by one, on a loaded machine a poll or two apart, and
// the WARN named some of a holder's partitions and the INFO at its end
// only those. Their runs may be younger than after, so they only join:
// found unlisted, they are named in a WARN that a due partition caused,
// and cause none themselves (a live leader that has just taken one has
// not listed it in its heartbeat yet).
func sameHolder(runs map[string]*heldRun, held map[string]int32, due []string, now time.Time, after time.Duration) []string {
	if len(due) == 0 || len(due) == len(held) {
		return nil
	}
	isDue := make(map[string]bool, len(due))
	holders := make(map[heldHolder]bool, len(due))
	for _, k := range due {
		isDue[k] = true
		if r := runs[k]; r.pid != 0 {
			holders[heldHolder{r.sub.Name, r.pid}] = true
		}
	}
	var more []string
	for k := range held {
		r := runs[k]
		if isDue[k] || r.pid == 0 || now.Sub(r.checked) < after || !holders[heldHolder{r.sub.Name, r.pid}] {
			continue
		}
		more = append(more, k)
	}
	return more
}

// checkHeld looks, in one statement on the lock session, at the holders of
// the partitions due and of those joining them (sameHolder), and logs
// those that no live instance lists: one WARN per holder and subscriber
// that a due partition was found held by, naming all its partitions found
// so.
func (s *sessions) checkHeld(ctx context.Context, sb *advisorylock.Standby, due, joined []string, now time.Time) {
	nDue := len(due)
	due = append(due[:nDue:nDue], joined...)
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
	var infos heldInfos
	var found []heldHolder // holders found holding a partition for no live instance, in order
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
			r.pid, r.since, r.foreign = *x.pid, now, false // another holder: counted afresh
			continue
		}
		cleared := func(why string, attrs ...any) {
			r.foreign = false
			if !r.warned.IsZero() {
				r.warned = time.Time{}
				infos.add(r, "annals: the partition's lock is no longer held by a session that no live instance lists: "+why, attrs...)
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
		default:
			r.foreign, r.owner, r.idle = true, "", nil
			if x.owner != nil {
				r.owner = *x.owner
			}
			if x.idle != nil {
				d := time.Duration(*x.idle * float64(time.Second))
				r.idle = &d
			}
			r.act = activityAttrs(x.user, x.app, x.addr, x.state, x.backendStart, x.stateChange)
			if h := (heldHolder{r.sub.Name, r.pid}); int(x.i) <= nDue && !slices.Contains(found, h) {
				found = append(found, h)
			}
		}
	}
	for _, k := range due[nDue:] {
		// A joining partition whose holder no due one was found held by:
		// not foreign until its own run is due.
		if r := s.heldBy[k]; r.foreign && !slices.Contains(found, heldHolder{r.sub.Name, r.pid}) {
			r.foreign = false
		}
	}
	infos.log(ctx, log)
	for _, h := range found {
		s.warnHeld(ctx, h, now)
	}
}

// warnHeld logs the WARN about holder h, naming every partition of its
// subscriber whose last look found h holding it for no live instance,
// unless h has been warned of within heldWarnEvery (then at debug level).
func (s *sessions) warnHeld(ctx context.Context, h heldHolder, now time.Time) {
	var runs []*heldRun
	for _, r := range s.heldBy {
		if r.foreign && r.sub.Name == h.sub && r.pid == h.pid {
			runs = append(runs, r)
		}
	}
	if len(runs) == 0 {
		return
	}
	slices.SortFunc(runs, func(a, b *heldRun) int { return a.sub.Partition - b.sub.Partition })
	parts := make([]int, len(runs))
	var heldFor time.Duration
	var idle *time.Duration
	var owners []string
	latest := runs[0] // the last look at the holder: what pg_stat_activity shows now
	for i, r := range runs {
		if r.checked.After(latest.checked) {
			latest = r
		}
		parts[i] = r.sub.Partition
		heldFor = max(heldFor, now.Sub(r.since))
		if r.idle != nil && (idle == nil || *r.idle < *idle) {
			idle = r.idle
		}
		if r.owner != "" && !slices.Contains(owners, r.owner) {
			owners = append(owners, r.owner)
		}
	}
	log := s.e.cfg.Logger
	attrs := append([]any{slog.String("subscriber", h.sub)}, partitionAttrs(parts)...)
	attrs = append(attrs, slog.Int("pid", int(h.pid)))
	if at, ok := s.heldWarned[h]; ok && now.Sub(at) < heldWarnEvery {
		log.DebugContext(ctx, "annals: standing by: a session that no live instance lists still holds the partitions (warned of within the minute)",
			append(attrs, slog.Duration("held_for", roundAge(heldFor)))...)
		return
	}
	if s.heldWarned == nil {
		s.heldWarned = map[heldHolder]time.Time{}
	}
	s.heldWarned[h] = now
	for _, r := range runs {
		r.warned = now
	}
	attrs = append(attrs, slog.Duration("held_for", roundAge(heldFor)))
	if len(owners) > 0 {
		slices.Sort(owners)
		if len(owners) > heldListMax {
			owners = append(owners[:heldListMax], fmt.Sprintf("… (%d more)", len(owners)-heldListMax))
		}
		attrs = append(attrs, slog.String("last_claimed_by", strings.Join(owners, ",")))
	}
	if idle != nil {
		attrs = append(attrs, slog.Duration("checkpoint_unchanged_for", roundAge(*idle)))
	}
	attrs = append(attrs, latest.act...)
	log.WarnContext(ctx, "annals: the partition has no leader: a session that no live instance lists in its heartbeat "+
		"has held its lock for long, so this instance stands by and nobody processes it. It may be a job that leads "+
		"without heartbeats (Runner.RunUntilCaughtUp, annals tail --subscriber); if not, the session was left holding "+
		"the lock (a runner frozen with its heartbeat, a runner's lock session through a transaction-mode PgBouncer, a psql "+
		"session, the backend of a killed process the server has not noticed yet): end it with SELECT pg_terminate_backend(pid), or on PgBouncer with "+
		"RECONNECT (server_idle_timeout bounds it); see docs/operations.md",
		attrs...)
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
