// The reference side of tests/text: runs the JavaScript port of Hugging Face tokenizers
// (@lenml/tokenizers, installed by tests/support/npm_ci.sh) on the same files and texts as the C++ side.
//
//   node reference.js MODULES export NAME DIR      write NAME's tokenizer.json and
//                                                  tokenizer_config.json into DIR
//   node reference.js MODULES run DIR CORPUS OUT   encode/decode every case of CORPUS (JSON:
//                                                  {"cases": [{"name", "text"}]}) with the
//                                                  tokenizer in DIR, write the results to OUT
//   node reference.js MODULES bench DIR TEXT RUNS  encode the file TEXT RUNS times, print JSON
//                                                  {"seconds": [...], "tokens": N, "hash": H}
//                                                  (H: 32-bit FNV-1a over the ids, to check that
//                                                  both sides produced the same ids)
//
// MODULES is the node_modules directory npm_ci.sh filled. NAME is a package suffix (qwen3,
// qwen2_5, llama3, llama2, gpt2) or "llama3-bos": Llama 3 with the post-processor of Meta's later
// files (ByteLevel, then a template that prepends <|begin_of_text|>).
"use strict";
const fs = require("fs");
const path = require("path");

const [modules, command, ...args] = process.argv.slice(2);
if (!modules || !command) {
  console.error("usage: reference.js MODULES export|run|bench ...");
  process.exit(2);
}
const { TokenizerLoader } = require(path.join(modules, "@lenml", "tokenizers"));

function readJson(file) {
  return JSON.parse(fs.readFileSync(file, "utf8"));
}

function exportTokenizer(name, dir) {
  const base = name === "llama3-bos" ? "llama3" : name;
  const models = path.join(modules, "@lenml", `tokenizer-${base}`, "models");
  const tokenizerJSON = readJson(path.join(models, "tokenizer.json"));
  const tokenizerConfig = readJson(path.join(models, "tokenizer_config.json"));
  if (name === "llama3-bos") {
    const bos = "<|begin_of_text|>";
    const bosId = tokenizerJSON.added_tokens.find((t) => t.content === bos).id;
    const piece = (id, typeId) => ({ SpecialToken: { id, type_id: typeId } });
    const seq = (id, typeId) => ({ Sequence: { id, type_id: typeId } });
    tokenizerJSON.post_processor = {
      type: "Sequence",
      processors: [
        { type: "ByteLevel", add_prefix_space: true, trim_offsets: false, use_regex: true },
        {
          type: "TemplateProcessing",
          single: [piece(bos, 0), seq("A", 0)],
          pair: [piece(bos, 0), seq("A", 0), piece(bos, 1), seq("B", 1)],
          special_tokens: { [bos]: { id: bos, ids: [bosId], tokens: [bos] } },
        },
      ],
    };
  }
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, "tokenizer.json"), JSON.stringify(tokenizerJSON));
  fs.writeFileSync(path.join(dir, "tokenizer_config.json"), JSON.stringify(tokenizerConfig));
}

function load(dir) {
  // Silence the library's warnings about unknown tokenizer classes: stdout carries results.
  const warn = console.warn;
  console.warn = () => {};
  try {
    return TokenizerLoader.fromPreTrained({
      tokenizerJSON: readJson(path.join(dir, "tokenizer.json")),
      tokenizerConfig: readJson(path.join(dir, "tokenizer_config.json")),
    });
  } finally {
    console.warn = warn;
  }
}

function decode(tokenizer, ids, skip) {
  // The library refuses an empty list; the text of no ids is "".
  if (ids.length === 0) return "";
  // clean_up_tokenization_spaces is a transformers option on top of the tokenizer's decoder.
  return tokenizer.decode(ids, { skip_special_tokens: skip, clean_up_tokenization_spaces: false });
}

function run(dir, corpusFile, outFile) {
  const tokenizer = load(dir);
  const corpus = readJson(corpusFile);
  const results = corpus.cases.map(({ name, text }) => {
    const ids = tokenizer.encode(text, { add_special_tokens: false });
    const idsSpecial = tokenizer.encode(text, { add_special_tokens: true });
    return {
      name,
      ids,
      ids_special: idsSpecial,
      decoded: decode(tokenizer, ids, false),
      decoded_special: decode(tokenizer, idsSpecial, false),
      decoded_skip: decode(tokenizer, idsSpecial, true),
    };
  });
  fs.writeFileSync(outFile, JSON.stringify({ results }));
}

function bench(dir, textFile, runs) {
  const tokenizer = load(dir);
  const text = fs.readFileSync(textFile, "utf8");
  const ids = tokenizer.encode(text, { add_special_tokens: false }); // warm-up
  let hash = 2166136261;
  for (const id of ids) hash = Math.imul(hash ^ id, 16777619) >>> 0;
  const seconds = [];
  for (let r = 0; r < runs; ++r) {
    const t0 = process.hrtime.bigint();
    tokenizer.encode(text, { add_special_tokens: false });
    seconds.push(Number(process.hrtime.bigint() - t0) / 1e9);
  }
  process.stdout.write(JSON.stringify({ seconds, tokens: ids.length, hash }) + "\n");
}

if (command === "export" && args.length === 2) exportTokenizer(args[0], args[1]);
else if (command === "run" && args.length === 3) run(args[0], args[1], args[2]);
else if (command === "bench" && args.length === 3) bench(args[0], args[1], Number(args[2]));
else {
  console.error(`reference.js: bad command: ${command} ${args.join(" ")}`);
  process.exit(2);
}
