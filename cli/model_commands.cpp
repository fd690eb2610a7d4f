// `rlforge score` and `rlforge init-model`: scoring a token sequence (or a text) with an HF
// checkpoint, and writing a randomly initialised one with a tokenizer of its size.
#include "cli/command.hpp"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include <nlohmann/json.hpp>

#include "backends/error.hpp"
#include "backends/model/causal_lm.hpp"
#include "backends/model/logprobs.hpp"
#include "backends/model/model_config.hpp"
#include "cli/flag_values.hpp"
#include "cli/model_text.hpp"
#include "text/model_tokenizer.hpp"
#include "text/tokenizer.hpp"

namespace rlforge::cli {
namespace {

namespace be = rlforge::backends;
namespace fs = std::filesystem;

std::string format_double(double x) {
  if (!std::isfinite(x))
    return x < 0 ? "-1e308" : "1e308"; // JSON has no infinities; -inf log-prob saturates
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.9g", x);
  return buf;
}

// Scoring: ids and values the model refuses are usage errors; the rest (files) runtime failures.
command_error scoring_error(const be::error& e) {
  const bool usage =
      e.code() == be::error_code::out_of_range || e.code() == be::error_code::invalid_argument;
  return command_error{usage ? 2 : 1, e.what()};
}

// Creating a model: only I/O is a runtime failure; everything else is the given configuration.
command_error creation_error(const be::error& e) {
  return command_error{e.code() == be::error_code::io_error ? 1 : 2, e.what()};
}

int run_score(const parsed_flags& flags) {
  return run_reporting("score", [&] {
    if (flags.has("--tokens") == flags.has("--text"))
      throw usage_error("give exactly one of --tokens and --text");
    // fp32 by default: exact Hugging Face numerics.
    const auto dtype = flags.has("--dtype") ? parse_dtype("--dtype", *flags.get("--dtype"))
                                            : be::compute_dtype::fp32;
    double temperature = 1.0;
    if (auto t = flags.get("--temperature")) {
      temperature = parse_double("--temperature", *t);
      if (!(temperature > 0))
        throw usage_error("--temperature must be a number > 0, got '" + *t + "'");
    }
    std::vector<int64_t> tokens;
    if (auto list = flags.get("--tokens")) {
      tokens = parse_int_list("--tokens", *list);
    } else {
      const auto text = *flags.get("--text");
      require_utf8("--text", text);
      // As Hugging Face's tokenizer(text): with the special tokens its post-processor adds.
      tokens = load_model_text(*flags.get("--model")).tokenizer().encode(text, true);
    }
    if (tokens.size() < 2)
      throw usage_error(std::string(flags.has("--text") ? "--text encodes to " : "--tokens has ") +
                        std::to_string(tokens.size()) + " ids; scoring needs at least 2");
    std::vector<double> lp;
    try {
      auto model = be::causal_lm::load_for_inference(*flags.get("--model"), dtype);
      lp = be::score_tokens(*model, tokens, temperature);
    } catch (const be::error& e) {
      throw scoring_error(e);
    }
    std::string out = "{";
    if (flags.has("--text"))
      out += "\"tokens\":[" + format_int_list(tokens) + "],";
    out += "\"logprobs\":[";
    for (size_t i = 0; i < lp.size(); ++i)
      out += (i ? "," : "") + format_double(lp[i]);
    std::cout << out << "]}\n";
    return 0;
  });
}

// Tokenizer files init-model replaces: a stale one beside a new model would not fit it.
constexpr const char* tokenizer_file_names[] = {"tokenizer.json", "tokenizer_config.json",
                                                "tokenizer.model", "chat_template.jinja"};

// Writes the model tokenizer for `vocab_size` ids into `out`; returns what init-model reports.
nlohmann::json write_model_tokenizer(const fs::path& out, int64_t vocab_size) {
  for (const char* name : tokenizer_file_names) {
    std::error_code ec;
    fs::remove(out / name, ec);
    if (ec)
      throw runtime_failure("cannot remove the old " + (out / name).string() + ": " + ec.message());
  }
  if (vocab_size < static_cast<int64_t>(text::min_model_tokenizer_vocab))
    return nullptr;
  const auto files = text::train_model_tokenizer(static_cast<size_t>(vocab_size));
  text::write_tokenizer_files(out, files);
  const auto tok = text::tokenizer::load(out);
  nlohmann::json specials = nlohmann::json::object();
  for (auto name : {text::end_of_text_token, text::im_start_token, text::im_end_token})
    specials[std::string(name)] = *tok.token_to_id(name);
  return {
      {"vocab_size", tok.vocab_size()}, {"special_tokens", specials}, {"chat_template", "chatml"}};
}

int run_init_model(const parsed_flags& flags) {
  return run_reporting("init-model", [&] {
    if (flags.has("--config") == flags.has("--preset"))
      throw usage_error("give exactly one of --config and --preset");
    int64_t seed = 0;
    if (auto s = flags.get("--seed")) {
      seed = parse_int("--seed", *s);
      if (seed < 0)
        throw usage_error("--seed must be a non-negative integer, got '" + *s + "'");
    }
    be::model_config config;
    try {
      if (auto path = flags.get("--config")) {
        std::ifstream in(*path);
        if (!in)
          throw runtime_failure("cannot open config file " + *path);
        nlohmann::json j;
        try {
          in >> j;
        } catch (const nlohmann::json::exception& e) {
          throw runtime_failure(*path + " is not JSON: " + e.what());
        }
        config = be::parse_model_config(j);
      } else {
        config = be::preset(*flags.get("--preset"));
      }
    } catch (const be::error& e) {
      throw creation_error(e);
    }
    const auto out = *flags.get("--out");
    std::unique_ptr<be::causal_lm> model;
    try {
      model = be::causal_lm::random(config, static_cast<uint64_t>(seed));
      model->save_hf(out);
    } catch (const be::error& e) {
      throw creation_error(e);
    }
    nlohmann::json report{{"out", out},
                          {"architecture", be::to_string(config.arch)},
                          {"num_parameters", model->num_parameters()},
                          {"seed", seed}};
    report["tokenizer"] = write_model_tokenizer(out, config.vocab_size);
    if (report["tokenizer"].is_null())
      report["tokenizer_note"] =
          "no tokenizer: vocab_size " + std::to_string(config.vocab_size) + " is below the " +
          std::to_string(text::min_model_tokenizer_vocab) +
          " ids a byte-level tokenizer needs (256 bytes and 3 special tokens)";
    std::cout << report.dump() << "\n";
    return 0;
  });
}

const command_registrar score_reg{
    "score",
    {"log-probs of tokens or a text under an HF checkpoint",
     {required_flag("--model", "HF checkpoint directory (config.json, safetensors)"),
      optional_flag("--tokens", "comma-separated token ids to score (or --text)"),
      optional_flag("--text", "a text, encoded with the model's tokenizer (or --tokens)"),
      optional_flag("--temperature", "divides the logits (> 0)", "1"),
      optional_flag("--dtype", "compute dtype: fp32 or bf16", "fp32")},
     "rlforge score --model /tmp/base --tokens 1,17,42,99",
     {},
     run_score}};

const command_registrar init_reg{
    "init-model",
    {"write a random HF checkpoint and a tokenizer of its size",
     {optional_flag("--preset", "a model shape: tiny, qwen2.5-0.5b, ... (or --config)"),
      optional_flag("--config", "an HF config.json to take the shape from (or --preset)"),
      required_flag("--out", "directory to write the checkpoint to"),
      optional_flag("--seed", "initialisation seed (>= 0)", "0")},
     "rlforge init-model --preset tiny --out /tmp/base --seed 1",
     {},
     run_init_model}};

} // namespace
} // namespace rlforge::cli
