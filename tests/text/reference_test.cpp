// rlforge::text against the JavaScript port of Hugging Face tokenizers (@lenml/tokenizers 3.7.2)
// on real tokenizer files (GPT-2, Llama 2, Llama 3, Qwen 2.5, Qwen 3) and on tokenizers trained by
// text::train_bpe: ids (with and without special tokens) and decoded text must be identical for
// every case of tests/text/data/corpus.json and of a synthetic corpus. The packages are installed
// by tests/support/npm_ci.sh into a cache directory; without node, npm or the registry
// the tests are skipped, naming what is missing.
#include <cstdio>
#include <sstream>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "tests/text/synthetic_corpus.hpp"
#include "tests/text/test_support.hpp"
#include "text/bpe_trainer.hpp"
#include "text/stream_decoder.hpp"
#include "text/tokenizer.hpp"

namespace rlforge::text::test {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const fs::path source_dir = RLFORGE_TEXT_TEST_SOURCE_DIR;

struct command_result {
  int status;
  std::string output;
};

std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s)
    out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

command_result run(const std::string& command) {
  command_result r{-1, ""};
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr)
    return r;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), p)) > 0)
    r.output.append(buffer, n);
  int status = pclose(p);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// The reference installation, prepared once per process.
struct reference_env {
  fs::path cache;
  fs::path modules;
  std::string skip;    // why the reference cannot run on this machine
  std::string failure; // why preparing it failed
};

// The program `name` as found on PATH, or "".
std::string find_on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path != nullptr ? path : "");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    fs::path candidate = fs::path(dir.empty() ? "." : dir) / name;
    if (access(candidate.c_str(), X_OK) == 0)
      return candidate.string();
  }
  return "";
}

const reference_env& reference() {
  static const reference_env env = [] {
    reference_env e;
    for (const char* tool : {"bash", "node", "npm"})
      if (find_on_path(tool).empty()) {
        e.skip = std::string("reference unavailable: ") + tool + " is not on PATH";
        return e;
      }
    const char* override_dir = std::getenv("RLFORGE_TEXT_REFERENCE_CACHE");
    e.cache =
        override_dir != nullptr ? fs::path(override_dir) : fs::path(RLFORGE_TEXT_REFERENCE_CACHE);
    e.modules = e.cache / "node_modules";
    auto r = run("bash " + quote((source_dir / ".." / "support" / "npm_ci.sh").string()) + " " +
                 quote((source_dir / "reference").string()) + " " + quote(e.cache.string()));
    if (r.status == 3)
      e.skip = "reference unavailable: " + r.output;
    else if (r.status != 0)
      e.failure = "npm_ci.sh failed (status " + std::to_string(r.status) + "): " + r.output;
    return e;
  }();
  return env;
}

#define REQUIRE_REFERENCE()                                                                        \
  do {                                                                                             \
    if (!reference().failure.empty())                                                              \
      FAIL() << reference().failure;                                                               \
    if (!reference().skip.empty())                                                                 \
      GTEST_SKIP() << reference().skip;                                                            \
  } while (false)

std::string node(const std::string& args) {
  auto r = run("node " + quote((source_dir / "reference" / "reference.js").string()) + " " +
               quote(reference().modules.string()) + " " + args);
  if (r.status != 0)
    throw std::runtime_error("node reference.js " + args + " failed: " + r.output);
  return r.output;
}

fs::path export_tokenizer(const std::string& name) {
  fs::path dir = reference().cache / "tokenizers" / name;
  node("export " + name + " " + quote(dir.string()));
  return dir;
}

json corpus_cases() {
  return json::parse(read_file(source_dir / "data" / "corpus.json"));
}

// About `total` bytes of synthetic text in cases of `each` bytes.
json synthetic_cases(size_t total, size_t each, uint64_t seed) {
  synthetic_corpus gen(seed);
  json doc{{"cases", json::array()}};
  for (size_t i = 0; i * each < total; ++i)
    doc["cases"].push_back({{"name", "synthetic_" + std::to_string(i)}, {"text", gen.text(each)}});
  return doc;
}

std::string show(const tokenizer& tok, const std::vector<int64_t>& ids, size_t at) {
  std::string out;
  size_t from = at >= 3 ? at - 3 : 0;
  for (size_t i = from; i < ids.size() && i < at + 4; ++i) {
    auto t = tok.id_to_token(ids[i]);
    out += (i == at ? "[" : "") + std::to_string(ids[i]) + ":" + json(t.value_or("?")).dump() +
           (i == at ? "]" : "") + " ";
  }
  return out;
}

std::string diff_ids(const tokenizer& tok, const std::vector<int64_t>& ours,
                     const std::vector<int64_t>& theirs) {
  size_t at = 0;
  while (at < ours.size() && at < theirs.size() && ours[at] == theirs[at])
    ++at;
  return "first difference at " + std::to_string(at) + " (lengths " + std::to_string(ours.size()) +
         " vs " + std::to_string(theirs.size()) + "): ours " + show(tok, ours, at) +
         "| reference " + show(tok, theirs, at);
}

std::string stream(const tokenizer& tok, const std::vector<int64_t>& ids, bool skip) {
  stream_decoder s(tok, skip);
  std::string out;
  for (int64_t id : ids)
    out += s.push(id);
  return out + s.finish();
}

struct comparison {
  size_t cases = 0;
  size_t bytes = 0;
  size_t tokens = 0;
};

