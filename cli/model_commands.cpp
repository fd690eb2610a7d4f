// `rlforge score` and `rlforge init-model`: scoring a token sequence with an HF checkpoint and
// writing a randomly initialised one.
#include "cli/command.hpp"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "backends/error.hpp"
#include "backends/model/causal_lm.hpp"
#include "backends/model/logprobs.hpp"
#include "backends/model/model_config.hpp"

namespace rlforge::cli {
namespace {

namespace be = rlforge::backends;

bool parse_int(const std::string& s, int64_t& out) {
  if (s.empty())
    return false;
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || end != s.c_str() + s.size())
    return false;
  out = v;
  return true;
}

// "5,17,3" -> {5, 17, 3}; false with `bad` set to the offending piece.
bool parse_tokens(const std::string& s, std::vector<int64_t>& out, std::string& bad) {
  std::stringstream in(s);
  std::string piece;
  while (std::getline(in, piece, ',')) {
    int64_t v = 0;
    if (!parse_int(piece, v)) {
      bad = piece;
      return false;
    }
    out.push_back(v);
  }
  if (!s.empty() && s.back() == ',') {
    bad = "";
    return false;
  }
  return true;
}

std::string format_double(double x) {
  if (!std::isfinite(x))
    return x < 0 ? "-1e308" : "1e308"; // JSON has no infinities; -inf log-prob saturates
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.9g", x);
  return buf;
}

int run_score(const args& a) {
  flag_parser flags({"--model", "--tokens", "--temperature"});
  if (!flags.parse(a)) {
    std::cerr << "rlforge score: " << flags.error() << "\n";
    return 2;
  }
  if (!flags.has("--model") || !flags.has("--tokens")) {
    std::cerr << "rlforge score: usage: rlforge score --model DIR --tokens ID,ID,... "
                 "[--temperature T]\n";
    return 2;
  }
  std::vector<int64_t> tokens;
  std::string bad;
  if (!parse_tokens(*flags.get("--tokens"), tokens, bad)) {
    std::cerr << "rlforge score: --tokens must be comma-separated integers, bad entry '" << bad
              << "'\n";
    return 2;
  }
  if (tokens.size() < 2) {
    std::cerr << "rlforge score: --tokens needs at least 2 ids, got " << tokens.size() << "\n";
    return 2;
  }
  double temperature = 1.0;
  if (auto t = flags.get("--temperature")) {
    char* end = nullptr;
    temperature = std::strtod(t->c_str(), &end);
    if (t->empty() || end != t->c_str() + t->size() || !(temperature > 0)) {
      std::cerr << "rlforge score: --temperature must be a number > 0, got '" << *t << "'\n";
      return 2;
    }
  }
  try {
    auto model = be::causal_lm::load(*flags.get("--model"));
    auto lp = be::score_tokens(*model, tokens, temperature);
    std::string out = "{\"logprobs\":[";
    for (size_t i = 0; i < lp.size(); ++i)
      out += (i ? "," : "") + format_double(lp[i]);
    std::cout << out << "]}\n";
    return 0;
  } catch (const be::error& e) {
    std::cerr << "rlforge score: " << e.what() << "\n";
    return e.code() == be::error_code::out_of_range || e.code() == be::error_code::invalid_argument
             ? 2
             : 1;
  } catch (const std::exception& e) {
    std::cerr << "rlforge score: " << e.what() << "\n";
    return 1;
  }
}

int run_init_model(const args& a) {
  flag_parser flags({"--config", "--preset", "--out", "--seed"});
  if (!flags.parse(a)) {
    std::cerr << "rlforge init-model: " << flags.error() << "\n";
    return 2;
  }
  if (flags.has("--config") == flags.has("--preset") || !flags.has("--out")) {
    std::cerr << "rlforge init-model: usage: rlforge init-model (--config FILE | --preset NAME) "
                 "--out DIR [--seed S]\n";
    return 2;
  }
  int64_t seed = 0;
  if (auto s = flags.get("--seed"); s && (!parse_int(*s, seed) || seed < 0)) {
    std::cerr << "rlforge init-model: --seed must be a non-negative integer, got '" << *s << "'\n";
    return 2;
  }
  try {
    be::model_config config;
    if (auto path = flags.get("--config")) {
      std::ifstream in(*path);
      if (!in) {
        std::cerr << "rlforge init-model: cannot open config file " << *path << "\n";
        return 1;
      }
      nlohmann::json j;
      try {
        in >> j;
      } catch (const nlohmann::json::exception& e) {
        std::cerr << "rlforge init-model: " << *path << " is not JSON: " << e.what() << "\n";
        return 1;
      }
      config = be::parse_model_config(j);
    } else {
      config = be::preset(*flags.get("--preset"));
    }
    auto model = be::causal_lm::random(config, static_cast<uint64_t>(seed));
    auto out = *flags.get("--out");
    model->save_hf(out);
    std::cout << nlohmann::json{{"out", out},
                                {"architecture", be::to_string(config.arch)},
                                {"num_parameters", model->num_parameters()},
                                {"seed", seed}}
                   .dump()
              << "\n";
    return 0;
  } catch (const be::error& e) {
    std::cerr << "rlforge init-model: " << e.what() << "\n";
    return e.code() == be::error_code::io_error ? 1 : 2;
  } catch (const std::exception& e) {
    std::cerr << "rlforge init-model: " << e.what() << "\n";
    return 1;
  }
}

const command_registrar score_reg{
  "score", "log-probs of a token sequence under an HF checkpoint (--model DIR --tokens 1,2,3)",
  run_score};

const command_registrar init_reg{
  "init-model", "write a randomly initialised HF checkpoint (--preset NAME | --config FILE) --out DIR",
  run_init_model};

} // namespace
} // namespace rlforge::cli
