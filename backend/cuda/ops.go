package cuda

import (
	"fmt"
	"math"

	"github.com/trigon-llm/trigon/backend"
)

// Launchers: each op checks its operands on the caller's goroutine (bad
// input is an error, never a launch), then queues the launch on the CUDA
// thread. Index checks that need the device's data (ids, slots, block
// tables) run in the kernels and surface at Sync.

// opErr puts the backend's name on an operand error of package backend's
// checks (nil stays nil), so the message reads "cuda: op: operand: ...".
func opErr(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("cuda: %w", err)
}

// optTensorOf resolves an optional operand: an absent one is nil.
func (b *Backend) optTensorOf(op, name string, t backend.Tensor) (*tensor, error) {
	if t == nil {
		return nil, nil
	}
	return b.tensorOf(op, name, t)
}

// orNil is t as an operand of package backend's checks: an absent operand
// must be a nil interface there, never a nil *tensor in one.
func orNil(t *tensor) backend.Tensor {
	if t == nil {
		return nil
	}
	return t
}

const maxInt32 = math.MaxInt32

func ptrOf(t *tensor) uint64 {
	if t == nil {
		return 0
	}
	return t.ptr
}

func f32bits(f float32) uint64 { return uint64(math.Float32bits(f)) }

func i32(v int) uint64 { return uint64(uint32(int32(v))) }

// gridFor sizes a grid-stride launch of n elements at 256 threads.
func (b *Backend) gridFor(n int) int {
	g := (n + 255) / 256
	return max(1, min(g, b.sms*16))
}

// Embed implements backend.Backend.
//
//	out   [n, dim] F32, F16 or BF16
//	table [rows, dim] F32, F16, BF16, Q8_0, Q4_0 or a K-quant
//	ids   [n] I32
func (b *Backend) Embed(out, table, ids backend.Tensor) error {
	return b.embed("embed", out, table, ids, 0, false)
}

// embed is Embed and, with shard set, EmbedShard: the table holds the
// vocabulary rows [base, base+rows), and ids outside them write zero rows
// without raising the device-side id check (negative ids still raise it).
func (b *Backend) embed(op string, out, table, ids backend.Tensor, base int, shard bool) error {
	o, err := b.tensorOf(op, "out", out)
	if err != nil {
		return err
	}
	tt, err := b.tensorOf(op, "table", table)
	if err != nil {
		return err
	}
	it, err := b.tensorOf(op, "ids", ids)
	if err != nil {
		return err
	}
	d, err := backend.CheckEmbed(o, tt, it)
	if err != nil {
		return opErr(err)
	}
	rows, dim, n := d.Rows, d.Dim, d.N
	if rows > maxInt32 || dim > maxInt32 || base < 0 || base > maxInt32-rows {
		return backend.ShapeError("cuda: "+op, "table", "%v at row %d exceeds int32 indexing", tt.shape, base)
	}
	sharded := 0
	if shard {
		sharded = 1
	}
	k := fnKey{modSpec{file: "embed", p: [8]int{int(tt.dt), int(o.dt)}}, "embed"}
	return b.post(func() error {
		f, err := b.fn(k)
		if err != nil {
			return err
		}
		return b.launch(f, [3]int{n, 1, 1}, 256, 0, o.ptr, tt.ptr, it.ptr, i32(dim), i32(rows), b.errDev, i32(base), i32(sharded))
	})
}

// AddRMSNorm implements backend.Backend. The residual is stored in x's
// dtype and the norm is taken of the stored (rounded) sum.
//
//	out, x, residual [rows, dim] (x and residual the same float dtype)
//	weight           [dim] F32, F16 or BF16
func (b *Backend) AddRMSNorm(out, x, residual, weight backend.Tensor, eps float32) error {
	return b.addRMSNormOp(out, x, residual, weight, eps, nil)
}

// addRMSNormPrefetch is AddRMSNorm whose launch also runs blocks that
// prefetch the first Tuning.NormPrefetchBytes of next into L2, where
// normPrefetches says so for its rows (the lowering's prefetch attribute).
// A decode step's norm is a chain of memory latencies during which HBM
// idles; the product after it then finds the start of its weight in L2.
func (b *Backend) addRMSNormPrefetch(out, x, residual, weight backend.Tensor, eps float32, next backend.Tensor) error {
	var nt *tensor
	if next != nil {
		var err error
		if nt, err = b.tensorOf("addrmsnorm", "next", next); err != nil {
			return err
		}
	}
	return b.addRMSNormOp(out, x, residual, weight, eps, nt)
}