// Runs the reference on `cases` with the tokenizer in `dir` and compares every result with ours.
comparison compare(const fs::path& dir, const json& cases, const std::string& label) {
  fs::path corpus_file = reference().cache / "work" / (label + ".corpus.json");
  fs::path out_file = reference().cache / "work" / (label + ".reference.json");
  write_file(corpus_file, cases.dump());
  node("run " + quote(dir.string()) + " " + quote(corpus_file.string()) + " " +
       quote(out_file.string()));
  json results = json::parse(read_file(out_file))["results"];
  tokenizer tok = tokenizer::load(dir);
  comparison c;
  size_t failures = 0;
  for (size_t i = 0; i < results.size(); ++i) {
    const json& ref = results[i];
    std::string name = ref["name"];
    std::string text = cases["cases"][i]["text"];
    SCOPED_TRACE(label + " / " + name);
    auto ids = tok.encode(text, false);
    auto ids_special = tok.encode(text, true);
    auto ref_ids = ref["ids"].get<std::vector<int64_t>>();
    auto ref_ids_special = ref["ids_special"].get<std::vector<int64_t>>();
    bool ok = true;
    if (ids != ref_ids) {
      ADD_FAILURE() << "encode(add_special_tokens=false): " << diff_ids(tok, ids, ref_ids);
      ok = false;
    }
    if (ids_special != ref_ids_special) {
      ADD_FAILURE() << "encode(add_special_tokens=true): "
                    << diff_ids(tok, ids_special, ref_ids_special);
      ok = false;
    }
    // Decoding is compared on the reference's ids, so that an encoding difference does not hide
    // a decoding one.
    std::string decoded = tok.decode(ref_ids, false);
    std::string decoded_special = tok.decode(ref_ids_special, false);
    std::string decoded_skip = tok.decode(ref_ids_special, true);
    if (decoded != ref["decoded"].get<std::string>()) {
      ADD_FAILURE() << "decode: ours " << json(decoded).dump() << "\nreference "
                    << ref["decoded"].dump();
      ok = false;
    }
    if (decoded_special != ref["decoded_special"].get<std::string>()) {
      ADD_FAILURE() << "decode (special tokens kept): ours " << json(decoded_special).dump()
                    << "\nreference " << ref["decoded_special"].dump();
      ok = false;
    }
    if (decoded_skip != ref["decoded_skip"].get<std::string>()) {
      ADD_FAILURE() << "decode (skip_special_tokens): ours " << json(decoded_skip).dump()
                    << "\nreference " << ref["decoded_skip"].dump();
      ok = false;
    }
    // Streaming: what the stream releases, concatenated, is the reference's decoded text.
    std::string streamed = stream(tok, ref_ids_special, false);
    if (streamed != ref["decoded_special"].get<std::string>()) {
      ADD_FAILURE() << "stream_decoder: ours " << json(streamed).dump() << "\nreference "
                    << ref["decoded_special"].dump();
      ok = false;
    }
    if (!ok && ++failures >= 10) {
      ADD_FAILURE() << label << ": stopping after 10 failing cases";
      break;
    }
    ++c.cases;
    c.bytes += text.size();
    c.tokens += ids.size();
  }
  std::printf("[ reference ] %s: %zu cases, %zu bytes, %zu tokens compared\n", label.c_str(),
              c.cases, c.bytes, c.tokens);
  return c;
}

void compare_family(const std::string& name) {
  REQUIRE_REFERENCE();
  fs::path dir = export_tokenizer(name);
  compare(dir, corpus_cases(), name + ".corpus");
  compare(dir, synthetic_cases(256 * 1024, 2048, 20240601), name + ".synthetic");
}

TEST(Reference, Gpt2MatchesOnEveryCase) {
  compare_family("gpt2");
}

TEST(Reference, Llama2MatchesOnEveryCase) {
  compare_family("llama2");
}

TEST(Reference, Llama3MatchesOnEveryCase) {
  compare_family("llama3");
}

TEST(Reference, Llama3WithBosTemplateMatchesOnEveryCase) {
  compare_family("llama3-bos");
  tokenizer tok = tokenizer::load(reference().cache / "tokenizers" / "llama3-bos");
  auto ids = tok.encode("Hello", true);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(tok.id_to_token(ids.front()), "<|begin_of_text|>");
}

TEST(Reference, Qwen25MatchesOnEveryCase) {
  compare_family("qwen2_5");
}

TEST(Reference, Qwen3MatchesOnEveryCase) {
  compare_family("qwen3");
}

TEST(Reference, TrainedTokenizersLoadAndMatchInBoth) {
  REQUIRE_REFERENCE();
  // Train on the handwritten corpus plus synthetic text, then compare on both.
  std::string training;
  json handwritten = corpus_cases();
  for (const auto& c : handwritten["cases"])
    training += c["text"].get<std::string>() + "\n";
  synthetic_corpus gen(7);
  training += gen.text(200 * 1024);
  json cases = corpus_cases();
  json more = synthetic_cases(64 * 1024, 2048, 99);
  for (const auto& c : more["cases"])
    cases["cases"].push_back(c);

  bpe_trainer_options plain;
  plain.vocab_size = 512;
  bpe_trainer_options with_bos;
  with_bos.vocab_size = 1000;
  with_bos.special_tokens = {"<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"};
  with_bos.bos_token = "<|begin_of_text|>";
  with_bos.eos_token = "<|end_of_text|>";
  with_bos.pad_token = "<|pad|>";
  with_bos.add_bos_token = true;
  int n = 0;
  for (const auto* options : {&plain, &with_bos}) {
    fs::path dir = reference().cache / "trained" / std::to_string(options->vocab_size);
    write_tokenizer_files(dir, train_bpe(training, *options));
    tokenizer tok = tokenizer::load(dir);
    EXPECT_EQ(tok.vocab_size(), static_cast<int64_t>(options->vocab_size));
    compare(dir, cases, "trained" + std::to_string(n++));
  }
}

} // namespace
} // namespace rlforge::text::test
