package catchup

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/annals-dev/annals/advisorylock"
	"github.com/annals-dev/annals/checkpoint"
	"github.com/annals-dev/annals/internal/errmark"
	"github.com/annals-dev/annals/internal/lockkey"
	"github.com/annals-dev/annals/internal/schemaname"
	"github.com/annals-dev/annals/internal/telemetry"
)

// DefaultLockRetryInterval is the default Config.LockRetryInterval: how
// often the lock session polls the locks of every partition it stands by
// for. A takeover after a leader's crash then takes about half of it on
// average (plus a round trip), and at most about 1.25× it.
const DefaultLockRetryInterval = 20 * time.Millisecond

// MaxMembers is the number of member slots of a balanced subscriber: at
// most this many instances share its partitions; more run greedily (they
// take any free partition, as an unbalanced subscriber does).
const MaxMembers = 128

// standbyDialTimeout bounds opening the lock session.
const standbyDialTimeout = 30 * time.Second

// closeTimeout bounds closing the lock session.
const closeTimeout = 5 * time.Second

// claimLockTimeout bounds how long a claim on the lock session waits for
// the checkpoint row (lock_timeout, for the claim's transaction only). A
// claim normally waits for nothing, or for a commit in flight; a row held
// longer (an operator's open transaction, a blue-green cut-over) would
// otherwise hold the one poller, and with it every other partition's
// takeover and release and the Stop of the partition's Run. A claim that
// times out gives the lock back, and its waiter stands by again.
const claimLockTimeout = 200 * time.Millisecond

// claimLockTimeoutSetting is claimLockTimeout as a lock_timeout setting.
var claimLockTimeoutSetting = strconv.FormatInt(claimLockTimeout.Milliseconds(), 10) + "ms"

// claimRetryPause is how long the poller leaves a partition whose claim
// timed out before it takes its lock again: a row held for long costs the
// poller at most about half of its time while one partition's row is held.
// (With the rows of n partitions held, each poll spends n claim timeouts
// before its pause: n/(n+1) of its time. Not tested beyond one.)
const claimRetryPause = claimLockTimeout

// releaseChannel is the notification channel on which the engine's locks
// announce a graceful release to the standbys (advisorylock.Config's
// ReleaseChannel). A schema name has at most schemaname.MaxLen (56) bytes,
// so it fits PostgreSQL's 63.
func releaseChannel(schema string) string { return schema + "_locks" }

// memberKey is the lock key of member slot i of a balanced subscriber.
func memberKey(schema, subscriber string, i int) string {
	return fmt.Sprintf("%s:%s:member/%d", schemaname.Or(schema), subscriber, i)
}

// sessions is the engine's lock session: one connection (an
// advisorylock.Standby) that holds every lock the engine holds for Run and
// CatchUp (the member slots of balanced subscribers and the led partitions)
// and polls, every LockRetryInterval (jittered) or at once when a release
// is announced, for the partitions it stands by for. One goroutine (poll)
// owns the connection; the rest of the engine talks to it through the
// fields below and Interrupt. See "Balanced leadership" in the package
// documentation.
type sessions struct {
	e *Engine

	mu        sync.Mutex
	waiting   map[*waiter]struct{}
	held      map[string]*sharedLock
	releases  []*releaseReq
	groups    map[string]*group
	departing []*group // left groups whose slot is still held
	running   bool
	stopped   chan struct{} // closed when the running poller returns
	// quick counts the lock sessions in a row that ended soon after they
	// opened (poll: only the running poller touches it).
	quick   int
	current *advisorylock.Standby // the poller's session, nil while it has none
	wake    chan struct{}         // capacity 1: something changed (cuts a backoff short)

	// freeSince is when each partition this process stands by for was first
	// seen free (nobody holding or queued for its lock), for the orphan
	// rule (see orphanGrace). Only the poller goroutine touches it.
	freeSince map[string]time.Time
	// retryAt is when the poller may take a partition's lock again after
	// its claim timed out (see claimRetryPause). Only the poller touches it.
	retryAt map[string]time.Time
	// blocked is, per partition whose claims keep timing out, when the
	// first of them did and when a warning was last logged (see
	// logClaimTimeout). Only the poller touches it.
	blocked map[string]*claimBlock
	// heldBy is, per partition this process wants and finds held by
	// another session, the run of polls that found it so (see heldRun).
	// Only the poller touches it.
	heldBy map[string]*heldRun
	// heldWarned is when each holder of partitions of a subscriber was
	// last warned of (see warnHeld); entries older than heldWarnEvery are
	// dropped. Only the poller touches it.
	heldWarned map[heldHolder]time.Time
}

