package sched

// Verify exposes the invariant check to the external tests.
func (s *Scheduler) Verify() error { return s.verify() }
