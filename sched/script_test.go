package sched_test

import (
	"github.com/trigon-llm/trigon/internal/datadriven"

	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/trigon-llm/trigon/kvcache"
	"github.com/trigon-llm/trigon/sched"
)

// TestScripts runs testdata/*.txt against a scheduler driven by fakeModel.
// Commands:
//
//	init blocks=N [block-size=16] [max-seqs=8] [budget=64] [chunk=0]
//	     [policy=fcfs|priority] [prefix-cache=true] [eos=-1] [vocab=1000]
//	     [mixed-ratio=R mixed-fixed=F]  MixedCap[d] = max(1, (R-1)*(F+d))
//	     [spec=K]                  step and run propose K-token drafts
//	                               (fakeModel.propose) before each Schedule
//	add id=ID prompt=LEN max=N [prio=P] [forks=ID,ID] [salt=S]
//	    [prefix=ID:K] [seed=S]     prompt: first K tokens of ID's prompt,
//	                               then random tokens seeded by S (default ID)
//	add-range ids=LO-HI prompt=LEN max=N
//	schedule                       print the next plan in full
//	execute                        run the outstanding plan, Update
//	update [sampled=ID:TOK,..] [finish=ID:stop|length|error,..] [accepted=ID:TOK/TOK,..]   manual Update
//	candidates                     DraftCandidates
//	draft id=ID tokens=TOK,..      SetDraft
//	step [n=1] [verbose]           schedule, execute, update, n times
//	run [max-steps=100000] [quiet] steps until nothing is left
//	abort id=ID
//	grow n=BLOCKS
//	state
//
// Compact step lines read: "step S: N seqs, T tokens | decode IDS |
// verify ID:START+K ... | prefill ID:START+N[ hit H][*] ... | preempt IDS |
// copy SRC->DST | done ID:REASON"; * marks a chunk that samples, verify a
// decode with K draft tokens. Every finished sequence's
// output is checked against a run of that sequence alone (unless a manual
// update made up tokens); the scheduler's invariants, the step budget and
// the sequence cap are checked after every command.
func TestScripts(t *testing.T) {
	datadriven.RunScripts(t, "testdata/*.txt", func(t *testing.T) func(c *datadriven.Case) string {
		h := &harness{t: t}
		return h.do
	})
}

type reqRef struct {
	prompt    []int32
	maxTokens int
}

type harness struct {
	t     *testing.T
	cfg   sched.Config
	pool  *kvcache.Pool
	s     *sched.Scheduler
	model *fakeModel
	reqs  map[sched.SeqID]*reqRef // live requests and forks, for the reference
	// prompts keeps every prompt for prefix=ID:K, finished ones included.
	prompts  map[sched.SeqID][]int32
	plan     *sched.Plan
	planDone bool // plan went through Update
	manual   bool // a manual update invented tokens: outputs are not checked
	// pendingForks lists the forks of each request until its prefill ends.
	pendingForks map[sched.SeqID][]sched.SeqID
	pos          string
	spec         int    // draft tokens per decode (0: none)
	rounds       uint64 // drafting rounds, the drafter's seed
}

func (h *harness) do(c *datadriven.Case) string {
	h.pos = c.Pos
	out, err := h.exec(c)
	if err != nil {
		if out != "" {
			out += "\n"
		}
		out += "error: " + err.Error()
	}
	if h.s != nil {
		if err := h.s.Verify(); err != nil {
			h.t.Fatalf("%s: %v", c.Pos, err)
		}
	}
	return out
}

