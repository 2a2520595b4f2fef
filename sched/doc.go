// Package sched is the continuous-batching scheduler: a deterministic
// state machine with no goroutines, clocks, I/O or tensors. Each step it
// decides which sequences run, how many tokens each feeds, and which KV
// blocks hold them; the engine runs the plan and reports back.
//
// # One rule
//
// A sequence has tokens (prompt, then generated tokens) and a count of
// tokens whose KV is computed. Every step, each running sequence's
// computed count catches up with its tokens, as far as the token budget
// and the chunk size allow. There are no phases: a prompt's first step is
// shortened by its prefix-cache hit, a long prompt takes a chunk a step,
// a decode takes one token, and a preempted sequence, whose blocks were
// taken back, simply starts over at zero with its generated tokens kept,
// recomputing them like a longer prompt. Logits are wanted only for a
// chunk that reaches the last known token (ScheduledSeq.Sample). Decodes
// are scheduled first; with Config.MixedCap, the prefill beside them is
// further capped by how many decode tokens the step carries.
//
// # Contract with the engine
//
//	plan := s.Schedule()          // data: what to run
//	out := runner.Execute(plan)   // the engine's business
//	fin, err := s.Update(plan, out)
//
// The runner does plan.Copies first, then for each ScheduledSeq feeds
// Tokens at positions Start.., writes their KV at the slots AppendSlots
// gives (block table Blocks, context length Start+len(Tokens)), and
// samples one token where Sample is set (plus one per id in Forks, from the
// same logits). The engine puts those tokens in StepOutput.Tokens and
// marks sequences it saw end (EOS, stop strings) in StepOutput.Finish; the
// scheduler itself ends sequences at MaxTokens. It never detokenizes.
//
// ScheduleAhead plans the step after the outstanding one before its
// tokens are known (where that step samples every running sequence and
// no waiting request could start), so the engine can queue it on the device behind
// the outstanding step, which feeds it its tokens there:
//
//	next, ok := s.ScheduleAhead()  // after Schedule, before Update
//	fin, err := s.Update(plan, out) // writes plan's tokens where next feeds them
//	fin, err = s.Update(next, out2) // next is the outstanding plan now
//
// Requests that can never fit the KV pool are refused by Add. Out of
// blocks at run time, the newest running sequence (lowest priority under
// Priority) is preempted; no request fails silently: every sequence ends
// in Finished, by Update, or by the engine's Abort.
//
// The waiting queue has no cap here; the engine bounds it with NumWaiting.
//
// # Example
//
// A step loop (error handling shortened):
//
//	pool, _ := kvcache.NewPool(kvcache.Options{NumBlocks: 4096, EnablePrefixCache: true})
//	s, _ := sched.New(sched.Config{MaxNumSeqs: 64, MaxNumBatchedTokens: 2048, ChunkSize: 512}, pool)
//	_ = s.Add(sched.Request{ID: 1, Prompt: prompt, MaxTokens: 128})
//	for s.NumWaiting()+s.NumRunning() > 0 {
//		plan := s.Schedule()
//		out := sched.StepOutput{Tokens: map[sched.SeqID]int32{}}
//		for _, e := range plan.Seqs {
//			// ... the runner computes e.Tokens, samples where e.Sample ...
//			if e.Sample {
//				out.Tokens[e.ID] = next
//			}
//		}
//		fin, _ := s.Update(plan, out)
//		for _, f := range fin {
//			// f.Output holds the generated tokens; stream them, close the request
//		}
//	}
//
// Build with -tags invariants to verify the scheduler and its pool after
// every call.
package sched
