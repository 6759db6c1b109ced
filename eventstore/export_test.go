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

// KeyCacheLen reports how many subjects s's key ring caches.
func KeyCacheLen(s *Store) int { return s.keys.cacheLen() }