func (h *harness) exec(c *datadriven.Case) (string, error) {
	if c.Cmd != "init" && h.s == nil {
		return "", errors.New("no scheduler yet")
	}
	switch c.Cmd {
	case "init":
		return h.init(c)
	case "add":
		return "", h.add(c)
	case "add-range":
		ids := c.Str("ids", "")
		lo, hi, ok := strings.Cut(ids, "-")
		a, err1 := strconv.Atoi(lo)
		b, err2 := strconv.Atoi(hi)
		if !ok || err1 != nil || err2 != nil {
			return "", fmt.Errorf("add-range: ids=%q", ids)
		}
		plen, err := c.Int("prompt", 0)
		if err != nil {
			return "", err
		}
		maxT, err := c.Int("max", 1)
		if err != nil {
			return "", err
		}
		for id := a; id <= b; id++ {
			if err := h.addReq(sched.Request{ID: sched.SeqID(id), Prompt: h.tokens(uint64(id), plen), MaxTokens: maxT}); err != nil {
				return "", err
			}
		}
		return fmt.Sprintf("added %d", b-a+1), nil
	case "schedule":
		h.plan, h.planDone = h.s.Schedule(), false
		if err := h.checkPlan(h.plan); err != nil {
			return "", err
		}
		return h.printPlan(h.plan), nil
	case "execute":
		if h.plan == nil || h.planDone {
			return "", errors.New("no plan to execute")
		}
		out, err := h.model.execute(h.plan)
		if err != nil {
			h.t.Fatalf("%s: fake model: %v", c.Pos, err)
		}
		return h.update(out)
	case "update":
		if h.plan == nil {
			return "", errors.New("no plan")
		}
		h.manual = true
		out := sched.StepOutput{Tokens: map[sched.SeqID]int32{}, Finish: map[sched.SeqID]sched.FinishReason{}, Accepted: map[sched.SeqID][]int32{}}
		for _, kv := range splitList(c.Str("accepted", "")) {
			id, v, err := parsePair(kv)
			if err != nil {
				return "", err
			}
			toks, err := parseIDs(strings.Split(v, "/"))
			if err != nil {
				return "", err
			}
			out.Accepted[id] = toks
		}
		for _, kv := range splitList(c.Str("sampled", "")) {
			id, v, err := parsePair(kv)
			if err != nil {
				return "", err
			}
			tok, err := strconv.Atoi(v)
			if err != nil {
				return "", fmt.Errorf("sampled %q: %w", kv, err)
			}
			out.Tokens[id] = int32(tok)
		}
		for _, kv := range splitList(c.Str("finish", "")) {
			id, v, err := parsePair(kv)
			if err != nil {
				return "", err
			}
			switch v {
			case "stop":
				out.Finish[id] = sched.FinishStop
			case "length":
				out.Finish[id] = sched.FinishLength
			case "error":
				out.Finish[id] = sched.FinishError
			default:
				return "", fmt.Errorf("finish reason %q", v)
			}
		}
		return h.update(out)
	case "step":
		n, err := c.Int("n", 1)
		if err != nil {
			return "", err
		}
		var lines []string
		for range n {
			l, err := h.step(c.Has("verbose"))
			lines = append(lines, l)
			if err != nil {
				return strings.Join(lines, "\n"), err
			}
		}
		return strings.Join(lines, "\n"), nil
	case "run":
		return h.run(c)
	case "candidates":
		var lines []string
		for _, d := range h.s.DraftCandidates() {
			lines = append(lines, fmt.Sprintf("%d: %d tokens, max draft %d", d.ID, len(d.Tokens), d.MaxDraft))
		}
		return strings.Join(lines, "\n"), nil
	case "draft":
		id, err := c.Int("id", 0)
		if err != nil {
			return "", err
		}
		toks, err := parseIDs(splitList(c.Str("tokens", "")))
		if err != nil {
			return "", err
		}
		return "", h.s.SetDraft(sched.SeqID(id), toks)
	case "abort":
		id, err := c.Int("id", 0)
		if err != nil {
			return "", err
		}
		ok := h.s.Abort(sched.SeqID(id))
		delete(h.reqs, sched.SeqID(id))
		for _, f := range h.pendingForks[sched.SeqID(id)] {
			delete(h.reqs, f) // never created
		}
		return fmt.Sprintf("aborted %v, free %d/%d", ok, h.pool.NumFree(), h.pool.NumBlocks()-1), nil
	case "grow":
		n, err := c.Int("n", 0)
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("free %d/%d", h.pool.NumFree(), h.pool.NumBlocks()-1), h.pool.Grow(n)
	case "state":
		return h.state(), nil
	}
	return "", fmt.Errorf("unknown command %q", c.Cmd)
}