// claimBlock is a run of timed-out claims of one partition.
type claimBlock struct{ since, warned time.Time }

// claimBlockedWarn is how long a partition's claims may keep timing out
// before a warning is logged (and again at this interval while they do).
const claimBlockedWarn = 10 * time.Second

// orphanGrace is how long a balanced partition may stay free before a
// member whose share is full takes it anyway. Shares assume that every
// live member takes what it is owed; a member can be live yet unable to
// (its partition's goroutine still inside a batch of a leadership it lost,
// or a rebalancing still settling), and without this rule the partition
// would stay unled until it can. A normal handover completes within a poll
// or two (the new owner is woken), far below the grace; a partition taken
// over the share is handed back by the usual rule once its owner stands by.
const orphanGrace = 250 * time.Millisecond

// waiter is a subscriber partition standing by.
type waiter struct {
	key  string
	sub  *Subscription // its name, partition and layout (for the claim)
	g    *group        // nil: take the lock whenever it is free
	got  chan standbyResult
	gone bool // its wait ended: the poller gives back what it takes for it (s.mu)
}

// standbyResult is a waiter's lock, claimed (its checkpoint's epoch
// bumped for this engine), or why it has none.
type standbyResult struct {
	lock  *sharedLock
	epoch int64
	start int64
	err   error
}

// sharedLock is one lock held on the lock session.
type sharedLock struct {
	key  string
	part int
	g    *group
	// server is the lock session's server PID (pg_backend_pid()): a
	// commit fenced on that server session ran where the lock is held.
	server uint32

	mu       sync.Mutex
	err      error         // why it is no longer held
	lost     chan struct{} // closed when err is set
	handover chan struct{} // closed when the balancer asks the leader to hand over
	leaving  bool          // handover was closed
}

func (l *sharedLock) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

func (l *sharedLock) end(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err == nil {
		l.err = err
		close(l.lost)
	}
}

// releaseReq asks the poller to give a lock back (and announce it).
type releaseReq struct {
	lock *sharedLock
	done chan struct{}
}

// group is this engine's membership in a balanced subscriber.
type group struct {
	name       string
	partitions int
	refs       int  // Runs of its partitions
	leaving    bool // the runs' context ended, or none is left: give the slot back
	slot       int  // held member slot, -1 none
	members    int  // live members at the last poll (with this one)
	pos        int  // this member's place in the rotation at the last poll
	over       int  // consecutive polls that found more led than the target
	// probe is how many member slots a poll looks at (0: all MaxMembers):
	// twice the highest live slot seen, at least 16. Members take the
	// lowest free slot, so the live ones are dense at the low end; a member
	// seen once stays within the range (the range follows the highest).
	probe int
}

func newSessions(e *Engine) *sessions {
	return &sessions{e: e, waiting: map[*waiter]struct{}{}, held: map[string]*sharedLock{},
		groups: map[string]*group{}, wake: make(chan struct{}, 1), freeSince: map[string]time.Time{}, retryAt: map[string]time.Time{},
		blocked: map[string]*claimBlock{}, heldBy: map[string]*heldRun{}}
}

// start runs the poller unless it runs. The caller holds s.mu.
func (s *sessions) start() {
	if !s.running {
		s.running = true
		s.stopped = make(chan struct{})
		go s.poll(s.stopped)
	}
	s.changed()
}

// join makes the engine a member of the balanced subscriber name (with
// partitions partitions) for one more Run; leave undoes it.
func (s *sessions) join(name string, partitions int) *group {
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.groups[name]
	if g == nil || g.leaving {
		if g != nil {
			s.departing = append(s.departing, g)
		}
		g = &group{name: name, partitions: partitions, slot: -1}
		s.groups[name] = g
	}
	g.refs++
	s.start()
	return g
}

// leave ends one Run's membership; the last gives the slot back.
func (s *sessions) leave(g *group) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if g.refs--; g.refs == 0 {
		s.departLocked(g)
	}
}

// depart gives g's member slot back now (its runs are shutting down), so
// that the other members' shares grow before this one's partitions are
// released.
func (s *sessions) depart(g *group) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.departLocked(g)
}

func (s *sessions) departLocked(g *group) {
	if g.leaving {
		return
	}
	g.leaving = true
	if s.groups[g.name] == g {
		delete(s.groups, g.name)
		s.departing = append(s.departing, g)
	}
	s.start()
}

