// Writes metadata.gguf with an independent GGUF writer (npm @huggingface/gguf 0.4.6),
// so the Go reader is checked against bytes it did not make:
//   npm install @huggingface/gguf@0.4.6 && node write.mjs metadata.gguf
import { serializeGgufMetadata, GGUFValueType as T } from "@huggingface/gguf";
import { writeFileSync } from "fs";
const md = {
  version: { value: 3, type: T.UINT32 },
  tensor_count: { value: 0n, type: T.UINT64 },
  kv_count: { value: 8n, type: T.UINT64 },
  "general.architecture": { value: "qwen2", type: T.STRING },
  "qwen2.block_count": { value: 24, type: T.UINT32 },
  "qwen2.rope.freq_base": { value: 1000000.0, type: T.FLOAT32 },
  "x.neg": { value: -12345, type: T.INT32 },
  "x.big": { value: 1234567890123n, type: T.UINT64 },
  "x.flag": { value: true, type: T.BOOL },
  "tokenizer.ggml.tokens": { value: ["a", "ü", ""], type: T.ARRAY, subType: T.STRING },
  "tokenizer.ggml.scores": { value: [0.5, -0.25], type: T.ARRAY, subType: T.FLOAT32 },
};
writeFileSync(process.argv[2], serializeGgufMetadata(md));
