// Package console is the operator console of annals: a server-rendered web
// application (an http.Handler) that shows the log, the subscribers, the
// dead letters, the scheduler and the runner instances of one database, and
// lets an operator act on them; plus Prometheus metrics and health checks.
// `annals ui` serves it; a service mounts it in its own mux, as riverui is:
//
//	con, _ := console.New(pool, &console.Config{BasePath: "/annals", Authorizer: myAuth})
//	mux.Handle("/annals/", http.StripPrefix("/annals", con))
//	mux.Handle("/readyz", console.RunnerHealth(runner, pool, nil))
//
// Its links, forms, redirects and cookies are made under Config.BasePath;
// without one, under the prefix the router took off the request's path
// (http.StripPrefix("/annals", con) alone is enough). BasePath is needed
// when the path the browser sees is not the one the service is asked for:
// behind a proxy that strips a prefix of its own.
//
// # Pages
//
// Every page is rendered on the server with html/template from templates
// embedded in the binary, with one stylesheet and one small script (also
// embedded: nothing is loaded from elsewhere, and the Content-Security-Policy
// allows only this origin). Without JavaScript everything works but the live
// follow; with it, dangerous forms ask for confirmation.
//
//	/                    overview: head, appends per minute over the last hour (a
//	                     sparkline, counted among the newest 100,000 events),
//	                     subscriber partitions with kind, lag, leader, state and
//	                     dead letters, instances, timers
//	/streams             streams by ID prefix, keyset-paged
//	/streams/{id}        a stream's events by version, 50 a page
//	/events              the whole log paged by position, filtered by event-type
//	                     globs (catchup.Filter's syntax); "Follow live" opens
//	/events/follow       server-sent events: the log after a position, polled
//	                     every FollowInterval, resumable with Last-Event-ID;
//	                     "failure" while the log cannot be read, "recovered"
//	                     once it can again
//	/events/{pos}        one event: data and metadata pretty-printed
//	/events/{pos}/data   the data (or /metadata) whole, as stored (JSON)
//	/subscribers/{name}  kind, partitions (leader, epoch, checkpoint, lag, stop),
//	                     failures in progress (with the next retry, which the
//	                     runner records in failures.retry_at), checkpoint set
//	/dead-letters[/{id}] list with filters, one with its error, stack and event;
//	                     retry, skip (one or many), retry all, purge
//	/scheduler           cron tasks with their next tick, pause and resume;
//	                     pending and failed timers
//	/instances           runner instances, heartbeat age, live, lost or stale;
//	                     the physical standbys streaming from the server, with
//	                     their replay lag, when there are any
//	/audit               the audit log
//	/metrics /healthz /readyz
//
// A partition's leader and an instance's state follow the rule of `annals
// status` (package internal/leadership, which both apply): the partition's
// advisory lock, read live from pg_locks, has the last word. Its lock free,
// nobody leads, even while the heartbeat of an instance killed a moment ago
// still lists it (that instance is lost); held, the live instance whose
// heartbeat lists it leads, unless another has claimed the checkpoint since;
// held and listed by none, the checkpoint's owner. A leader whose heartbeat
// is stale (a hung process still holding the lock) is shown as such, and is
// no live leader for the health checks and the led gauge. So is a lock held
// by a session that no live instance lists and no registered instance owns
// (a runner that died behind a transaction-mode pooler whose server session
// kept the lock, a psql session): its state is "no live instance", its
// leader "OWNER (lock held by backend PID, no live instance)" with a note
// naming the backend and the remedy, as `annals status` says it; a
// rebuild's (rebuild:ID) is not.
//
// Reads are bounded: lag is counted up to 10,000 events (beyond, head -
// position), a filtered page of the log scans at most 100,000 positions, the
// lists are paged. So are their bytes: a page of the log or of a stream and
// the live follow carry the first 2,000 characters of each event's data and
// metadata (cut in SQL, so a big payload does not cross the wire), with a
// note of the whole size and a link to the event, whose page shows up to
// 1,048,576 characters of each; /events/{pos}/data and /metadata serve one
// whole. A page's
// several reads run in one read-only REPEATABLE READ transaction, so they
// agree.
//
// Stored text (stream IDs, event types, data, errors, names) is shown with
// every character that can disguise it (package plaintext's Disguising:
// control characters, bidirectional formatting characters such as U+202E,
// U+2028 and U+2029) written as \uXXXX, as the command line prints it;
// links and form values keep the real text. A path segment "." or ".." is
// linked as %2E or %2E%2E, which a browser does not resolve away.
//
// # Who may write
//
// Reading needs nobody. A write (every POST) passes four checks, in order,
// and any refusal changes nothing (a request with a wrong
// "Authorization: Bearer" token, one neither the token nor the Authorizer
// accepts, is refused first: 401):
//
//  1. CSRF: the form carries a token, HMAC(key, a random per-browser
//     cookie), and an Origin header, when the browser sends one, names
//     this host. A request authenticated with "Authorization: Bearer"
//     carries no ambient credential and needs no token. Cookies are
//     HttpOnly and SameSite=Strict.
//  2. Not read-only (Config.ReadOnly, `annals ui --read-only`).
//  3. An operator principal: from Config.Authorizer (the embedding service's
//     own login), or from the token (Config.AuthToken): a bearer header, or a
//     session cookie the login form sets, signed with the key and the
//     token, holding the name the operator gave and an expiry (12 hours).
//     A bearer request names its operator in an X-Annals-Actor header;
//     without one (or with one that is no name: empty, longer than 100
//     characters, or with a control or bidirectional formatting character)
//     its operator, and the actor of its audit entry, is "token".
//  4. The database role may do it: it holds the operator privileges of
//     `annals grant operator` (checked with has_table_privilege, each
//     privilege on its own, cached for 30 s). Otherwise the database would refuse half-way; the console says
//     so first.
//
// The key that signs the cookies is Config.SessionKey (at least 32 random
// bytes), else random per process. Replicas behind one load balancer must
// be given the same SessionKey, or a login or a form one made is refused
// by another (and a restart signs everyone out). It is never derived from
// the AuthToken: the login page gives any visitor a CSRF cookie and its
// token, from which such a key would let them test guesses of the token
// offline. A new token signs everyone out whatever the key.
//
// # Actions and the audit log
//
// Dead-letter actions reuse package deadletter (RetryTx, SkipTx,
// RetryAllTx, PurgeTx), the checkpoint set reuses package checkpoint (Move
// bumps the epoch, fencing the running leader off, and a move back settles
// the partition's dead letters after the new position as resolved, as
// `annals checkpoint set` does), pause and resume reuse package scheduler.
// Each action and its audit entry (who: the principal's name, "token" for a
// bearer request without X-Annals-Actor; the database
// role, stamped by a trigger; what: action, target and a JSON detail of
// what changed, a list of none written []; when: the server's clock) commit
// in one transaction, so an entry exists exactly when its change does;
// several IDs in one request are one transaction too (an unknown ID rolls
// them all back). Pause and resume run in the scheduler's own transaction,
// so their entry follows once it has committed. The audit_log table is
// append-only (migration console_audit).
//
// # Metrics and health
//
// Metrics serves the Prometheus text format from a registry holding the
// OpenTelemetry Prometheus exporter (the annals instruments of whatever
// was given Metrics.MeterProvider: appends, batches, handler durations,
// retries, dead letters written, the lag and leadership gauges of the
// partitions this process leads) and a collector that reads the database at
// each scrape, in one snapshot: head, checkpoint, lag, epoch, leader and stop
// of every partition, dead letters by status, instances, timers. Those are
// right whichever process runs the subscribers. docs/operations.md lists the
// series; docs/grafana-dashboard.json charts them.
//
// Liveness (/healthz) answers while the process serves. Readiness (/readyz)
// reads the database; RunnerHealth is the one call a service embedding a
// projection.Runner makes: 503 unless every registered subscriber partition
// has a checkpoint, a live leader somewhere (this process or another), no
// Stop, and a lag within HealthConfig's limits.
//
// A subscriber's kind (projection, observer, saga, processor, relay, tail)
// is what the runner recorded in subscriber_layouts.kind (migration 0044),
// read as `annals status` reads it: "-" when unknown, also on a schema
// before 0044 and for a role that may not read subscriber_layouts. The
// standbys are pg_stat_replication's physical walsenders (the WAL sources'
// logical ones left out), as `annals status` lists them; a role without
// pg_read_all_stats sees that they exist, their details hidden, and the
// page says why.
//
// A retired blue/green generation (<read model>#g<N>, replaced at a
// cut-over and kept for a rollback; read from read_model_generations as
// `annals status` reads it) is run by nobody: its pages show it retired
// (leader "retired (generation N of <read model>)"), readiness passes it,
// and /metrics has its checkpoint and epoch but no led, stopped or lag
// series for it. A building generation (catching up from the log's start
// before its cut-over) is run and judged like any subscriber; its pages
// say which generation of which read model it is, and
// annals_read_model_generation (state "building") lets a lag alert leave
// it out.
package console