// wait stands by for the lock of key until the lock session takes it for
// this waiter, and returns it. It returns an error when ctx ends (at once,
// also while the poller claims for it: the poller then gives back what it
// took), and when the lock session cannot be opened (the caller backs off
// and stands by again).
func (s *sessions) wait(ctx context.Context, key string, sub *Subscription, g *group) (standbyResult, error) {
	w := &waiter{key: key, sub: sub, g: g, got: make(chan standbyResult, 1)}
	s.mu.Lock()
	s.waiting[w] = struct{}{}
	s.start()
	s.mu.Unlock()
	select {
	case r := <-w.got:
		return r, r.err
	case <-ctx.Done():
	}
	s.mu.Lock()
	w.gone = true
	delete(s.waiting, w)
	s.changed()
	s.mu.Unlock()
	// A lock handed over before gone was set is in w.got (hand sends under
	// s.mu); after it, the poller gives back what it takes for w.
	select {
	case r := <-w.got:
		if r.lock != nil {
			s.release(context.WithoutCancel(ctx), r.lock)
		}
	default:
	}
	return standbyResult{}, errors.Wrapf(ctx.Err(), "catchup: standing by for %q", key)
}

// release gives l back on the lock session, announced, and waits until it
// is (or ctx ends, or the session is lost, which frees it too).
func (s *sessions) release(ctx context.Context, l *sharedLock) {
	s.mu.Lock()
	if l.Err() != nil || s.held[l.key] != l {
		s.mu.Unlock()
		return
	}
	r := &releaseReq{lock: l, done: make(chan struct{})}
	s.releases = append(s.releases, r)
	s.start()
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	select {
	case <-r.done:
	case <-l.lost:
	case <-ctx.Done():
	}
}

// changed makes the poller look at its state now: it cuts the poller's
// wait for the next poll (or its backoff) short. The caller holds s.mu.
func (s *sessions) changed() {
	if s.current != nil {
		s.current.Interrupt()
	}
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// state is what one poll works on, copied under s.mu.
type state struct {
	releases  []*releaseReq
	departing []*group
	groups    []*group
	byKey     map[string][]*waiter
	keys      []string // distinct waited keys
}

// snapshot copies the state; ok is false (and the poller ends) when there
// is nothing to do and nothing held.
func (s *sessions) snapshot(haveSession bool) (st state, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.waiting) == 0 && len(s.held) == 0 && len(s.releases) == 0 && len(s.groups) == 0 &&
		(len(s.departing) == 0 || !haveSession) {
		s.running = false
		s.current = nil
		s.departing = nil
		close(s.stopped)
		return st, false
	}
	st.releases, s.releases = s.releases, nil
	st.departing = slices.Clone(s.departing)
	for _, g := range s.groups {
		st.groups = append(st.groups, g)
	}
	st.byKey = map[string][]*waiter{}
	for w := range s.waiting {
		if st.byKey[w.key] == nil {
			st.keys = append(st.keys, w.key)
		}
		st.byKey[w.key] = append(st.byKey[w.key], w)
	}
	return st, true
}

