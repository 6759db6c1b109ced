// Package advisorylock elects one leader cluster-wide with PostgreSQL
// session advisory locks: whichever process holds the lock for a key is the
// only one doing that key's work (one subscriber, one partition, one
// scheduler), and it finds out at once when it stops holding it.
//
//	lock, err := advisorylock.TryAcquire(ctx, connConfig, "annals:orders:0", nil)
//	if errors.Is(err, advisorylock.ErrNotAcquired) {
//		// a standby: try again later, with jitter
//	}
//	defer lock.Release(ctx)
//	err = lock.Do(ctx, func(conn *pgx.Conn) error {
//		// a transaction here commits only while the lock is held
//	})
//	select {
//	case <-lock.Lost(): // stop leading; lock.Err() says why
//	case <-ctx.Done():
//	}
//
// # Keys
//
// A key is any non-empty string. The lock is taken with the two-argument
// pg_try_advisory_lock(k1, k2), where k1 and k2 are the first and second four
// bytes of md5(key) as int4 (see Key for the SQL that computes them), a
// 64-bit key space of its own: it never collides with one-bigint advisory
// locks, and the lock of a key can be taken or inspected from SQL too.
//
// # One connection per lock
//
// A session lock belongs to the server session that took it, so TryAcquire
// opens a new connection for each lock, never one from a pool: handing the
// session back to a pool would hand the lock to whoever borrows it next.
// The lock is held as long as that session lives, and no longer: when the
// session ends, however it ends, the server frees the lock.
//
// The connection is opened with Config.Connect, pgx.ConnectConfig unless
// set: the place for credentials that rotate (an IAM token), or for a
// pool's BeforeConnect and AfterConnect hooks, so that the lock's sessions
// log in as the pool's connections do (annals' own packages pass their
// pool's hooks).
//
// Work that must be fenced by the lock runs on that connection, in Do. A
// transaction there (a projection's batch together with its checkpoint, say)
// dies with the session, so a process that has lost the lock cannot commit
// it. Work done elsewhere is not fenced; at most it can check Lost first.
//
// # Noticing a dead peer
//
// Two things must be bounded: how long a dead or frozen holder keeps the
// lock (the server must notice that the client is gone, or stopped), and how long a holder goes on
// believing it leads after its session has ended (the client must notice
// that the server is gone). The lock's connection is therefore set up with
// (see Config):
//
//   - client_connection_check_interval (PostgreSQL 14 or later): the server
//     checks for a vanished client while it runs a query. Without it a holder
//     killed in the middle of a query keeps the lock until the query ends
//     (measured: 7.9 s for an 8 s query; about 0.1 s with a 100 ms interval).
//   - TCP keepalives, on the server (tcp_keepalives_idle, _interval, _count)
//     and on the client socket: an idle connection to a vanished host is
//     dropped after seconds, not after the operating system's default of
//     hours.
//   - TCP user timeout (tcp_user_timeout on the server, TCP_USER_TIMEOUT on
//     the client on Linux): the same while data is waiting to be
//     acknowledged, where keepalives do not apply.
//   - idle_session_timeout (Config.FreezeTimeout, PostgreSQL 14 or later),
//     with a ping of the idle session every third of it: the server ends a
//     session that has sent nothing for that long, which only a holder that
//     stopped running leaves so (see "A frozen holder" below). Unlike the
//     others it is set by the session's first statement (MarkSession, in
//     the round trip of the first lock try), not as a start-up parameter,
//     so it reaches the server through a pooler in session mode too.
//
// # Life cycle
//
//	          TryAcquire
//	              │
//	          acquiring ── lock taken by another session ──► ErrNotAcquired
//	              │                                         (connection closed)
//	              ▼
//	 ┌─────── held, idle ◄──────┐
//	 │       (watching,         │ fn returns, session alive
//	 │        pinging)          │
//	 │            │ Do, Verify  │
//	 │            ▼             │
//	 │      held, in use ───────┘
//	 │            │
//	 │ session    │ session gone, lock not held (Verify),
//	 │ gone,      │ or the connection closed under fn
//	 │ ping failed│
//	 ▼            ▼
//	lost: Lost closed, Err matches ErrLost, connection closed
//
//	held, idle ── process frozen for FreezeTimeout ──► the server ends the
//	              session (the lock is free for others); resumed: lost
//
//	held or lost ── Release ──► released: unlocked, connection closed,
//	                           Lost closed (Err matches ErrReleased,
//	                           or ErrLost if it was lost first)
//
// While the lock is idle, a goroutine (the watcher) blocks reading the
// connection (pgconn's WaitForNotification). A healthy idle session sends
// nothing; a terminated backend sends a FATAL error and closes the socket,
// and a dead connection fails the read (keepalives, user timeout). Either
// ends the read with an error, and the lock is marked lost at once, without
// polling. The watcher also pings the session every third of
// Config.FreezeTimeout (an empty statement, one round trip), keeping that
// cadence across Do and Verify, so that the server never finds a live
// holder's session idle for FreezeTimeout; a failed ping loses the lock.
//
// Do and Verify stop the watcher and wait for it to return before they use
// the connection, and start it again afterwards. Stopping cancels the
// watcher's context, which sets an immediate deadline on the socket; pgconn
// treats the read timeout as not fatal and resumes a message cut in the
// middle, so the connection stays usable (the tests run hundreds of Do calls
// through it, also with notifications arriving). A ping is not cut (pgconn
// closes a connection whose statement is cut): Do waits for its answer, a
// round trip, at most once per ping, or until its ctx ends (a ping the
// server does not answer: Do then returns ctx's error, and Release closes
// the connection). Do, Verify and Release take turns: one uses the
// connection at a time.
//
// # A frozen holder
//
// A holder that stops running while its connections stay up (SIGSTOP, a
// container paused with docker pause or the cgroup freezer, a debugger, a
// VM that is stuck while its host still answers TCP) used to keep its locks
// for ever: the kernel answers TCP keepalives for it, and PostgreSQL keeps
// an idle session. Every lock session is therefore opened with
// idle_session_timeout = Config.FreezeTimeout (30 s by default), and a
// live holder pings it: the watcher of an idle Lock, and a Standby's Wait,
// every third of it. A frozen holder pings nothing, so the server ends its
// session once it has idled for FreezeTimeout, which frees its locks; other
// processes take them at their next try (a Standby's next poll). When the
// frozen process is resumed it finds its session gone: Lost closes, Err
// matches ErrLost, a Standby's Wait fails. Nothing it did under the lock
// commits afterwards: a transaction in Do died with the session, and a
// holder on a shared session fences its commits otherwise (package
// catchup: by epoch).
//
// This covers a session that is idle outside a transaction, where a
// holder that waits for work, or runs it on other connections, spends its
// time. A holder frozen in the middle of a transaction on the lock's
// connection (a projection's batch in Do) leaves it idle in transaction,
// which idle_session_timeout does not end: it keeps the lock until it is
// resumed or its session is ended (pg_terminate_backend).
// idle_in_transaction_session_timeout would end it too, but how long a
// transaction may idle between two statements is its holder's to say, so
// the package does not set it for the session: the holder sets it for the
// transaction (package projection sets it to the handler timeout plus
// FreezeTimeout for every transaction that runs handlers, a rebuild's
// batch on its lock's connection among them). Do's fn must not leave the
// session idle outside a transaction for FreezeTimeout: nothing pings
// while it runs. The timeout is set by a statement (the session's mark, below), so
// it reaches the server through PgBouncer in session mode as well.
//
// # Standing by for many locks: Standby
//
// A process that stands by for many keys (the partitions it does not lead)
// should not hold a connection per key, nor open one per attempt. A Standby
// is one session, set up like a lock's connection, that tries all of them in
// one statement (pg_try_advisory_lock over unnest of the keys' halves):
//
//	sb, err := advisorylock.NewStandby(ctx, connConfig, cfg)
//	for {
//		lock, won, err := sb.TryLock(ctx, keys)
//		if err == nil {
//			// lock holds keys[won[0]] on sb's own session: no connection is
//			// opened in the takeover path. keys[won[1:]] were free too and
//			// have been given back: take them with TryAcquire.
//			break
//		}
//		if !errors.Is(err, advisorylock.ErrNotAcquired) { ... sb.Close, reconnect }
//		sb.Wait(ctx, interval) // or until a release is announced
//	}
//
// A Standby holds no lock between calls, so nothing it does can keep a
// leader from its lock, and its death frees nothing. Its poll costs one
// round trip and a lookup in the server's lock table per key; while
// standing by it is an idle session.
//
// A Standby's session, too, is opened with FreezeTimeout, and Wait pings
// it when it has run no statement for a third of it (a standby that polls
// every few milliseconds never does). The alternative, a session without
// the timeout that sets it when TryLock wins, would add a round trip (SET)
// to the takeover after a leader's crash, which otherwise costs one
// statement; and a Standby that keeps what it takes (Take, below) holds
// leaders' locks on that very session, which must be evicted when its
// process freezes. So every lock session has it from its first statement
// (the mark, in NewStandby's round trip, and in TryAcquire's and Acquire's
// first round trip), and TryLock's Lock needs nothing more: its watcher
// pings from then on.
//
//	NewStandby ──► standing by ◄────────────┐
//	(LISTEN on     │ TryLock                │ none free (ErrNotAcquired):
//	ReleaseChannel)│                        │ Wait for the interval, or
//	               ├────────────────────────┘ until a release is announced
//	               │ some free: keep the first, give back the rest,
//	               │ UNLISTEN, drop buffered notifications
//	               ▼
//	spent: its session is now a Lock's (held, idle; see Life cycle)
//
//	standing by ── session gone (Wait or TryLock fails) / Close ──► closed
//
// With Config.ReleaseChannel set, Release unlocks and announces the key on
// that channel in one statement (pg_notify; the notification is delivered
// when the statement commits, after the unlock), and a Standby LISTENs on
// it, so a graceful handover does not wait for the next poll. A holder that
// dies announces nothing; the standbys' next poll finds its lock free, since
// PostgreSQL frees it within a millisecond of the session's end.
//
// # Keeping many locks on one session: Take and Give
//
// A Standby can also keep what it takes: Take tries keys in one statement
// and keeps every lock it wins on the standby's session, which stays
// usable (Wait, Take, Give go on); Give unlocks keys and announces each on
// the ReleaseChannel, in one statement. A process can thus hold every lock
// it leads and stand by for the rest on one connection (package catchup's
// lock session, whose poller calls Wait every LockRetryInterval). Nothing
// but Wait pings that session: its owner must call Wait (or run a
// statement) at least every third of FreezeTimeout while it holds locks,
// or a live process loses them as a frozen one would. The locks then fence nothing by themselves (they are not
// on the connection that does the work): whoever holds them must fence its
// writes otherwise, as catchup does with an epoch and a pg_locks check in
// the commit. Do runs statements of the caller's on the session (a look at
// pg_locks in the same round-trip cadence).
//
// # Waiting in the queue: Acquire
//
// Acquire takes a lock the blocking way, pg_advisory_lock: its session
// queues and is granted the lock the moment the holder's session lets go.
// Queued, it is ahead of every standby: pg_try_advisory_lock fails while
// another session waits for the lock, so polling standbys cannot snatch it.
// It costs a connection per waiting key, so it is for one-off takeovers (a
// rebuild's), not for standing by. Its wait is bounded by its context
// alone: a lock_timeout or statement_timeout of the role or the database
// is lifted for the wait (SET LOCAL in the wait's transaction) and applies
// again to the work done under the lock.
//
// # PgBouncer and other poolers
//
// A pooler in transaction or statement pooling mode breaks session advisory
// locks: the lock would belong to a server connection that the pooler hands
// to other clients between transactions, so it would be neither held by
// this process alone nor freed when this process dies, and pg_advisory_unlock
// might run on a different server connection. The lock's connection must go
// to PostgreSQL directly or through a pooler in session mode. (The rest of
// an application may use transaction pooling; only connConfig matters here.)
//
// Two checks catch the mistake. PgBouncer refuses the start-up parameters
// every lock connection sends (keepalives, user timeout, check interval)
// unless told to ignore them: connecting then fails with an error that
// says the above. And every lock session marks its server session (a
// random value in the custom setting annals.standby_session, whose name
// predates the single locks' use of it) and takes locks only on a session
// that carries its mark, checked in the statement that takes them; on
// another it takes nothing and fails with ErrPooledSession: the pooler ran
// the statement on another server session, one that may already hold
// another process's locks (re-entrant on a session: both would lead). It
// marks only a server session that holds no advisory lock (and fails with
// ErrPooledSession on one that does): otherwise a second lock session
// handed the first's server session, a second process or the first
// reconnecting, would mark it its own and take the first's locks again.
// Marking a server session that holds nothing replaces the mark of a lock
// session that was there before, whose statements then take nothing on it.
//
// A Standby marks its session at connect (NewStandby), and TryLock and
// Take check the mark. TryAcquire and Acquire send the mark in the round
// trip that takes the lock (before it, in the same transaction: no round
// trip more, one expression more in the lock statement, and a look at
// pg_locks for the session's own advisory locks); so they take a lock only
// on a server session that held none, where no other lock session's mark
// survives. AcquireQueued with asking reads the PID with the mark, a round
// trip before the wait, and the wait's lock checks it, so the PID it
// reports is the one of the session that waits. A pooler with a single
// server session, and a single client, passes the check, and there it does
// no harm; TryAcquire or Acquire that land alone on a server session of a
// transaction pooler take their lock there, which no other lock session
// can then take as well, but which is freed only when the pooler closes
// that server session, not when the holder's process ends.
package advisorylock