// normPrefetches reports whether a norm of rows rows prefetches the next
// weight: decode-sized batches, whose norms are short enough that HBM
// would idle under them (a prefill's norm streams its own rows).
func (b *Backend) normPrefetches(rows int) bool { return rows <= 64 && b.tune.normPrefetch > 0 }

// addRMSNormOp checks and queues AddRMSNorm, with next's prefetch if any.
func (b *Backend) addRMSNormOp(out, x, residual, weight backend.Tensor, eps float32, next *tensor) error {
	const op = "addrmsnorm"
	o, err := b.tensorOf(op, "out", out)
	if err != nil {
		return err
	}
	xt, err := b.tensorOf(op, "x", x)
	if err != nil {
		return err
	}
	rt, err := b.optTensorOf(op, "residual", residual)
	if err != nil {
		return err
	}
	wt, err := b.tensorOf(op, "weight", weight)
	if err != nil {
		return err
	}
	d, err := backend.CheckAddRMSNorm(o, xt, orNil(rt), wt, eps)
	if err != nil {
		return opErr(err)
	}
	rows, dim := d.Rows, d.Dim
	if rt != nil && (overlaps(rt, xt) || overlaps(rt, o)) {
		return backend.ShapeError("cuda: "+op, "residual", "overlaps x or out")
	}
	if dim > maxInt32 {
		return backend.ShapeError("cuda: "+op, "x", "dim %d exceeds int32", dim)
	}
	threads := normThreads(dim, rows)
	k := fnKey{modSpec{file: "norm", p: [8]int{int(xt.dt), int(o.dt), int(wt.dt)}}, "add_rmsnorm"}
	hasRes := 0
	if rt != nil {
		hasRes = 1
	}
	var pf uint64
	pfBytes := 0
	if next != nil && b.normPrefetches(rows) {
		pf, pfBytes = next.ptr, min(next.bytes, b.tune.normPrefetch)
	}
	return b.post(func() error { return b.addRMSNorm(k, rows, threads, o, xt, rt, wt, dim, eps, hasRes, pf, pfBytes) })
}

// normThreads is add_rmsnorm's block size for rows rows of dim elements:
// a thread per 8 (one 16-byte chunk), in whole warps, at most 1024. From
// normTwoChunkRows rows on, a thread per 16 (two chunks): a prefill's
// blocks are then half as many, twice as many fit on an SM, and each
// thread has twice the bytes in flight (at one chunk a thread a prefill's
// norm waits on its memory latencies, not on HBM). Decode rows keep one
// chunk a thread: there a row's latency is the kernel's time, and more
// threads share it.
func normThreads(dim, rows int) int {
	per := 8
	if rows >= normTwoChunkRows {
		per = 16
	}
	return min(1024, max(32, (dim/per+31)/32*32))
}

// normTwoChunkRows is where normThreads switches to two chunks a thread.
const normTwoChunkRows = 64

// addRMSNorm launches add_rmsnorm for validated operands, with extra
// blocks that prefetch pf[0, pfBytes) into L2 when pfBytes > 0. CUDA
// thread only.
func (b *Backend) addRMSNorm(k fnKey, rows, threads int, o, xt, rt, wt *tensor, dim int, eps float32, hasRes int, pf uint64, pfBytes int) error {
	f, err := b.fn(k)
	if err != nil {
		return err
	}
	// Each prefetching thread asks for at most 8 lines.
	extra := 0
	if pfBytes > 0 {
		extra = min(b.sms, (pfBytes+threads*128*8-1)/(threads*128*8))
	}
	return b.launch(f, [3]int{rows + extra, 1, 1}, threads, 0, o.ptr, xt.ptr, ptrOf(rt), wt.ptr, i32(dim), f32bits(eps), uint64(hasRes),
		i32(rows), pf, uint64(pfBytes))
}

