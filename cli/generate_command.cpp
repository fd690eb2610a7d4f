// `rlforge generate`: sample one completion of a tokenised prompt from an HF checkpoint and print
// it as one JSON object {"tokens":[...],"logprobs":[...],"stop_reason":"..."}.
#include "cli/command.hpp"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "backends/error.hpp"
#include "backends/model/causal_lm.hpp"
#include "backends/model/sampler.hpp"
#include "backends/threads.hpp"

namespace rlforge::cli {
namespace {

constexpr const char* usage_line =
    "usage: rlforge generate --model DIR --prompt-tokens 1,2,3 --max-tokens N [--temperature T] "
    "[--top-k K] [--top-p P] [--seed S] [--stop-tokens a,b] [--threads N]";

// Thrown for malformed flag values; reported with exit code 2.
struct usage_error {
  std::string message;
};

int64_t parse_int(const std::string& flag, const std::string& text) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE)
    throw usage_error{flag + " expects an integer, got '" + text + "'"};
  return static_cast<int64_t>(v);
}

uint64_t parse_seed(const std::string& text) {
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  if (text.empty() || text[0] == '-' || end != text.c_str() + text.size() || errno == ERANGE)
    throw usage_error{"--seed expects an unsigned 64-bit integer, got '" + text + "'"};
  return static_cast<uint64_t>(v);
}

double parse_double(const std::string& flag, const std::string& text) {
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE)
    throw usage_error{flag + " expects a number, got '" + text + "'"};
  return v;
}

std::vector<int64_t> parse_int_list(const std::string& flag, const std::string& text) {
  std::vector<int64_t> out;
  size_t start = 0;
  for (;;) {
    const size_t comma = text.find(',', start);
    const std::string item =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (item.empty())
      throw usage_error{flag + " expects comma-separated integers, got '" + text + "'"};
    out.push_back(parse_int(flag, item));
    if (comma == std::string::npos)
      return out;
    start = comma + 1;
  }
}

int run_generate(const args& a) {
  flag_parser flags({"--model", "--prompt-tokens", "--max-tokens", "--temperature", "--top-k",
                     "--top-p", "--seed", "--stop-tokens", "--threads"});
  if (!flags.parse(a)) {
    std::cerr << "rlforge generate: " << flags.error() << " (" << usage_line << ")\n";
    return 2;
  }
  for (const char* required : {"--model", "--prompt-tokens", "--max-tokens"}) {
    if (!flags.has(required)) {
      std::cerr << "rlforge generate: missing " << required << " (" << usage_line << ")\n";
      return 2;
    }
  }
  std::vector<int64_t> prompt;
  backends::sampling_params params;
  int threads = 2;
  try {
    prompt = parse_int_list("--prompt-tokens", *flags.get("--prompt-tokens"));
    params.max_tokens = parse_int("--max-tokens", *flags.get("--max-tokens"));
    if (auto v = flags.get("--temperature"))
      params.temperature = parse_double("--temperature", *v);
    if (auto v = flags.get("--top-k"))
      params.top_k = parse_int("--top-k", *v);
    if (auto v = flags.get("--top-p"))
      params.top_p = parse_double("--top-p", *v);
    if (auto v = flags.get("--seed"))
      params.seed = parse_seed(*v);
    if (auto v = flags.get("--stop-tokens"))
      params.stop_token_ids = parse_int_list("--stop-tokens", *v);
    if (auto v = flags.get("--threads")) {
      const int64_t n = parse_int("--threads", *v);
      if (n < 1 || n > 1024)
        throw usage_error{"--threads must be in [1, 1024], got " + *v};
      threads = static_cast<int>(n);
    }
  } catch (const usage_error& e) {
    std::cerr << "rlforge generate: " << e.message << "\n";
    return 2;
  }

  std::unique_ptr<backends::causal_lm> model;
  try {
    backends::set_intra_op_threads(threads);
    model = backends::causal_lm::load(*flags.get("--model"));
  } catch (const std::exception& e) {
    std::cerr << "rlforge generate: cannot load model from '" << *flags.get("--model")
              << "': " << e.what() << "\n";
    return 1;
  }

  std::vector<backends::sample_result> out;
  try {
    out = backends::generate(*model, {prompt}, {params});
  } catch (const backends::error& e) {
    // Requests the model cannot serve (bad ids, bad parameters) are the caller's input.
    const bool bad_input = e.code() == backends::error_code::invalid_argument ||
                           e.code() == backends::error_code::out_of_range;
    std::cerr << "rlforge generate: " << e.what() << "\n";
    return bad_input ? 2 : 1;
  } catch (const std::exception& e) {
    std::cerr << "rlforge generate: " << e.what() << "\n";
    return 1;
  }
  nlohmann::ordered_json j; // keys in the documented order
  j["tokens"] = out[0].tokens;
  j["logprobs"] = out[0].logprobs;
  j["stop_reason"] = out[0].stop_reason;
  std::cout << j.dump() << "\n";
  return 0;
}

const command_registrar reg{
    "generate", "sample tokens from an HF checkpoint (KV cache; prints JSON)", run_generate};

} // namespace
} // namespace rlforge::cli
