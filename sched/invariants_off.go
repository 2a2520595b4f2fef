//go:build !invariants

package sched

// checkInvariants is compiled in by the invariants build tag only.
func (*Scheduler) checkInvariants() {}
