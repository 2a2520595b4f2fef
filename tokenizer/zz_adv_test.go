package tokenizer
import ("testing";"strings";"time";"fmt";"math/rand/v2")
func TestZZAdversarial(t *testing.T) {
	names, all := testTokenizers(t)
	r := rand.New(rand.NewPCG(1,2))
	rb := make([]byte, 200000); for i := range rb { rb[i] = byte(r.IntN(256)) }
	inputs := map[string]string{
		"a": strings.Repeat("a", 200000), "bang": strings.Repeat("!", 200000), "sp": strings.Repeat(" ", 200000),
		"nl": strings.Repeat("\n ", 100000), "im": strings.Repeat("<|im_start", 20000), "rand": string(rb),
		"cjk": strings.Repeat("中", 70000), "emoji": strings.Repeat("👨‍👩‍👧", 20000), "meta": strings.Repeat("▁", 70000),
		"mask": strings.Repeat(" <mask> ", 20000), "digits": strings.Repeat("1", 200000), "apos": strings.Repeat("'s", 100000),
	}
	for _, n := range names {
		for k, in := range inputs {
			st := time.Now()
			ids, err := all[n].tok.Encode(in, true)
			if err != nil { t.Fatal(err) }
			d := time.Since(st)
			st = time.Now()
			all[n].tok.Decode(ids, false)
			if d > 100*time.Millisecond || time.Since(st) > 100*time.Millisecond { fmt.Println(n, k, len(in), len(ids), d, time.Since(st)) }
		}
	}
}
