// Perplexity of llama.cpp's CPU build (the npm package node-llama-cpp)
// on a GGUF file over given token ids, with the protocol of
// models/default/perplexity.json: consecutive non-overlapping windows,
// each run on its own from position 0; in a window of n tokens the
// logits at position i score token i+1 (n-1 predictions); nll is the mean
// over all predictions of -log p. Token ids are read from a file of
// space-separated ids (models/default/heldout.ids.txt), so tokenization
// plays no part. Run from a directory where node-llama-cpp is installed:
// node llama_ppl.mjs MODEL.gguf IDS.txt WINDOW THREADS
// prints one JSON line.
import {getLlama} from "node-llama-cpp";
import {readFileSync} from "node:fs";

const [modelPath, idsPath, windowArg, threads] = process.argv.slice(2);
const window = Number(windowArg);
const ids = readFileSync(idsPath, "utf8").trim().split(/\s+/).map(Number);
const llama = await getLlama({gpu: false, build: "never"});
const model = await llama.loadModel({modelPath});
const ctx = await model.createContext({contextSize: window, batchSize: window, threads: Number(threads)});
const seq = ctx.getSequence();
// Full distribution: no temperature change, no truncation.
const next = {probabilities: true, options: {temperature: 1, topK: 0, topP: 1, minP: 0}};
let nll = 0, predictions = 0, minMass = 1;
const t0 = performance.now();
for (let start = 0; start < ids.length; start += window) {
    const w = ids.slice(start, start + window);
    await seq.clearHistory();
    const input = w.map((tok, i) => (i + 1 < w.length ? [tok, {generateNext: next}] : tok));
    const out = await seq.controlledEvaluate(input);
    for (let i = 0; i + 1 < w.length; i++) {
        const probs = out[i].next.probabilities;
        let mass = 0;
        for (const p of probs.values()) mass += p;
        minMass = Math.min(minMass, mass);
        const p = probs.get(w[i + 1]);
        if (p == null || !(p > 0)) throw new Error(`window at ${start}, position ${i}: no probability for token ${w[i + 1]}`);
        nll -= Math.log(p);
        predictions++;
    }
}
console.log(JSON.stringify({
    engine: "llama.cpp", model: modelPath, tokens: ids.length, window, predictions,
    nll: nll / predictions, ppl: Math.exp(nll / predictions),
    min_probability_mass: minMass, seconds: (performance.now() - t0) / 1000,
}));
await model.dispose();
