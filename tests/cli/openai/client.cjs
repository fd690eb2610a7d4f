// The official OpenAI JavaScript client (npm `openai`, installed by tests/support/npm_ci.sh) as
// the client of a real `rlforge serve` (tests/cli/openai/run.sh starts it):
//  - /v1/models lists the base model;
//  - completions of a token-id prompt equal, token for token, the Tinker API's `sample` of the
//    same prompt and seed (ids read back with return_tokens_as_token_ids), and streaming gives
//    the same tokens and text as the whole answer;
//  - chat completions go through the chat template; streamed, the chunks add up to the whole
//    answer, usage included;
//  - four clients at once get what each gets alone;
//  - a client that leaves mid-stream stops its generation (the server's generated-token counter
//    stops growing, far below the answer's length);
//  - bad input gets the OpenAI client's error classes with the server's message.
// Usage: node client.cjs NODE_MODULES BASE_URL API_KEY MODEL. Exit 0 when every check passed.
"use strict";

const [modules, baseUrl, apiKey, model] = process.argv.slice(2);
const OpenAI = require(require("path").join(modules, "openai"));

const client = new OpenAI({ baseURL: baseUrl + "/v1", apiKey, maxRetries: 0, timeout: 60000 });
let failures = 0;

function check(ok, what) {
  if (!ok) {
    failures++;
    console.error("FAIL: " + what);
  } else {
    console.log("ok: " + what);
  }
}

function ids(entries) {
  return entries.map((t) => {
    if (!t.startsWith("token_id:")) throw new Error("not a token id: " + t);
    return Number(t.slice("token_id:".length));
  });
}

function same(a, b) {
  return JSON.stringify(a) === JSON.stringify(b);
}

async function tinker(path, body) {
  const r = await fetch(baseUrl + "/api/v1/" + path, {
    method: "POST",
    headers: { "X-API-Key": apiKey, "Content-Type": "application/json" },
    body: JSON.stringify(body),
  });
  const j = await r.json();
  if (r.status !== 200) throw new Error(path + ": " + r.status + " " + JSON.stringify(j));
  return j;
}

/// The Tinker API's sample of `prompt` (token ids) on the base model.
async function tinkerSample(prompt, n, maxTokens, seed) {
  const submitted = await tinker("asample", {
    type: "sample",
    base_model: model,
    prompt: { chunks: [{ type: "encoded_text", tokens: prompt }] },
    num_samples: n,
    sampling_params: { max_tokens: maxTokens, seed, temperature: 1.0 },
  });
  for (;;) {
    const r = await tinker("retrieve_future", { request_id: submitted.request_id });
    if (r.type === "try_again") continue;
    if (r.error) throw new Error("sample failed: " + JSON.stringify(r));
    return r.sequences;
  }
}

async function generatedTokens() {
  const r = await fetch(baseUrl + "/metrics", { headers: { Authorization: "Bearer " + apiKey } });
  const text = await r.text();
  const m = text.match(/^rlforge_tokens_total\{kind="generated"\} (\S+)$/m);
  return m ? Number(m[1]) : 0;
}

async function collectStream(stream, chat) {
  const out = {};
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      const o = (out[c.index] = out[c.index] || { text: "", tokens: [], finish: null });
      const piece = chat ? c.delta.content : c.text;
      if (piece) o.text += piece;
      if (c.logprobs) {
        const toks = chat ? c.logprobs.content.map((e) => e.token) : c.logprobs.tokens;
        o.tokens.push(...ids(toks));
      }
      if (c.finish_reason) o.finish = c.finish_reason;
    }
  }
  return { choices: out, usage };
}

