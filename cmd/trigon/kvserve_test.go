package main

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"testing"
	"time"
)

// TestServeStatesKVCapacity runs `serve` (the embedded default model on
// the CPU, no -v) with each --kv-cache-dtype and the same --kv-memory,
// which sizes the CPU's KV pools, and checks that the startup log states
// the dtype and the capacity in tokens, that /metrics' capacity gauge
// carries the same count under the dtype's label, and that the quantized
// caches hold more tokens than bf16 in the same memory. 8 MiB holds
// fewer blocks than --max-seqs 4 would take (4 sequences of the model's
// 1024 tokens), so the memory, not the sequence count, sets every
// capacity.
//
// The counts, from the default model's 8 layers of 5 KV heads of 32
// dims, 16-token blocks, one block kept back (runner.CapacityTokens):
//   - bf16: 8·2·(5·16·32·2) = 81,920 bytes a block, 8 MiB / that = 102
//     blocks, 101·16 = 1,616 tokens;
//   - int8 (groups of 32): 8·(2·5·16·32 + 2·5·16·2) = 43,520 bytes a
//     block (values and F16 scales), 192 blocks, 3,056 tokens;
//   - int4 (window 128): 8·(2·5·16·16 + 5·2·32·2 + 5·16·2·2) + 4 = 28,164
//     bytes a block (values, K's per-channel and V's per-token scale and
//     zero point, the window map entry), after the bf16 window pool of
//     16 + 4·(8+3) = 60 blocks (8·2·60·5·16·32·2 = 4,915,200 bytes): 123
//     blocks, 1,952 tokens.
func TestServeStatesKVCapacity(t *testing.T) {
	want := map[string]int{"bf16": 1616, "int8": 3056, "int4": 1952}
	capacity := map[string]int{}
	for _, dtype := range []string{"bf16", "int8", "int4"} {
		t.Run(dtype, func(t *testing.T) {
			var logs syncBuffer
			root := newRoot()
			root.SetOut(io.Discard)
			root.SetErr(&logs)
			root.SetArgs([]string{"serve", "--port", "0", "--device", "cpu", "--threads", "2", "--shutdown-timeout", "1s",
				"--kv-cache-dtype", dtype, "--kv-memory", strconv.Itoa(8 << 20), "--max-seqs", "4", "--max-num-batched-tokens", "256"})
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- root.ExecuteContext(ctx) }()
			defer func() {
				cancel()
				select {
				case err := <-done:
					if err != nil {
						t.Errorf("serve: %v", err)
					}
				case <-time.After(10 * time.Second):
					t.Error("serve did not return after its context ended")
				}
				if t.Failed() {
					t.Logf("serve's log:\n%s", logs.String())
				}
			}()
			// wait returns re's first match in the log once it appears.
			wait := func(re *regexp.Regexp) []string {
				t.Helper()
				for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
					if m := re.FindStringSubmatch(logs.String()); m != nil {
						return m
					}
					select {
					case err := <-done:
						done <- err
						t.Fatalf("serve returned before logging %v: %v", re, err)
					default:
					}
				}
				t.Fatalf("no %v in serve's log", re)
				return nil
			}
			url := wait(regexp.MustCompile(`addr=(http://\S+)`))[1]
			loaded := wait(regexp.MustCompile(`msg="model loaded".* kv_cache_dtype=(\S+) kv_capacity_tokens=(\d+)`))
			if loaded[1] != dtype {
				t.Errorf("startup log: kv_cache_dtype=%s, want %s", loaded[1], dtype)
			}
			logged, _ := strconv.Atoi(loaded[2])
			if logged != want[dtype] {
				t.Errorf("startup log: kv_capacity_tokens=%s, want %d", loaded[2], want[dtype])
			}
			resp, err := http.Get(url + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("/metrics: status %d, %v", resp.StatusCode, err)
			}
			gauge := regexp.MustCompile(`(?m)^trigon_kv_cache_capacity_tokens\{dtype="([^"]*)",model_name="[^"]+"\} (\S+)$`).FindAllStringSubmatch(string(body), -1)
			if len(gauge) != 1 || gauge[0][1] != dtype || gauge[0][2] != strconv.Itoa(logged) {
				t.Errorf("/metrics capacity gauge %q, want one series with dtype %q at %d tokens", gauge, dtype, logged)
			}
			capacity[dtype] = logged
		})
	}
	for _, dtype := range []string{"int8", "int4"} {
		if c, ok := capacity[dtype]; !ok || !(c > capacity["bf16"]) {
			t.Errorf("capacity in 8 MiB: %s %d tokens, bf16 %d; want more than bf16", dtype, c, capacity["bf16"])
		}
	}
	t.Logf("capacity in tokens: %v", capacity)
}