// poll is the poller goroutine; it returns when nothing is waited for or held.
func (s *sessions) poll(stopped chan struct{}) {
	log := s.e.cfg.Logger
	var sb *advisorylock.Standby
	closeSession := func() {
		if sb != nil {
			s.setCurrent(nil)
			ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
			_ = sb.Close(ctx)
			cancel()
			sb = nil
		}
	}
	defer closeSession()
	ctx := context.Background()
	backoff := s.e.cfg.RetryBackoff
	// opened is when the session was opened. s.quick (kept across
	// pollers: one ends when nothing is waited for, as happens for a
	// moment after a session ends) counts the sessions in a row that ended
	// within sessionSettle of it (see below).
	var opened time.Time
	for {
		st, ok := s.snapshot(sb != nil)
		if !ok {
			return
		}
		if sb == nil {
			s.finishReleases(st.releases) // nothing is held without a session
			s.dropDeparted(st.departing)
			dctx, cancel := context.WithTimeout(ctx, standbyDialTimeout)
			var err error
			sb, err = advisorylock.NewStandby(dctx, s.e.connConfig, s.e.cfg.Lock)
			cancel()
			if err != nil {
				sb = nil
				// The waiters return the error (Run logs it and backs off,
				// CatchUp fails with it), as a failed connect would.
				s.failWaiters(errors.Wrap(err, "catchup: open the lock session"))
				s.sleep(jitter(backoff))
				backoff = min(backoff*2, max(maxReconnectBackoff, s.e.cfg.RetryBackoff))
				continue
			}
			s.setCurrent(sb)
			opened = time.Now()
			continue // look at the state again: it may have changed while dialling
		}
		if err := s.cycle(ctx, sb, st); err != nil {
			log.Warn("annals: lock session failed; reconnecting", telemetry.Err(err))
			s.lost(err)
			closeSession()
			s.sleep(jitter(backoff))
			backoff = min(backoff*2, max(maxReconnectBackoff, s.e.cfg.RetryBackoff))
			continue
		}
		backoff = s.e.cfg.RetryBackoff
		if _, err := sb.Wait(ctx, pollJitter(s.e.cfg.LockRetryInterval)); err != nil {
			log.Warn("annals: lock session lost; reconnecting", telemetry.Err(err))
			s.lost(err)
			closeSession()
			// A session that ends is replaced at once, and its partitions
			// stand by again at once (Run), so that they are led again
			// within a poll. A session that keeps ending soon after it
			// opened (a proxy that cuts it, an idle_session_timeout below
			// LockRetryInterval, a loop of pg_terminate_backend) would have
			// every partition claimed again at reconnect speed: from the
			// second such end in a row on, the reconnect backs off.
			if time.Since(opened) < sessionSettle {
				s.quick++
			} else {
				s.quick = 0
			}
			if s.quick > 1 {
				// As a failed dial's: RetryBackoff doubled per end in a row,
				// up to a second (or RetryBackoff, if longer).
				// Not s.sleep: waiters that come back as their leaderships
				// end must not cut it short.
				_ = sleep(context.Background(), jitter(min(s.e.cfg.RetryBackoff<<min(s.quick-2, 10), max(maxReconnectBackoff, s.e.cfg.RetryBackoff))))
			}
		}
	}
}

// sessionSettle is how long a lock session must have lived for its end
// to be taken as a one-off (reconnected at once) rather than as part of a
// series (reconnected with the back-off).
const sessionSettle = 10 * time.Second

