package advisorylock

// Watchers returns the number of watcher goroutines of l that have started
// running and not yet returned.
func Watchers(l *Lock) int { return int(l.watchers.Load()) }

// WatcherCancels returns how many of l's watcher waits were cut by a
// deadline (stopped while blocked reading, not before the read began).
func WatcherCancels(l *Lock) int64 { return l.ctxh.watcherCancels.Load() }