func (h *harness) init(c *datadriven.Case) (string, error) {
	var err error
	geti := func(key string, def int) int {
		v, e := c.Int(key, def)
		if e != nil {
			err = e
		}
		return v
	}
	blocks, bs := geti("blocks", 0), geti("block-size", 16)
	h.cfg = sched.Config{
		MaxNumSeqs:          geti("max-seqs", 8),
		MaxNumBatchedTokens: geti("budget", 64),
		ChunkSize:           geti("chunk", 0),
	}
	getf := func(key string) float64 {
		v, e := strconv.ParseFloat(c.Str(key, "0"), 64)
		if e != nil {
			err = fmt.Errorf("%s: %w", key, e)
		}
		return v
	}
	if r, f := getf("mixed-ratio"), getf("mixed-fixed"); r > 0 {
		h.cfg.MixedCap = make([]int, h.cfg.MaxNumBatchedTokens+1)
		for d := 1; d < len(h.cfg.MixedCap); d++ {
			h.cfg.MixedCap[d] = max(1, int((r-1)*(f+float64(d))))
		}
	}
	eos, vocab := geti("eos", -1), geti("vocab", 1000)
	h.spec, h.rounds = geti("spec", 0), 0
	if err != nil {
		return "", err
	}
	switch c.Str("policy", "fcfs") {
	case "fcfs":
	case "priority":
		h.cfg.Policy = sched.Priority
	default:
		return "", fmt.Errorf("policy %q", c.Str("policy", ""))
	}
	pc, err := c.Bool("prefix-cache", true)
	if err != nil {
		return "", err
	}
	h.pool, err = kvcache.NewPool(kvcache.Options{NumBlocks: blocks, BlockSize: bs, EnablePrefixCache: pc})
	if err != nil {
		return "", err
	}
	h.s, err = sched.New(h.cfg, h.pool)
	if err != nil {
		h.s = nil
		return "", err
	}
	h.model = &fakeModel{bs: bs, vocab: int32(vocab), eos: int32(eos)}
	h.reqs = map[sched.SeqID]*reqRef{}
	h.prompts = map[sched.SeqID][]int32{}
	h.pendingForks = map[sched.SeqID][]sched.SeqID{}
	h.plan, h.manual = nil, false
	return fmt.Sprintf("%d blocks of %d tokens", blocks-1, bs), nil
}

// tokens makes a deterministic random prompt.
func (h *harness) tokens(seed uint64, n int) []int32 {
	rng := rand.New(rand.NewPCG(seed, 7))
	out := make([]int32, n)
	for i := range out {
		out[i] = 1 + rng.Int32N(h.model.vocab-1)
	}
	return out
}

func (h *harness) add(c *datadriven.Case) error {
	id, err := c.Int("id", 0)
	if err != nil {
		return err
	}
	plen, err := c.Int("prompt", 0)
	if err != nil {
		return err
	}
	maxT, err := c.Int("max", 1)
	if err != nil {
		return err
	}
	prio, err := c.Int("prio", 0)
	if err != nil {
		return err
	}
	seed, err := c.Int("seed", id)
	if err != nil {
		return err
	}
	var prompt []int32
	if p := c.Str("prefix", ""); p != "" {
		srcID, k, err := parsePair(p)
		if err != nil {
			return err
		}
		n, err := strconv.Atoi(k)
		if err != nil {
			return fmt.Errorf("prefix %q: %w", p, err)
		}
		src := h.prompts[srcID]
		if n > len(src) {
			return fmt.Errorf("prefix %q: no such prompt", p)
		}
		prompt = slices.Clone(src[:n])
	}
	prompt = append(prompt, h.tokens(uint64(seed), plen-len(prompt))...)
	req := sched.Request{ID: sched.SeqID(id), Prompt: prompt, MaxTokens: maxT, Priority: prio, CacheSalt: c.Str("salt", "")}
	for _, f := range splitList(c.Str("forks", "")) {
		v, err := strconv.Atoi(f)
		if err != nil {
			return fmt.Errorf("forks: %w", err)
		}
		req.Forks = append(req.Forks, sched.SeqID(v))
	}
	return h.addReq(req)
}

func (h *harness) addReq(req sched.Request) error {
	if err := h.s.Add(req); err != nil {
		return err
	}
	if len(req.Forks) > 0 {
		h.pendingForks[req.ID] = req.Forks
	}
	h.prompts[req.ID] = slices.Clone(req.Prompt)
	for _, id := range append([]sched.SeqID{req.ID}, req.Forks...) {
		h.reqs[id] = &reqRef{prompt: slices.Clone(req.Prompt), maxTokens: req.MaxTokens}
	}
	return nil
}

// checkPlan asserts the step limits the scheduler promises.
func (h *harness) checkPlan(p *sched.Plan) error {
	n := 0
	for _, e := range p.Seqs {
		n += len(e.Tokens)
	}
	if n != p.NumTokens || n > h.cfg.MaxNumBatchedTokens || len(p.Seqs) > h.cfg.MaxNumSeqs {
		h.t.Fatalf("%s: plan %d: %d tokens (says %d) for %d seqs breaks budget %d or cap %d", h.pos, p.Step, n, p.NumTokens, len(p.Seqs), h.cfg.MaxNumBatchedTokens, h.cfg.MaxNumSeqs)
	}
	// The mixed-step cap, from the config as MixedCap documents it. A
	// prompt's last token alone reads as a decode here; that only loosens
	// the check, as the harness's caps grow with the decodes.
	if caps := h.cfg.MixedCap; len(caps) > 1 {
		decode, prefill := 0, 0
		for _, e := range p.Seqs {
			if e.NumDraft > 0 || len(e.Tokens) == 1 && e.Sample && e.NumCachedTokens == 0 && e.Start > 0 {
				decode += len(e.Tokens)
			} else {
				prefill += len(e.Tokens)
			}
		}
		if c := caps[min(decode, len(caps)-1)]; decode > 0 && prefill > c {
			h.t.Fatalf("%s: plan %d: %d prefill tokens beside %d decode tokens break the mixed cap %d", h.pos, p.Step, prefill, decode, c)
		}
	}
	return nil
}

