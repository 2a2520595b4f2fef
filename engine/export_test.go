package engine

// FreeBlocks, Busy and Preemptions read loop-owned state for tests; they
// are only called while the engine is idle or for monotonic counters.
func FreeBlocks(l *Loaded) int { return l.Engine.pool.NumFree() }

func Busy(l *Loaded) bool {
	l.Engine.mu.Lock()
	defer l.Engine.mu.Unlock()
	return len(l.Engine.pending) > 0 || l.Engine.queued.Load() > 0 || l.Engine.busy.Load()
}

func Preemptions(l *Loaded) uint64 { return l.Engine.preemptions.Load() }