// cycle is one poll on the session: give back what is released, see who
// the members of each balanced subscriber are, ask leaders above their
// share to hand over, and take free locks for the waiters.
func (s *sessions) cycle(ctx context.Context, sb *advisorylock.Standby, st state) error {
	// 1. Give back: released leads, and the slots of departed memberships
	// (announced, so that the other members look at once).
	var give []string
	for _, r := range st.releases {
		give = append(give, r.lock.key)
	}
	for _, g := range st.departing {
		if g.slot >= 0 {
			give = append(give, memberKey(s.e.schema, g.name, g.slot))
		}
	}
	if len(give) > 0 {
		if _, err := sb.Give(ctx, give); err != nil {
			s.requeue(st.releases)
			return err
		}
	}
	s.finishReleases(st.releases)
	s.dropDeparted(st.departing)

	// 2. Who holds what: the member slots and the partitions of every
	// balanced subscriber, from pg_locks.
	var probe []string
	for _, g := range st.groups {
		for i := range g.slots() {
			probe = append(probe, memberKey(s.e.schema, g.name, i))
		}
		for p := range g.partitions {
			probe = append(probe, LockKey(s.e.schema, g.name, p))
		}
	}
	busy := map[string]bool{}     // held or queued for
	granted := map[string]int32{} // held: by this backend
	if len(probe) > 0 {
		if err := s.lockStates(ctx, sb, probe, busy, granted); err != nil {
			return err
		}
	}

	// 3. The share of each balanced subscriber, handovers, and what to take.
	var take []string
	takeSlot := map[string]*group{}
	s.mu.Lock()
	// Keys this session holds already (another Run or a CatchUp of the same
	// partition on this engine leads it): pg_try_advisory_lock would take
	// them again on the same session, so their waiters wait for the
	// release instead.
	held := make(map[string]bool, len(s.held))
	for k := range s.held {
		held[k] = true
	}
	leads := map[*group]int{}
	var ledOf = map[*group][]*sharedLock{}
	for _, l := range s.held {
		if l.g != nil && !l.leaving {
			leads[l.g]++
			ledOf[l.g] = append(ledOf[l.g], l)
		}
	}
	s.mu.Unlock()
	want := map[*group]int{}
	announce := false
	defer func() {
		if announce {
			s.announceMembers(ctx, sb)
		}
	}()
	for _, g := range st.groups {
		var live []int
		var pids []int32
		probed := g.slots()
		for i := range probed {
			if pid, ok := granted[memberKey(s.e.schema, g.name, i)]; ok {
				live, pids = append(live, i), append(pids, pid)
			}
		}
		highest := -1
		if len(live) > 0 {
			highest = live[len(live)-1]
		}
		g.probe = min(MaxMembers, max(16, 2*(highest+1)))
		if g.slot < 0 {
			free := -1
			for i := range probed {
				if !busy[memberKey(s.e.schema, g.name, i)] {
					free = i
					break
				}
			}
			switch {
			case free >= 0:
				k := memberKey(s.e.schema, g.name, free)
				take = append(take, k)
				takeSlot[k] = g
				want[g] = 0 // take a share once a member
			case probed < MaxMembers:
				g.probe = MaxMembers // look at every slot at the next poll
				want[g] = 0
			default:
				want[g] = g.partitions // every slot is taken: run greedily
			}
			continue
		}
		n := max(len(live), 1)
		rank := max(slices.Index(live, g.slot), 0)
		off := int(uint32(lockkeyHash(g.name)) % uint32(n))
		pos := (rank - off + n) % n
		if g.members > 0 && g.members != n {
			// Membership changed (a member died or joined): wake the other
			// members' lock sessions so that they see it now, not at their
			// next poll.
			announce = true
		}
		g.members, g.pos = n, pos
		target := g.partitions / n
		if extra := g.partitions % n; extra > 0 && len(live) > 0 {
			// The members that lead one more are those that lead the most
			// now (sticky: a member joining takes nobody's extra one), ties
			// broken by position; every member sees the same pg_locks and
			// orders them alike.
			leadsOf := map[int32]int{}
			for p := range g.partitions {
				if pid, ok := granted[LockKey(s.e.schema, g.name, p)]; ok {
					leadsOf[pid]++
				}
			}
			order := make([]int, len(live)) // indexes into live, by rank
			for i := range order {
				order[i] = i
			}
			slices.SortStableFunc(order, func(a, b int) int {
				if c := cmp.Compare(leadsOf[pids[b]], leadsOf[pids[a]]); c != 0 {
					return c
				}
				return cmp.Compare((a-off+n)%n, (b-off+n)%n)
			})
			if slices.Index(order, rank) < extra {
				target++
			}
		}
		led := leads[g]
		if led > target {
			if g.over++; g.over >= 2 {
				// Over the share at two polls in a row (not a view one poll
				// old): hand the excess over.
				excess := ledOf[g]
				rand.Shuffle(len(excess), func(i, j int) { excess[i], excess[j] = excess[j], excess[i] })
				for _, l := range excess[:led-target] {
					l.askHandover()
				}
				g.over = 0
			}
		} else {
			g.over = 0
		}
		want[g] = max(target-led, 0)
	}
	// Free partitions for each balanced group, starting at a place that
	// depends on this member's position so that members taking at the same
	// poll take different ones.
	freeOf := map[*group][]*waiter{}
	now := time.Now()
	seen := make(map[string]bool, len(st.keys))
	// With Config.HolderWarnAfter: the wanted partitions that another
	// session holds (the holder's pid, 0: unknown yet), and those whose run
	// of such polls goes on unobserved in this poll (see heldRun).
	var hs heldSeen
	if s.e.cfg.HolderWarnAfter > 0 {
		hs = heldSeen{on: true}
	}
	for _, k := range st.keys {
		ws := st.byKey[k]
		if at, ok := s.retryAt[k]; ok {
			if now.Before(at) {
				hs.keepRun(k)
				continue // its claim timed out a moment ago
			}
			delete(s.retryAt, k)
		}
		if held[k] {
			continue
		}
		if g := ws[0].g; g != nil {
			seen[k] = true
			if busy[k] {
				delete(s.freeSince, k)
				if pid, ok := granted[k]; ok {
					switch {
					case want[g] > 0: // owed a partition, and this one is held
						hs.held(k, pid)
					case g.slot < 0: // not a member yet: no share to tell
						hs.keepRun(k)
					}
				}
				continue
			}
			since, ok := s.freeSince[k]
			if !ok {
				s.freeSince[k] = now
			}
			switch {
			case want[g] > 0:
				freeOf[g] = append(freeOf[g], ws[0])
			case ok && now.Sub(since) >= orphanGrace:
				take = append(take, k) // orphaned: see orphanGrace
			}
			continue
		}
		take = append(take, k) // unbalanced: whenever free
	}
	for k := range s.freeSince {
		if !seen[k] {
			delete(s.freeSince, k)
		}
	}
	for k := range s.retryAt {
		if st.byKey[k] == nil {
			delete(s.retryAt, k)
		}
	}
	for k := range s.blocked {
		if st.byKey[k] == nil {
			delete(s.blocked, k)
		}
	}
	for g, free := range freeOf {
		slices.SortFunc(free, func(a, b *waiter) int { return cmp.Compare(a.sub.Partition, b.sub.Partition) })
		start := 0
		if g.members > 0 {
			start = g.pos * len(free) / g.members
		}
		for i := range min(want[g], len(free)) {
			take = append(take, free[(start+i)%len(free)].key)
		}
	}
	if len(take) == 0 {
		s.watchHeld(ctx, sb, st, hs)
		return nil
	}
	rand.Shuffle(len(take), func(i, j int) { take[i], take[j] = take[j], take[i] })
	won, err := sb.Take(ctx, take)
	if err != nil {
		return err
	}
	if hs.on {
		// An unbalanced partition's lock that was not won is held by
		// another session (which one, the check finds out).
		got := make(map[int]bool, len(won))
		for _, i := range won {
			got[i] = true
		}
		for i, k := range take {
			if ws := st.byKey[k]; !got[i] && takeSlot[k] == nil && len(ws) > 0 && ws[0].g == nil {
				hs.held(k, 0)
			}
		}
	}
	var giveBack []string
	for _, i := range won {
		k := take[i]
		if g := takeSlot[k]; g != nil {
			s.mu.Lock()
			if g.leaving {
				giveBack = append(giveBack, k)
			} else {
				g.slot = slotOf(k)
				announce = true // the members' shares change: wake them
				s.changed()     // and compute ours at once
			}
			s.mu.Unlock()
			continue
		}
		w := s.pick(st.byKey[k])
		if w == nil {
			giveBack = append(giveBack, k)
			continue
		}
		// Claim on the session, in this poll: no pool connection is needed
		// to take over.
		var cp checkpoint.Checkpoint
		cerr := sb.Do(ctx, func(conn *pgx.Conn) error {
			var err error
			cp, err = s.e.claimBounded(ctx, conn, w.sub)
			return err
		})
		switch {
		case cerr == nil:
			delete(s.blocked, k)
			if !s.hand(k, w, cp, sb.PID()) {
				giveBack = append(giveBack, k) // its wait ended meanwhile
			}
		case isConnErr(cerr):
			s.fail(w, cerr)
			return cerr // the session's end frees what it took
		case isClaimTimeout(cerr):
			// The checkpoint row is held: give the lock back and stand by
			// again (another instance may claim meanwhile; that is fine).
			s.logClaimTimeout(ctx, k, w, cerr)
			s.unpick(w)
			s.retryAt[k] = time.Now().Add(claimRetryPause)
			giveBack = append(giveBack, k)
		default:
			s.fail(w, cerr)
			giveBack = append(giveBack, k)
		}
	}
	if len(giveBack) > 0 {
		if _, err := sb.Give(ctx, giveBack); err != nil {
			return err
		}
	}
	s.watchHeld(ctx, sb, st, hs)
	return nil
}

