// Reference renderer for tests/chat/reference_test.cpp. Usage: node render.mjs CASES.json
// CASES.json: [{"config": PATH, "messages": [...], "add_generation_prompt": bool, "extra": {...}}]
// Prints a JSON array with, per case, {"text": ...} or {"error": ...}.
//
// The context is built the way transformers.js builds it for apply_chat_template: messages,
// add_generation_prompt, tools and documents (null unless given), the special tokens the
// tokenizer config sets (a string, or an AddedToken's content), then the extra variables.
import { readFileSync } from "node:fs";
import { Template } from "@huggingface/jinja";

const SPECIAL = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"];

function pickTemplate(config, extra) {
  const t = config.chat_template;
  if (typeof t === "string") return t;
  const named = Object.fromEntries(t.map((x) => [x.name, x.template]));
  if (extra.tools != null && "tool_use" in named) return named.tool_use;
  return named.default;
}

const cases = JSON.parse(readFileSync(process.argv[2], "utf8"));
const compiled = new Map();
const results = [];
for (const c of cases) {
  try {
    const config = JSON.parse(readFileSync(c.config, "utf8"));
    const extra = c.extra ?? {};
    const source = pickTemplate(config, extra);
    if (!compiled.has(source)) compiled.set(source, new Template(source));
    const context = { messages: c.messages, add_generation_prompt: c.add_generation_prompt, tools: null, documents: null };
    for (const key of SPECIAL) {
      const v = config[key];
      if (typeof v === "string" && v) context[key] = v;
      else if (v && typeof v === "object" && typeof v.content === "string") context[key] = v.content;
    }
    Object.assign(context, extra);
    results.push({ text: compiled.get(source).render(context) });
  } catch (e) {
    results.push({ error: String(e && e.message ? e.message : e) });
  }
}
process.stdout.write(JSON.stringify(results));
