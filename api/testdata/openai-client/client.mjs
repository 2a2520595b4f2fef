// Drives a trigon server with the official OpenAI Node SDK and checks what
// the SDK parses: completions, chat, streaming chat and completions,
// logprobs, n > 1 with a seed, and error mapping.
//
// Usage: node client.mjs BASE_URL   (e.g. http://127.0.0.1:8000/v1)
// Environment: OPENAI_API_KEY (the server's key; any string when none),
//              TRIGON_MODEL (the served model id).
// Prints one JSON line of results on success; exits 1 on any failure.

import OpenAI from "openai";

const baseURL = process.argv[2];
if (!baseURL) {
  console.error("usage: node client.mjs BASE_URL");
  process.exit(2);
}
const model = process.env.TRIGON_MODEL ?? "fake-model";
const client = new OpenAI({
  baseURL,
  apiKey: process.env.OPENAI_API_KEY ?? "unused",
  maxRetries: 0,
  timeout: 30_000,
});

function check(cond, what) {
  if (!cond) throw new Error(`check failed: ${what}`);
}

const prompt = "the cat sat";
const messages = [
  { role: "system", content: "be brief" },
  { role: "user", content: "dog ran far" },
];
const results = {};

// Models.
const models = [];
for await (const m of client.models.list()) models.push(m.id);
check(models.includes(model), `models.list includes ${model}: ${models}`);
const card = await client.models.retrieve(model);
check(card.id === model && card.object === "model", "models.retrieve");

// Completions, non-streamed.
const cmpl = await client.completions.create({ model, prompt, max_tokens: 6, temperature: 0 });
check(cmpl.object === "text_completion", "completion object");
check(cmpl.choices.length === 1 && typeof cmpl.choices[0].text === "string", "completion text");
check(["stop", "length"].includes(cmpl.choices[0].finish_reason), "completion finish_reason");
check(cmpl.usage.total_tokens === cmpl.usage.prompt_tokens + cmpl.usage.completion_tokens, "completion usage");
results.completion = { text: cmpl.choices[0].text, finish: cmpl.choices[0].finish_reason, usage: cmpl.usage };

// Completions, streamed: same text.
let streamed = "";
let finish = null;
for await (const chunk of await client.completions.create({ model, prompt, max_tokens: 6, temperature: 0, stream: true })) {
  for (const c of chunk.choices) {
    streamed += c.text;
    if (c.finish_reason) finish = c.finish_reason;
  }
}
check(streamed === cmpl.choices[0].text, `streamed completion ${JSON.stringify(streamed)} == ${JSON.stringify(cmpl.choices[0].text)}`);
check(finish === cmpl.choices[0].finish_reason, "streamed completion finish_reason");

// Completions with legacy logprobs.
const lp = await client.completions.create({ model, prompt, max_tokens: 4, temperature: 0, logprobs: 3 });
const l = lp.choices[0].logprobs;
check(l && l.tokens.length === lp.usage.completion_tokens, "completion logprobs tokens");
check(l.token_logprobs.every((v) => typeof v === "number" && v <= 0), "completion token_logprobs");
check(l.top_logprobs.every((o) => Object.keys(o).length >= 3 && Object.keys(o).length <= 4), "completion top_logprobs size");
check(l.text_offset[0] === 0, "completion text_offset");

// Chat, non-streamed, with logprobs.
const chat = await client.chat.completions.create({
  model, messages, max_tokens: 8, temperature: 0, logprobs: true, top_logprobs: 2,
});
check(chat.object === "chat.completion", "chat object");
const msg = chat.choices[0].message;
check(msg.role === "assistant" && typeof msg.content === "string", "chat message");
const content = chat.choices[0].logprobs.content;
check(content.length === chat.usage.completion_tokens, "chat logprobs length");
check(content.every((t) => t.top_logprobs.length === 2 && Array.isArray(t.bytes)), "chat top_logprobs");
check(
  content.every((t) => Buffer.from(t.bytes).toString("utf8") === t.token),
  "chat logprob bytes spell the token",
);
results.chat = { text: msg.content, finish: chat.choices[0].finish_reason, usage: chat.usage };

// Chat, streamed with a usage chunk: same text, role first, usage last.
let chatStreamed = "";
let sawRole = false;
let usage = null;
let chatFinish = null;
const stream = await client.chat.completions.create({
  model, messages, max_tokens: 8, temperature: 0, stream: true, stream_options: { include_usage: true },
});
for await (const chunk of stream) {
  if (chunk.usage) usage = chunk.usage;
  for (const c of chunk.choices) {
    if (c.delta.role === "assistant") sawRole = true;
    if (c.delta.content) chatStreamed += c.delta.content;
    if (c.finish_reason) chatFinish = c.finish_reason;
  }
}
check(sawRole, "streamed chat role chunk");
check(chatStreamed === msg.content, `streamed chat ${JSON.stringify(chatStreamed)} == ${JSON.stringify(msg.content)}`);
check(chatFinish === chat.choices[0].finish_reason, "streamed chat finish_reason");
check(usage && usage.completion_tokens === chat.usage.completion_tokens, "streamed chat usage chunk");

// n > 1 with a seed: reproducible, every choice indexed.
const req = { model, messages, max_tokens: 10, temperature: 1, seed: 1234, n: 3 };
const a = await client.chat.completions.create(req);
const b = await client.chat.completions.create(req);
check(a.choices.map((c) => c.index).join() === "0,1,2", "choice indexes");
check(JSON.stringify(a.choices.map((c) => c.message.content)) === JSON.stringify(b.choices.map((c) => c.message.content)), "same seed, same choices");

// Errors map to the SDK's typed exceptions.
async function expectError(cls, status, fn) {
  try {
    await fn();
  } catch (e) {
    check(e instanceof cls, `${cls.name} expected, got ${e?.constructor?.name}: ${e?.message}`);
    check(e.status === status, `status ${status}, got ${e.status}`);
    return e;
  }
  throw new Error(`${cls.name} expected, request succeeded`);
}
const bad = await expectError(OpenAI.BadRequestError, 400, () =>
  client.chat.completions.create({ model, messages, temperature: 5 }),
);
check(bad.param === "temperature", `param temperature, got ${bad.param}`);
await expectError(OpenAI.NotFoundError, 404, () =>
  client.completions.create({ model: "no-such-model", prompt }),
);
const wrongKey = new OpenAI({ baseURL, apiKey: "sk-wrong", maxRetries: 0 });
if (process.env.OPENAI_API_KEY) {
  await expectError(OpenAI.AuthenticationError, 401, () => wrongKey.models.list());
}

console.log(JSON.stringify(results));