// announceMembers tells the other lock sessions, on the release channel,
// that the membership changed, so that they poll at once. Best effort: a
// session that misses it sees the change at its next poll.
func (s *sessions) announceMembers(ctx context.Context, sb *advisorylock.Standby) {
	channel := s.e.cfg.Lock.ReleaseChannel
	if channel == "" {
		return
	}
	_ = sb.Do(ctx, func(conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, "SELECT pg_notify($1, 'members')", channel)
		return err
	})
}

// slots returns how many member slots the next poll looks at.
func (g *group) slots() int {
	if g.probe <= 0 {
		return MaxMembers
	}
	return g.probe
}

// slotOf returns the slot number at the end of a member key.
func slotOf(key string) int {
	i := len(key)
	for i > 0 && key[i-1] >= '0' && key[i-1] <= '9' {
		i--
	}
	n := 0
	for _, c := range key[i:] {
		n = n*10 + int(c-'0')
	}
	return n
}

// lockkeyHash is a stable hash of a subscriber name: it rotates which
// members lead one partition more, so that several subscribers with the
// same number of partitions do not all load the same instances.
func lockkeyHash(name string) int32 {
	k1, _ := lockkey.Pair(name)
	return k1
}

// askHandover asks the leader of l to hand it over (finish the batch in
// hand, flush, release).
func (l *sharedLock) askHandover() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.leaving {
		l.leaving = true
		close(l.handover)
	}
}

