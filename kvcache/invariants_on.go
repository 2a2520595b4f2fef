//go:build invariants

package kvcache

// invariants is set by the invariants build tag: every mutation then
// verifies the whole pool against the tables it has handed blocks to.
const invariants = true

// debugState remembers the tables holding blocks, for Verify, and which
// registrations already had their hash recomputed.
type debugState struct {
	tables map[*BlockTable]struct{}
	hashed map[BlockID]uint64
}

func (d *debugState) init() {
	d.tables = make(map[*BlockTable]struct{})
	d.hashed = make(map[BlockID]uint64)
}

func (d *debugState) track(t *BlockTable) {
	if len(t.blocks) > 0 {
		d.tables[t] = struct{}{}
	}
}

func (d *debugState) untrack(t *BlockTable) { delete(d.tables, t) }

// checkInvariants panics: a violation is a bug in this package or a caller
// that broke the contract, and the invariants build exists to stop there.
func (p *Pool) checkInvariants() {
	tables := make([]*BlockTable, 0, len(p.dbg.tables))
	for t := range p.dbg.tables {
		tables = append(tables, t)
	}
	if err := p.verify(tables, p.dbg.hashed); err != nil {
		panic("kvcache invariant: " + err.Error())
	}
}
