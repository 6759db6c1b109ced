package eventstore

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
func AppendThroughJSONB(s *Store) { s.appendFn.Store(appendFnJSONB) }
