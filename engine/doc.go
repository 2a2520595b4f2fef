// Package engine runs the step loop that turns submitted requests into
// streamed tokens: it owns the scheduler (package sched), drives the runner
// (package runner) and streams each request's progress on a channel.
//
//	submit ──► pending ──► sched.Add
//	                           │
//	step loop (one goroutine): │
//	   plan := sched.Schedule()            which sequences, which tokens, which blocks
//	   copy forked blocks                  (n > 1)
//	   out := runner.Execute(plan)         model forward (graph replay for decode steps)
//	   sample: device (plain rows) or host (penalties, logprobs, min_tokens, JSON mode, n > 1 forks)
//	   stop checks, detokenize             sample.StopChecker, tokenizer.Decoder
//	   sched.Update(plan, tokens)          finished sequences free their blocks
//	   events ──► per-request queue ──► pump goroutine ──► caller's channel
//
// With Options.QueueAhead a step whose rows all sample on the device
// leaves its ids there (a flight); the next iteration first queues the
// step after it, fed those ids on the device (sched.ScheduleAhead: steps
// that sample every running sequence, with no request able to start), then reads the flight's ids and updates, so the host's
// work overlaps the device's.
//
// With Options.Spec (speculative decoding, LoadOptions.Speculative) the
// proposer guesses each decoding sequence's next tokens before Schedule
// (sched.SetDraft); a step with drafts computes every fed row's logits,
// keeps the guesses the target accepts (specdec.Greedy on device
// argmaxes, specdec.Verify on the host) plus one more token, and streams
// them one by one through the stop checks (spec.go; docs/speculative.md).
// A verify step is planned and read on the host. Steps without drafts
// queue ahead as before where the proposer guesses when drafts are
// unlikely (specdec.Predictor): a flight's next step is queued ahead only
// while no sequence of it is likely to draft; otherwise queue-ahead is off.
//
// The loop never blocks on a slow reader: events queue without bound per
// request and a pump goroutine delivers them. Cancelling a request's
// context aborts it within one step and frees its KV blocks at once. A
// backend error fails the requests of that step (FinishError) and the loop
// goes on serving the rest. Drain stops admitting; Run returns when the
// last request ends. Shutdown(ctx) drains until ctx ends, then aborts what
// is left (every choice gets a final FinishAbort event) after the step in
// progress.
//
// The step's token budget (LoadOptions.MaxBatchedTokens) bounds how long a
// step, and so every stream's next token, takes while prompts are
// prefilled; left 0, Load measures the model on the backend and picks the
// budget whose step takes about LoadOptions.StepTime (budget.go).
//
// Usage:
//
//	l, err := engine.Load(engine.LoadOptions{Model: "/models/llama-3-8b", Backend: b})
//	if err != nil { ... }
//	go l.Engine.Run(ctx)
//	events, err := l.Engine.Submit(ctx, &engine.Request{Prompt: ids, N: 1, Params: p})
//	for ev := range events {
//		fmt.Print(ev.Text)
//		if ev.FinishReason != "" { ... }
//	}
package engine