// overlaps reports whether two tensors share device bytes.
func overlaps(a, c *tensor) bool {
	return a.ptr < c.ptr+uint64(c.bytes) && c.ptr < a.ptr+uint64(a.bytes)
}

// SiLUMul implements backend.Backend.
//
//	out    [n, inter] F32, F16 or BF16
//	gateUp [n, 2*inter] F32, F16 or BF16: gate, then up
func (b *Backend) SiLUMul(out, gateUp backend.Tensor) error {
	const op = "silumul"
	o, err := b.tensorOf(op, "out", out)
	if err != nil {
		return err
	}
	g, err := b.tensorOf(op, "gateUp", gateUp)
	if err != nil {
		return err
	}
	d, err := backend.CheckSiLUMul(o, g)
	if err != nil {
		return opErr(err)
	}
	n, inter := d.N, d.Inter
	if overlaps(o, g) {
		return backend.ShapeError("cuda: "+op, "out", "overlaps gateUp")
	}
	if n > maxInt32 || 2*inter > maxInt32 {
		return backend.ShapeError("cuda: "+op, "gateUp", "%v exceeds int32", g.shape)
	}
	k := fnKey{modSpec{file: "act", p: [8]int{int(g.dt), int(o.dt)}}, "silu_mul"}
	grid := [3]int{b.gridFor(n * inter), 1, 1}
	if g.dt == backend.BF16 && o.dt == backend.BF16 && inter%8 == 0 && (o.ptr|g.ptr)%16 == 0 {
		// silu_mul_v8: a thread takes two 8-element chunks of a row, and
		// the grid at most 16 blocks per SM, rows shared out over y.
		k.name = "silu_mul_v8"
		gx := (inter/8 + 2*256 - 1) / (2 * 256)
		gy := max(1, min(n, b.sms*16/gx, maxGridYZ))
		grid = [3]int{gx, gy, 1}
	}
	return b.post(func() error {
		f, err := b.fn(k)
		if err != nil {
			return err
		}
		return b.launch(f, grid, 256, 0, o.ptr, g.ptr, i32(n), i32(inter))
	})
}

// convert queues dst = src (count elements, dtype conversion on the fly).
// CUDA thread only.
func (b *Backend) convert(dst uint64, dt backend.DType, src uint64, st backend.DType, count int) error {
	f, err := b.fn(fnKey{modSpec{file: "act", p: [8]int{int(st), int(dt)}}, "convert"})
	if err != nil {
		return err
	}
	return b.launch(f, [3]int{b.gridFor(count), 1, 1}, 256, 0, dst, src, uint64(count))
}

// FillNormal implements backend.RandomFiller: element i of t becomes
// backend.SyntheticValue(seed, i, mean, std) in t's dtype (F32 or BF16),
// made on the device. It returns once the fill has completed (a stream
// synchronisation: it runs while a model loads), and t is then pristine
// as an uploaded weight is: no kernel writes it again, so under PDL the
// GEMV may read it before its wait. Were the fill still running, a
// product launched after it under PDL could read it half written.
func (b *Backend) FillNormal(t backend.Tensor, seed uint64, mean, std float32) error {
	const op = "fillnormal"
	x, err := b.tensorOf(op, "t", t)
	if err != nil {
		return err
	}
	// The fill kernel writes F32 and BF16 only.
	if err := opErr(backend.CheckDType(op, "t", x, backend.F32, backend.BF16)); err != nil {
		return err
	}
	n, err := backend.NumElements(x.shape)
	if err != nil {
		return fmt.Errorf("cuda: %s: %w", op, err)
	}
	k := fnKey{modSpec{file: "act", p: [8]int{int(x.dt), int(x.dt)}}, "fill_normal"}
	if err := b.post(func() error {
		f, err := b.fn(k)
		if err != nil {
			return err
		}
		return b.launch(f, [3]int{b.gridFor(n), 1, 1}, 256, 0, x.ptr, uint64(n), seed,
			f32bits(backend.SyntheticScale), f32bits(mean), f32bits(std))
	}); err != nil {
		return err
	}
	if err := b.Sync(); err != nil {
		return fmt.Errorf("cuda: %s: %w", op, err)
	}
	if x.owner != nil {
		x.owner.pristine.Store(true)
	}
	return nil
}