// lockStates looks up which of keys are held (granted) or waited for (busy)
// by any session, in one statement on the lock session.
func (s *sessions) lockStates(ctx context.Context, sb *advisorylock.Standby, keys []string, busy map[string]bool, granted map[string]int32) error {
	k1, k2 := make([]int32, len(keys)), make([]int32, len(keys))
	for i, k := range keys {
		k1[i], k2[i] = lockkey.Pair(k)
	}
	return sb.Do(ctx, func(conn *pgx.Conn) error {
		rows, err := conn.Query(ctx, s.e.q["LockStates"], k1, k2)
		if err != nil {
			return errors.Wrap(err, "catchup: read the lock states")
		}
		var i int64
		var g bool
		var pid int32
		_, err = pgx.ForEachRow(rows, []any{&i, &g, &pid}, func() error {
			busy[keys[i-1]] = true
			if g {
				granted[keys[i-1]] = pid
			}
			return nil
		})
		return errors.Wrap(err, "catchup: read the lock states")
	})
}

// pick takes one of ws that still waits out of waiting (the lock of its
// key was just taken for it), or returns nil.
func (s *sessions) pick(ws []*waiter) *waiter {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, w := range ws {
		if _, ok := s.waiting[w]; ok {
			delete(s.waiting, w)
			return w
		}
	}
	return nil
}

// hand gives w the lock of key, taken and claimed on the shared session
// (whose server PID is server), unless w's wait has ended (it returns
// false: give the lock back).
func (s *sessions) hand(key string, w *waiter, cp checkpoint.Checkpoint, server uint32) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if w.gone {
		return false
	}
	l := &sharedLock{key: key, part: w.sub.Partition, g: w.g, server: server, lost: make(chan struct{}), handover: make(chan struct{})}
	s.held[key] = l
	w.got <- standbyResult{lock: l, epoch: cp.Epoch, start: cp.Position} // buffered: one result per pick
	return true
}

// fail hands w the error of its claim.
func (s *sessions) fail(w *waiter, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !w.gone {
		w.got <- standbyResult{err: err}
	}
}

// unpick puts w back among the waiters (its claim timed out), unless its
// wait has ended.
func (s *sessions) unpick(w *waiter) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !w.gone {
		s.waiting[w] = struct{}{}
	}
}

// logClaimTimeout notes a claim of partition key k that timed out on a
// held checkpoint row: at debug level each time, and at WARN once the
// partition's claims have kept timing out for claimBlockedWarn (a
// transaction holding the row, an operator's say, keeps it without a
// leader), then every claimBlockedWarn while they do.
func (s *sessions) logClaimTimeout(ctx context.Context, k string, w *waiter, err error) {
	now := time.Now()
	b := s.blocked[k]
	if b == nil {
		b = &claimBlock{since: now}
		s.blocked[k] = b
	}
	if now.Sub(b.since) >= claimBlockedWarn && now.Sub(b.warned) >= claimBlockedWarn {
		b.warned = now
		s.e.cfg.Logger.WarnContext(ctx, "annals: the partition has no leader: its checkpoint row is held by another transaction, "+
			"so every claim times out (look for a long transaction on the checkpoints table in pg_stat_activity)",
			slog.String("subscriber", w.sub.Name), slog.Int("partition", w.sub.Partition),
			slog.Duration("blocked_for", now.Sub(b.since).Round(time.Second)), telemetry.Err(err))
		return
	}
	s.e.cfg.Logger.DebugContext(ctx, "annals: the checkpoint row is held; standing by again",
		slog.String("subscriber", w.sub.Name), slog.Int("partition", w.sub.Partition), telemetry.Err(err))
}

// isClaimTimeout reports whether a claim failed because it waited too
// long for the checkpoint row (claimLockTimeout, or a statement_timeout of
// the server's).
func isClaimTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "55P03" || pgErr.Code == "57014")
}

// isConnErr reports whether err comes from a connection that is gone
// rather than from the statement.
func isConnErr(err error) bool {
	var pgErr *pgconn.PgError
	return !errors.As(err, &pgErr)
}

// finishReleases marks released locks given back.
func (s *sessions) finishReleases(rs []*releaseReq) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range rs {
		if s.held[r.lock.key] == r.lock {
			delete(s.held, r.lock.key)
		}
		r.lock.end(errors.Wrapf(advisorylock.ErrReleased, "catchup: lock %q", r.lock.key))
		close(r.done)
	}
}