func (h *harness) update(out sched.StepOutput) (string, error) {
	for _, e := range h.plan.Seqs {
		if len(e.Forks) > 0 {
			delete(h.pendingForks, e.ID)
		}
	}
	fin, err := h.s.Update(h.plan, out)
	h.planDone = true
	if err != nil {
		return "", err
	}
	var lines []string
	for _, f := range fin {
		lines = append(lines, h.finished(f))
	}
	return strings.Join(lines, "\n"), nil
}

// finished prints f and checks it against the solo reference.
func (h *harness) finished(f sched.Finished) string {
	ref := h.reqs[f.ID]
	delete(h.reqs, f.ID)
	if f.Reason == sched.FinishError {
		return fmt.Sprintf("finished %d: error: %v", f.ID, f.Err)
	}
	if ref == nil {
		h.t.Errorf("%s: finished %d, which is not live", h.pos, f.ID)
	} else if !h.manual {
		want, reason := h.model.solo(ref.prompt, f.ID, ref.maxTokens)
		if !slices.Equal(f.Output, want) || f.Reason != reason {
			h.t.Errorf("%s: sequence %d: got %v %v, alone it makes %v %v", h.pos, f.ID, f.Reason, f.Output, reason, want)
		}
	}
	out := fmt.Sprint(f.Output)
	if len(f.Output) > 12 {
		out = fmt.Sprintf("%v ... (%d tokens)", f.Output[:8], len(f.Output))
	}
	return fmt.Sprintf("finished %d: %v %s", f.ID, f.Reason, out)
}

// step runs one schedule-execute-update round, drafting first with spec.
func (h *harness) step(verbose bool) (string, error) {
	if h.spec > 0 {
		h.rounds++
		for _, c := range h.s.DraftCandidates() {
			if err := h.s.SetDraft(c.ID, h.model.propose(c, h.spec, h.rounds)); err != nil {
				h.t.Fatalf("%s: SetDraft: %v", h.pos, err)
			}
		}
	}
	p := h.s.Schedule()
	if err := h.checkPlan(p); err != nil {
		return "", err
	}
	out, err := h.model.execute(p)
	if err != nil {
		h.t.Fatalf("%s: fake model: %v", h.pos, err)
	}
	h.plan, h.planDone = p, false
	fin, err := h.update(out)
	line := h.compact(p)
	if verbose {
		line = h.printPlan(p)
	}
	if fin != "" {
		line += "\n" + fin
	}
	return line, err
}

func (h *harness) run(c *datadriven.Case) (string, error) {
	maxSteps, err := c.Int("max-steps", 100000)
	if err != nil {
		return "", err
	}
	quiet := c.Has("quiet")
	var lines []string
	steps, finished := 0, 0
	for h.s.NumWaiting()+h.s.NumRunning() > 0 {
		if steps == maxSteps {
			return strings.Join(lines, "\n"), fmt.Errorf("not done after %d steps", steps)
		}
		l, err := h.step(false)
		steps++
		finished += strings.Count(l, "\nfinished")
		if !quiet {
			lines = append(lines, l)
		}
		if err != nil {
			return strings.Join(lines, "\n"), err
		}
	}
	st := h.s.Stats()
	lines = append(lines, fmt.Sprintf("done after %d steps, %d finished: preemptions %d, free %d/%d, prefix hits %d/%d tokens",
		steps, finished, st.Preemptions, h.pool.NumFree(), h.pool.NumBlocks()-1, st.PrefixHitTokens, st.PrefixQueryTokens))
	if h.pool.NumFree() != h.pool.NumBlocks()-1 {
		h.t.Errorf("%s: blocks leaked: %d of %d free", h.pos, h.pool.NumFree(), h.pool.NumBlocks()-1)
	}
	return strings.Join(lines, "\n"), nil
}

