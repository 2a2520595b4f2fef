//go:build !invariants

package kvcache

// invariants is set by the invariants build tag (see invariants_on.go).
const invariants = false

type debugState struct{}

func (*debugState) init()               {}
func (*debugState) track(*BlockTable)   {}
func (*debugState) untrack(*BlockTable) {}
func (*Pool) checkInvariants()          {}
