package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/trigon-llm/trigon/engine"
	"github.com/trigon-llm/trigon/sample"
	"github.com/trigon-llm/trigon/tokenizer"
)

// samplingFlags are the sampling options of `trigon run`; unset ones take
// the model's generation_config.json defaults.
type samplingFlags struct {
	maxTokens   int
	temperature float32
	topP        float32
	topK        int
	minP        float32
	repetition  float32
	seed        int64
	stop        []string
}

func (f *samplingFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.IntVarP(&f.maxTokens, "max-tokens", "n", 256, "most tokens to generate (given, it must fit the context; the default shrinks to fit)")
	fl.Float32Var(&f.temperature, "temperature", 0, "sampling temperature (0: greedy; default: the model's generation config)")
	fl.Float32Var(&f.topP, "top-p", 1, "nucleus sampling mass")
	fl.IntVar(&f.topK, "top-k", 0, "sample among the k most likely tokens (0: off)")
	fl.Float32Var(&f.minP, "min-p", 0, "drop tokens less likely than min-p times the top token")
	fl.Float32Var(&f.repetition, "repetition-penalty", 1, "HF repetition penalty (1: off)")
	fl.Int64Var(&f.seed, "seed", -1, "sampling seed (-1: random)")
	fl.StringArrayVar(&f.stop, "stop", nil, "stop string (repeatable)")
}

// check refuses out-of-range sampling flags before the model loads, each
// error naming its flag: the engine would refuse them only once the
// request is submitted, in the API's field names.
func (f *samplingFlags) check(cmd *cobra.Command) error {
	fl := cmd.Flags()
	if fl.Changed("max-tokens") && f.maxTokens < 1 {
		return fmt.Errorf("--max-tokens %d: want at least 1", f.maxTokens)
	}
	// -1 is the one value that means random, as the API's null seed.
	if f.seed < -1 {
		return fmt.Errorf("--seed %d: want -1 for random, or 0 and up", f.seed)
	}
	for _, c := range []struct {
		name  string
		value any
		set   func(*sample.Params)
	}{
		{"temperature", f.temperature, func(p *sample.Params) { p.Temperature = f.temperature }},
		{"top-p", f.topP, func(p *sample.Params) { p.TopP = f.topP }},
		{"top-k", f.topK, func(p *sample.Params) { p.TopK = f.topK }},
		{"min-p", f.minP, func(p *sample.Params) { p.MinP = f.minP }},
		{"repetition-penalty", f.repetition, func(p *sample.Params) { p.RepetitionPenalty = f.repetition }},
		{"stop", fmt.Sprintf("%q", f.stop), func(p *sample.Params) { p.Stop = f.stop }},
	} {
		if !fl.Changed(c.name) {
			continue
		}
		p := sample.Neutral()
		c.set(&p)
		if err := p.Validate(); err != nil {
			return fmt.Errorf("--%s %v: %w", c.name, c.value, err)
		}
	}
	return nil
}

// request builds an engine request from the flags over the model's
// defaults. --max-tokens follows sample.LengthRule: given, it must fit the
// context; not given, its default shrinks to what the prompt leaves.
func (f *samplingFlags) request(cmd *cobra.Command, l *engine.Loaded, prompt []int32) (*engine.Request, error) {
	p := engine.DefaultParams(l.Gen)
	fl := cmd.Flags()
	if fl.Changed("temperature") {
		p.Temperature = f.temperature
	}
	if fl.Changed("top-p") {
		p.TopP = f.topP
	}
	if fl.Changed("top-k") {
		p.TopK = f.topK
	}
	if fl.Changed("min-p") {
		p.MinP = f.minP
	}
	if fl.Changed("repetition-penalty") {
		p.RepetitionPenalty = f.repetition
	}
	if f.seed >= 0 {
		s := uint64(f.seed)
		p.Seed = &s
	}
	var asked *int
	if fl.Changed("max-tokens") {
		asked = &f.maxTokens
	}
	mt, err := sample.LengthRule{Context: l.Context, Default: f.maxTokens}.MaxTokens(asked, len(prompt), 0)
	if err != nil {
		return nil, err
	}
	p.MaxTokens = mt
	p.Stop = f.stop
	return &engine.Request{ID: "run", Prompt: prompt, N: 1, Params: p, SkipSpecialTokens: true}, nil
}

