// Prompt processing and generation speed of llama.cpp's CPU build (the
// npm package node-llama-cpp, driven through its node API) on one GGUF:
// node llama_bench.mjs MODEL.gguf THREADS INPUT_LEN OUTPUT_LEN RUNS
// prints one JSON line per run: prompt tok/s (the prompt evaluated in one
// batch) and generation tok/s (greedy, after the first token).
import {getLlama} from "node-llama-cpp";

const [modelPath, threads, inLen, outLen, runs] = process.argv.slice(2);
const llama = await getLlama({gpu: false, build: "never"});
const model = await llama.loadModel({modelPath});
const ctx = await model.createContext({
    contextSize: Number(inLen) + Number(outLen) + 8,
    batchSize: Number(inLen),
    threads: Number(threads),
});
const seq = ctx.getSequence();
let seed = 1;
const rand = () => (seed = (seed * 1103515245 + 12345) % 2147483648);
for (let run = 0; run < Number(runs) + 1; run++) {
    const prompt = Array.from({length: Number(inLen)}, () => 1 + rand() % 8000);
    await seq.clearHistory();
    const t0 = performance.now();
    await seq.evaluateWithoutGeneratingNewTokens(prompt.slice(0, -1));
    const t1 = performance.now();
    let n = 0, tFirst = 0;
    for await (const tok of seq.evaluate(prompt.slice(-1), {temperature: 0})) {
        if (n === 0) tFirst = performance.now();
        if (++n >= Number(outLen)) break;
    }
    const t2 = performance.now();
    if (run === 0) continue; // warmup
    console.log(JSON.stringify({
        engine: "llama.cpp", threads: Number(threads),
        prompt_tokens_per_s: (Number(inLen) - 1) / ((t1 - t0) / 1000),
        decode_tokens_per_s: (n - 1) / ((t2 - tFirst) / 1000),
    }));
}
