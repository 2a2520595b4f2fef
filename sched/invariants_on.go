//go:build invariants

package sched

// checkInvariants verifies the scheduler and its pool after every call in
// builds with the invariants tag. A violation is a bug, so it panics.
func (s *Scheduler) checkInvariants() {
	if err := s.verify(); err != nil {
		panic("sched invariant: " + err.Error())
	}
}