async function main() {
  const models = await client.models.list();
  check(models.data.some((m) => m.id === model), "/v1/models lists the base model " + model);

  // Completions against the Tinker sample of the same prompt and seed.
  const prompt = [1, 17, 42, 99];
  const whole = await client.completions.create({
    model, prompt, max_tokens: 12, n: 2, seed: 5, temperature: 1, logprobs: 0,
    return_tokens_as_token_ids: true,
  });
  const reference = await tinkerSample(prompt, 2, 12, 5);
  for (let j = 0; j < 2; j++) {
    const got = ids(whole.choices[j].logprobs.tokens);
    check(same(got, reference[j].tokens),
          `completion choice ${j} has the Tinker sample's tokens (${got} vs ${reference[j].tokens})`);
    const lp = whole.choices[j].logprobs.token_logprobs;
    check(lp.every((x, i) => Math.abs(x - reference[j].logprobs[i]) < 1e-4),
          `completion choice ${j} has the Tinker sample's log-probs`);
  }
  check(whole.usage.prompt_tokens === 4, "usage counts the prompt");

  // The same request streamed: the same tokens and text.
  const streamed = await collectStream(await client.completions.create({
    model, prompt, max_tokens: 12, n: 2, seed: 5, temperature: 1, logprobs: 0,
    return_tokens_as_token_ids: true, stream: true,
  }), false);
  for (let j = 0; j < 2; j++) {
    check(same(streamed.choices[j].tokens, reference[j].tokens),
          `streamed completion choice ${j} has the Tinker sample's tokens`);
    check(streamed.choices[j].text === whole.choices[j].text,
          `streamed completion choice ${j} has the whole answer's text`);
    check(streamed.choices[j].finish === whole.choices[j].finish_reason,
          `streamed completion choice ${j} ends as the whole answer does`);
  }

  // Chat, whole and streamed.
  const messages = [{ role: "system", content: "Answer briefly." }, { role: "user", content: "Hi there" }];
  const chatWhole = await client.chat.completions.create({
    model, messages, max_tokens: 20, seed: 9, logprobs: true, return_tokens_as_token_ids: true,
  });
  check(chatWhole.choices[0].message.role === "assistant", "chat answers as the assistant");
  const chatStream = await collectStream(await client.chat.completions.create({
    model, messages, max_tokens: 20, seed: 9, logprobs: true, return_tokens_as_token_ids: true,
    stream: true, stream_options: { include_usage: true },
  }), true);
  check(chatStream.choices[0].text === chatWhole.choices[0].message.content,
        "streamed chat content equals the whole answer's");
  check(same(chatStream.choices[0].tokens, ids(chatWhole.choices[0].logprobs.content.map((e) => e.token))),
        "streamed chat tokens equal the whole answer's");
  check(same(chatStream.usage, chatWhole.usage), "streamed usage equals the whole answer's");
  const topped = await client.chat.completions.create({
    model, messages, max_tokens: 4, seed: 9, logprobs: true, top_logprobs: 3,
  });
  check(topped.choices[0].logprobs.content.every((e) => e.top_logprobs.length === 3),
        "top_logprobs gives 3 alternatives per token");

  // Four clients at once get what each got alone.
  const seeds = [11, 12, 13, 14];
  const alone = [];
  for (const seed of seeds)
    alone.push(await client.completions.create({ model, prompt, max_tokens: 10, seed, logprobs: 0,
                                                 return_tokens_as_token_ids: true }));
  const together = await Promise.all(seeds.map((seed) => client.completions.create({
    model, prompt, max_tokens: 10, seed, logprobs: 0, return_tokens_as_token_ids: true })));
  for (let i = 0; i < seeds.length; i++)
    check(same(together[i].choices[0].logprobs.tokens, alone[i].choices[0].logprobs.tokens),
          `concurrent client ${i} gets its solo tokens`);

  // A client that leaves mid-stream: the generation stops.
  const before = await generatedTokens();
  const long = await client.completions.create({
    model, prompt, max_tokens: 400, seed: 1, stream: true,
  });
  let chunks = 0;
  for await (const chunk of long) {
    if (++chunks === 3) break; // leaving the loop aborts the request
  }
  let last = -1, now = await generatedTokens();
  for (let i = 0; i < 50 && now !== last; i++) {
    await new Promise((r) => setTimeout(r, 300));
    last = now;
    now = await generatedTokens();
  }
  check(now === last, "generation stopped after the client left");
  check(now - before < 200, `a left stream generated ${now - before} tokens, not its 400`);

  // Bad input: the client's error classes, the server's messages.
  const refused = async (what, fn, cls, words) => {
    try {
      await fn();
      check(false, what + " was accepted");
    } catch (e) {
      check(e instanceof cls && String(e.message).includes(words),
            `${what}: ${e.constructor.name} ${e.status} "${e.message}"`);
    }
  };
  await refused("a wrong key",
    () => new OpenAI({ baseURL: baseUrl + "/v1", apiKey: "wrong", maxRetries: 0 })
      .completions.create({ model, prompt: "hi" }),
    OpenAI.AuthenticationError, "invalid API key");
  await refused("an unknown model", () => client.completions.create({ model: "gpt-4", prompt: "hi" }),
    OpenAI.NotFoundError, "not served here");
  await refused("a malformed message list",
    () => client.chat.completions.create({ model, messages: [{ role: "user" }] }),
    OpenAI.BadRequestError, "needs content");
  await refused("n over the cap",
    () => client.completions.create({ model, prompt: "hi", n: 100000 }),
    OpenAI.BadRequestError, "exceeds this server's limit");
  const after = await client.completions.create({ model, prompt: "hi", max_tokens: 2 });
  check(after.choices.length === 1, "the server goes on serving after the refusals");
}

main().then(
  () => {
    console.log(failures ? `${failures} check(s) failed` : "all checks passed");
    process.exit(failures ? 1 : 0);
  },
  (e) => {
    console.error("error: " + (e && e.stack ? e.stack : e));
    process.exit(1);
  });