func runCmd() *cobra.Command {
	var mf modelFlags
	var sf samplingFlags
	var chat, interactive, verbose bool
	var system string
	cmd := &cobra.Command{
		Use:   "run [PROMPT]",
		Short: "Generate from a prompt (or chat with -i), streaming tokens as they come",
		Long: "run loads a model (default: the embedded Go-code model) and streams a continuation of PROMPT.\n" +
			"With --chat the prompt goes through the model's chat template; -i opens an interactive chat.",
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !interactive && len(args) == 0 {
				return errors.New("give a PROMPT, or -i for an interactive chat")
			}
			if err := sf.check(cmd); err != nil {
				return err
			}
			ctx, cancel := signal.NotifyContext(cmd.Context(), os.Interrupt)
			defer cancel()
			log := newLogger(cmd.ErrOrStderr(), verbose)
			l, stop, err := mf.load(ctx, log, nil)
			if err != nil {
				return err
			}
			defer stop()
			out := cmd.OutOrStdout()
			if interactive {
				return interactiveChat(ctx, cmd, l, &sf, system, cmd.InOrStdin(), out)
			}
			text := args[0]
			if chat {
				msgs := []tokenizer.Message{{Role: "user", Content: text}}
				if system != "" {
					msgs = append([]tokenizer.Message{{Role: "system", Content: system}}, msgs...)
				}
				if text, err = l.Tokenizer.ApplyChatTemplate(msgs, true); err != nil {
					return err
				}
			}
			// Refusals (an empty prompt, one the context cannot hold) come
			// before the prompt is echoed.
			prompt, req, err := prepare(cmd, l, &sf, text, chat)
			if err != nil {
				return err
			}
			if !chat {
				fmt.Fprint(out, text)
			}
			_, err = stream(ctx, cmd, l, prompt, req, out)
			fmt.Fprintln(out)
			return err
		},
	}
	mf.register(cmd)
	sf.register(cmd)
	cmd.Flags().BoolVar(&chat, "chat", false, "apply the model's chat template to the prompt")
	cmd.Flags().BoolVarP(&interactive, "interactive", "i", false, "interactive chat")
	cmd.Flags().StringVar(&system, "system", "", "system message for --chat and -i")
	cmd.Flags().BoolVarP(&verbose, "verbose", "v", false, "log loading and backend details")
	return cmd
}

// generate streams one completion of text to out and reports speed on
// stderr. It returns the generated text.
func generate(ctx context.Context, cmd *cobra.Command, l *engine.Loaded, sf *samplingFlags, text string, templated bool, out io.Writer) (string, error) {
	prompt, req, err := prepare(cmd, l, sf, text, templated)
	if err != nil {
		return "", err
	}
	return stream(ctx, cmd, l, prompt, req, out)
}

// prepare encodes text and builds its request, refusing a prompt of no
// tokens and one the context cannot hold with what the flags ask.
func prepare(cmd *cobra.Command, l *engine.Loaded, sf *samplingFlags, text string, templated bool) ([]int32, *engine.Request, error) {
	// A chat template carries its own BOS; a raw prompt gets the
	// tokenizer's special tokens.
	prompt, err := l.Tokenizer.Encode(text, !templated)
	if err != nil {
		return nil, nil, err
	}
	if len(prompt) == 0 {
		return nil, nil, errors.New("the prompt is empty: it encodes to no tokens")
	}
	req, err := sf.request(cmd, l, prompt)
	if err != nil {
		return nil, nil, err
	}
	if err := req.Params.Validate(); err != nil {
		// The flags are checked before loading; what is left comes from
		// the model's generation_config.json, which Load checks too.
		return nil, nil, fmt.Errorf("sampling parameters: %w", err)
	}
	return prompt, req, nil
}

