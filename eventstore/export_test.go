package eventstore

import (
	"context"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// QueuedAppends reports how many appends wait in s's group-commit queue (not
// yet taken by a group), for tests that arrange a group.
func QueuedAppends(s *Store) int {
	if s.group == nil {
		return 0
	}
	s.group.mu.Lock()
	defer s.group.mu.Unlock()
	return len(s.group.queue)
}

// GroupsInFlight reports how many groups s's committer has sent and not
// finished with (a finished group's bookkeeping, linger included, runs after
// its appenders have their outcomes).
func GroupsInFlight(s *Store) int {
	if s.group == nil {
		return 0
	}
	s.group.mu.Lock()
	defer s.group.mu.Unlock()
	return s.group.inFlight
}

// KeyCacheLen reports how many subjects s's key ring caches.
func KeyCacheLen(s *Store) int { return s.keys.cacheLen() }

// InlineLockKey is inlineLockKey, which the schema's inline_stream_lock
// computes alike in SQL.
func InlineLockKey(schema, stream string) (int32, int32) { return inlineLockKey(schema, stream) }

// AppendThroughJSONB makes s send its appends in transactions (and alone)
// through append_events, as before migration 0035, for benchmarks that
// compare it with append_events_json.
func AppendThroughJSONB(s *Store) {
	conn, err := s.pool.Acquire(context.Background())
	if err != nil {
		panic(err)
	}
	defer conn.Release()
	s.appendFns.Store(conn.Conn().PgConn().ParameterStatus(paramSessionUser), &appendChoice{fn: appendFnJSONB, super: appendFnJSONB})
}

// UnreportedSessionUser makes s read the session's user and whether its
// role is a superuser under names no server reports, as behind a proxy
// that does not pass those parameters on: both read as "" (unknown).
func UnreportedSessionUser(s *Store) {
	s.param.sessionUser = "annals_test_unreported_session_authorization"
	s.param.superuser = "annals_test_unreported_is_superuser"
}

// AppendUnchecked sends an append of n events of type typ, each with data
// and meta (nil: none), to stream at any version, without the client's
// checks: through group commit (path "group": append_one for one event,
// append_batch for more) or alone (path "alone": the Store's function for
// appends in a transaction). For tests of how the server's refusals reach
// the caller.
func AppendUnchecked(ctx context.Context, s *Store, path, stream, typ string, data, meta []byte, n int) (AppendResult, error) {
	a := appendArgs{stream: stream, exp: Any, count: n}
	for range n {
		a.events = append(a.events, encodedEvent{id: uuid.New(), typ: typ, data: data, meta: meta})
	}
	if path == "group" {
		return s.group.append(ctx, a)
	}
	return s.appendAlone(ctx, a)
}

// AppendEncodedUncheckedTx is AppendEncodedTx without the client's checks of
// the events' JSON text.
func AppendEncodedUncheckedTx(ctx context.Context, s *Store, tx pgx.Tx, a EncodedAppend) (AppendResult, error) {
	exp, err := a.Expected.sqlArg()
	if err != nil {
		return AppendResult{}, err
	}
	return s.appendTx(ctx, tx, appendArgs{stream: a.StreamID, expected: exp, exp: a.Expected, payload: a.Events, count: a.Count, callerIDs: true})
}
