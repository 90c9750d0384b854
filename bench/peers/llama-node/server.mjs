// A peer for side-by-side runs of `tandem bench`: llama.cpp (through node-llama-cpp's prebuilt
// CPU build, from the npm registry) behind a minimal OpenAI-compatible /v1/completions server
// with Server-Sent Events. llama.cpp's own llama-server cannot be had on this machine (no
// Debian 12 package, no downloads); this serves the same GGUF file with the same engine.
//
//   node server.mjs --model FILE [--port 8090] [--slots 8] [--threads 2] [--ctx 1024]
//
// What it implements, as llama.cpp's and vLLM's servers do: `prompt` as text or as an array
// of token ids, `max_tokens`, `stream` (true only), `ignore_eos`, greedy decoding
// (`temperature` 0; other sampling is not offered), a usage chunk, `data: [DONE]`. Requests
// beyond --slots wait for a free slot, in arrival order. A client that disconnects frees its
// slot at the next token. Every sequence shares one llama.cpp context, which evaluates the
// slots' pending tokens together in one batch per step (node-llama-cpp's batching).
import http from "node:http";
import { getLlama } from "node-llama-cpp";

function flag(name, fallback) {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 && i + 1 < process.argv.length ? process.argv[i + 1] : fallback;
}
const modelPath = flag("model", "");
const port = Number(flag("port", "8090"));
const slots = Number(flag("slots", "8"));
const threads = Number(flag("threads", "2"));
const ctx = Number(flag("ctx", "1024"));
if (!modelPath) {
  console.error("usage: node server.mjs --model FILE [--port 8090] [--slots 8] [--threads 2] [--ctx 1024]");
  process.exit(2);
}

const llama = await getLlama({ gpu: false, build: "never", maxThreads: threads });
const model = await llama.loadModel({ modelPath });
const context = await model.createContext({ sequences: slots, contextSize: ctx * slots, threads, batchSize: 512 });
const free = Array.from({ length: slots }, () => context.getSequence());
const waiting = [];
const takeSlot = () => (free.length ? Promise.resolve(free.pop()) : new Promise((resolve) => waiting.push(resolve)));
function giveSlot(seq) {
  const next = waiting.shift();
  if (next) next(seq);
  else free.push(seq);
}

function sse(res, obj) {
  res.write(`data: ${typeof obj === "string" ? obj : JSON.stringify(obj)}\n\n`);
}
function fail(res, status, message) {
  res.writeHead(status, { "Content-Type": "application/json" });
  res.end(JSON.stringify({ error: { message, type: "invalid_request_error" } }));
}

async function complete(req, res, body) {
  const prompt = body.prompt;
  const tokens = Array.isArray(prompt) ? prompt.map(Number) : typeof prompt === "string" ? model.tokenize(prompt) : null;
  if (!tokens || tokens.length === 0 || tokens.some((t) => !Number.isInteger(t) || t < 0)) {
    return fail(res, 400, "prompt: a non-empty string or array of token ids is required");
  }
  const maxTokens = Number(body.max_tokens ?? 16);
  if (!Number.isInteger(maxTokens) || maxTokens < 1) return fail(res, 400, "max_tokens: a positive integer is required");
  if (body.stream !== true) return fail(res, 400, "stream: only stream=true is served");
  if (tokens.length + maxTokens > ctx) return fail(res, 400, `prompt + max_tokens exceeds the ${ctx}-token slot`);
  let gone = false;
  res.on("close", () => (gone = true));
  const seq = await takeSlot();
  const id = `cmpl-${Date.now()}-${Math.random().toString(36).slice(2, 8)}`;
  res.writeHead(200, { "Content-Type": "text/event-stream", "Cache-Control": "no-cache", Connection: "keep-alive" });
  let produced = 0;
  let reason = "length";
  try {
    for await (const token of seq.evaluate(tokens, { temperature: 0, yieldEogToken: true })) {
      if (gone) break;
      if (!body.ignore_eos && model.isEogToken(token)) {
        reason = "stop";
        break;
      }
      ++produced;
      const text = model.detokenize([token]);
      sse(res, { id, object: "text_completion", model: body.model ?? "", choices: [{ index: 0, text, finish_reason: null }] });
      if (produced >= maxTokens) break;
    }
  } finally {
    await seq.clearHistory();
    giveSlot(seq);
  }
  if (gone) return;
  sse(res, { id, object: "text_completion", model: body.model ?? "", choices: [{ index: 0, text: "", finish_reason: reason }] });
  sse(res, { id, object: "text_completion", choices: [], usage: { prompt_tokens: tokens.length, completion_tokens: produced, total_tokens: tokens.length + produced } });
  sse(res, "[DONE]");
  res.end();
}

const server = http.createServer((req, res) => {
  if (req.method !== "POST" || req.url !== "/v1/completions") return fail(res, 404, `no route ${req.method} ${req.url}`);
  const chunks = [];
  req.on("data", (c) => chunks.push(c));
  req.on("end", () => {
    let body;
    try {
      body = JSON.parse(Buffer.concat(chunks).toString("utf8"));
    } catch (e) {
      return fail(res, 400, `body: not JSON (${e.message})`);
    }
    complete(req, res, body).catch((e) => {
      if (!res.headersSent) fail(res, 500, String(e));
      else res.end();
    });
  });
});
server.keepAliveTimeout = 60000;
server.listen(port, "127.0.0.1", () => console.log(`llama-node: ready on http://127.0.0.1:${port} (${slots} slots, ${threads} threads)`));