// stream submits req, streams its text to out and reports speed on
// stderr. It returns the generated text.
func stream(ctx context.Context, cmd *cobra.Command, l *engine.Loaded, prompt []int32, req *engine.Request, out io.Writer) (string, error) {
	before := l.Engine.Stats().Spec
	start := time.Now()
	events, err := l.Engine.Submit(ctx, req)
	if err != nil {
		return "", err
	}
	var sb strings.Builder
	var first time.Time
	n := 0
	var final engine.Event
	for ev := range events {
		if len(ev.TokenIDs) > 0 && first.IsZero() {
			first = time.Now()
		}
		n += len(ev.TokenIDs)
		fmt.Fprint(out, ev.Text)
		sb.WriteString(ev.Text)
		if ev.FinishReason != "" {
			final = ev
		}
	}
	if final.FinishReason == engine.FinishError {
		return sb.String(), final.Err
	}
	if ctx.Err() != nil {
		return sb.String(), ctx.Err()
	}
	total := time.Since(start)
	decode := time.Since(first)
	rate := 0.0
	if n > 1 && decode > 0 {
		rate = float64(n-1) / decode.Seconds()
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "\n[%d prompt tokens, %d generated in %.2fs: first token after %.0f ms, %.1f tokens/s; finish: %s]\n",
		len(prompt), n, total.Seconds(), float64(first.Sub(start).Microseconds())/1000, rate, final.FinishReason)
	// The engine publishes its counters after the step that ended the
	// request: wait for it to go idle (briefly) before reading them.
	for deadline := time.Now().Add(time.Second); l.Engine.Busy() && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	if sp := l.Engine.Stats().Spec; sp.Drafts > before.Drafts {
		drafts, proposed, accepted := sp.Drafts-before.Drafts, sp.DraftTokens-before.DraftTokens, sp.Accepted-before.Accepted
		fmt.Fprintf(cmd.ErrOrStderr(), "[speculative: %d drafts, %d of %d proposed tokens accepted (%.1f%%), %.2f tokens per verify step]\n",
			drafts, accepted, proposed, 100*float64(accepted)/float64(max(proposed, 1)), 1+float64(accepted)/float64(drafts))
	}
	return sb.String(), nil
}

func interactiveChat(ctx context.Context, cmd *cobra.Command, l *engine.Loaded, sf *samplingFlags, system string, in io.Reader, out io.Writer) error {
	if !l.Tokenizer.HasChatTemplate() {
		return errors.New("this model has no chat template; use run PROMPT for plain completion")
	}
	var msgs []tokenizer.Message
	if system != "" {
		msgs = append(msgs, tokenizer.Message{Role: "system", Content: system})
	}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for {
		fmt.Fprint(out, ">>> ")
		if !sc.Scan() {
			fmt.Fprintln(out)
			return sc.Err()
		}
		line := strings.TrimSpace(sc.Text())
		switch line {
		case "":
			continue
		case "/exit", "/quit", "/bye":
			return nil
		case "/clear":
			msgs = msgs[:0]
			if system != "" {
				msgs = append(msgs, tokenizer.Message{Role: "system", Content: system})
			}
			continue
		}
		msgs = append(msgs, tokenizer.Message{Role: "user", Content: line})
		text, err := l.Tokenizer.ApplyChatTemplate(msgs, true)
		if err != nil {
			return err
		}
		reply, err := generate(ctx, cmd, l, sf, text, true, out)
		fmt.Fprintln(out)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			fmt.Fprintln(cmd.ErrOrStderr(), "error:", err)
			msgs = msgs[:len(msgs)-1]
			continue
		}
		msgs = append(msgs, tokenizer.Message{Role: "assistant", Content: reply})
	}
}