func (h *harness) printPlan(p *sched.Plan) string {
	var b strings.Builder
	fmt.Fprintf(&b, "plan %d: %d seqs, %d tokens", p.Step, len(p.Seqs), p.NumTokens)
	for _, e := range p.Seqs {
		fmt.Fprintf(&b, "\n  %d: start=%d n=%d", e.ID, e.Start, len(e.Tokens))
		if e.NumCachedTokens > 0 {
			fmt.Fprintf(&b, " hit=%d", e.NumCachedTokens)
		}
		fmt.Fprintf(&b, " blocks=%v", e.Blocks)
		if e.Sample {
			b.WriteString(" sample")
		}
		if len(e.Forks) > 0 {
			fmt.Fprintf(&b, " forks=%v", e.Forks)
		}
		if e.NumDraft > 0 {
			fmt.Fprintf(&b, " draft=%v", e.Tokens[1:])
		}
	}
	for _, cp := range p.Copies {
		fmt.Fprintf(&b, "\n  copy %d->%d", cp.Src, cp.Dst)
	}
	if len(p.Preempted) > 0 {
		fmt.Fprintf(&b, "\n  preempted %v", p.Preempted)
	}
	return b.String()
}

func (h *harness) compact(p *sched.Plan) string {
	var b strings.Builder
	fmt.Fprintf(&b, "step %d: %d seqs, %d tokens", p.Step, len(p.Seqs), p.NumTokens)
	var decodes []sched.SeqID
	type prefillRun struct {
		lo, hi sched.SeqID
		shape  string
	}
	var prefills []prefillRun
	var verifies []string
	for _, e := range p.Seqs {
		if e.NumDraft > 0 {
			verifies = append(verifies, fmt.Sprintf("%d:%d+%d", e.ID, e.Start, e.NumDraft))
			continue
		}
		if len(e.Tokens) == 1 && e.Sample && e.NumCachedTokens == 0 && e.Start > 0 {
			decodes = append(decodes, e.ID)
			continue
		}
		s := fmt.Sprintf(":%d+%d", e.Start, len(e.Tokens))
		if e.NumCachedTokens > 0 {
			s += fmt.Sprintf(" hit %d", e.NumCachedTokens)
		}
		if e.Sample {
			s += "*"
		}
		// Runs of consecutive ids with the same shape print once: 1-64:0+8*.
		if n := len(prefills); n > 0 && prefills[n-1].shape == s && prefills[n-1].hi+1 == e.ID {
			prefills[n-1].hi = e.ID
			continue
		}
		prefills = append(prefills, prefillRun{e.ID, e.ID, s})
	}
	if len(decodes) > 0 {
		b.WriteString(" | decode " + idList(decodes))
	}
	if len(verifies) > 0 {
		b.WriteString(" | verify " + strings.Join(verifies, " "))
	}
	for i, r := range prefills {
		if i == 0 {
			b.WriteString(" | prefill ")
		} else {
			b.WriteString(", ")
		}
		b.WriteString(idList([]sched.SeqID{r.lo}))
		if r.hi > r.lo {
			fmt.Fprintf(&b, "-%d", r.hi)
		}
		b.WriteString(r.shape)
	}
	if len(p.Preempted) > 0 {
		b.WriteString(" | preempt " + idList(p.Preempted))
	}
	for _, cp := range p.Copies {
		fmt.Fprintf(&b, " | copy %d->%d", cp.Src, cp.Dst)
	}
	return b.String()
}

func (h *harness) state() string {
	var b strings.Builder
	st := h.s.Stats()
	fmt.Fprintf(&b, "waiting %d, running %d, free %d/%d, steps %d, preemptions %d, prefix hits %d/%d tokens",
		st.NumWaiting, st.NumRunning, h.pool.NumFree(), h.pool.NumBlocks()-1, st.Steps, st.Preemptions, st.PrefixHitTokens, st.PrefixQueryTokens)
	ids := make([]int, 0, len(h.reqs))
	for id := range h.reqs {
		ids = append(ids, int(id))
	}
	sort.Ints(ids)
	if len(ids) > 0 {
		fmt.Fprintf(&b, "\nlive: %v", ids)
	}
	return b.String()
}

func splitList(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

func parseIDs(list []string) ([]int32, error) {
	var out []int32
	for _, v := range list {
		n, err := strconv.Atoi(v)
		if err != nil {
			return nil, fmt.Errorf("token %q: %w", v, err)
		}
		out = append(out, int32(n))
	}
	return out, nil
}

func parsePair(s string) (sched.SeqID, string, error) {
	k, v, ok := strings.Cut(s, ":")
	id, err := strconv.Atoi(k)
	if !ok || err != nil {
		return 0, "", fmt.Errorf("want ID:VALUE, got %q", s)
	}
	return sched.SeqID(id), v, nil
}