// requeue puts releases back for the next poll (the session failed).
func (s *sessions) requeue(rs []*releaseReq) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.releases = append(rs, s.releases...)
}

// dropDeparted forgets departed memberships whose slot was given back.
func (s *sessions) dropDeparted(gs []*group) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, g := range gs {
		g.slot = -1
		s.departing = slices.DeleteFunc(s.departing, func(d *group) bool { return d == g })
	}
}

// lost marks everything the session held lost: its end freed every lock.
func (s *sessions) lost(cause error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, l := range s.held {
		l.end(errors.Wrapf(errmark.Mark(cause, advisorylock.ErrLost), "catchup: lock %q: %s", k, advisorylock.ErrLost))
		delete(s.held, k)
	}
	for _, g := range s.groups {
		g.slot, g.over, g.probe = -1, 0, 0
	}
	for _, g := range s.departing {
		g.slot = -1
	}
	s.departing = nil
	for _, r := range s.releases {
		close(r.done)
	}
	s.releases = nil
}

// failWaiters hands err to every waiter.
func (s *sessions) failWaiters(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for w := range s.waiting {
		delete(s.waiting, w)
		w.got <- standbyResult{err: err}
	}
}

// setCurrent records the poller's session.
func (s *sessions) setCurrent(sb *advisorylock.Standby) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.current = sb
}

// sleep waits for d or until something changes.
func (s *sessions) sleep(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-s.wake:
	}
}

// pollJitter returns d ±25%: standby processes drift apart, yet the longest
// wait stays close to d.
func pollJitter(d time.Duration) time.Duration {
	return d*3/4 + rand.N(d/2+1)
}

// standBy waits, standing by, until this process holds sub's lock, then
// claims the checkpoint (bumping the epoch) and returns the lease.
func (e *Engine) standBy(ctx context.Context, sub *Subscription, g *group) (*Lease, error) {
	if err := e.CheckLayout(ctx, sub); err != nil {
		return nil, err
	}
	r, err := e.sessions.wait(ctx, LockKey(e.schema, sub.Name, sub.Partition), sub, g)
	if err != nil {
		return nil, err
	}
	lease := e.newLease(sub)
	lease.shared, lease.Epoch, lease.Start = r.lock, r.epoch, r.start
	if e.cfg.OnLeadership != nil {
		e.cfg.OnLeadership(lease.Subscriber, lease.Partition, lease.Epoch, true)
	}
	return lease, nil
}

// newLease returns a lease of sub without a lock.
func (e *Engine) newLease(sub *Subscription) *Lease {
	return &Lease{Subscriber: sub.Name, Partition: sub.Partition, checkpoints: e.checkpoints,
		commitSQL: e.q["CommitFenced"], commitHeldSQL: e.q["CommitFencedHeld"], notifySQL: e.q["NotifyCheckpoint"], asyncSQL: e.q["AsyncCommit"], pool: e.pool}
}

// claim claims the checkpoint of the lease's partition for its lock's
// holder: epoch + 1, owner = this engine. On failure it releases the lock.
func (e *Engine) claim(ctx context.Context, sub *Subscription, lease *Lease) (*Lease, error) {
	err := lease.Do(ctx, func(conn *pgx.Conn) error {
		cp, err := e.claimLaidOut(ctx, conn, sub)
		lease.Epoch, lease.Start = cp.Epoch, cp.Position
		// Known from the claim on: a TakeOver's caller may commit through
		// the lease before any Drive (see Lease.CommitTx).
		lease.known.Store(cp.Position)
		return err
	})
	if err != nil {
		e.releaseLock(context.WithoutCancel(ctx), lease)
		return nil, err
	}
	if e.cfg.OnLeadership != nil {
		e.cfg.OnLeadership(lease.Subscriber, lease.Partition, lease.Epoch, true)
	}
	return lease, nil
}

// releaseLock gives the lease's lock back (without OnLeadership).
func (e *Engine) releaseLock(ctx context.Context, lease *Lease) {
	switch {
	case lease.Lock != nil:
		_ = lease.Lock.Release(ctx)
	case lease.shared != nil:
		e.sessions.release(ctx, lease.shared)
	}
}

// lockConfig returns cfg with the engine's release channel set, unless it
// names one.
func lockConfig(cfg *advisorylock.Config, schema string) *advisorylock.Config {
	var c advisorylock.Config
	if cfg != nil {
		c = *cfg
	}
	if c.ReleaseChannel == "" {
		c.ReleaseChannel = releaseChannel(schemaname.Or(schema))
	}
	return &c
}
