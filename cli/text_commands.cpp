// `rlforge tokenize` and `rlforge detokenize`: text to token ids and back with a model
// directory's tokenizer (tokenizer.json or tokenizer.model, as `init-model` writes them).
#include "cli/command.hpp"

#include <iostream>

#include <nlohmann/json.hpp>

#include "cli/flag_values.hpp"
#include "cli/model_text.hpp"

namespace rlforge::cli {
namespace {

using json = nlohmann::ordered_json;

int run_tokenize(const parsed_flags& flags) {
  return run_reporting("tokenize", [&] {
    const auto text = *flags.get("--text");
    require_utf8("--text", text);
    const auto chat = load_model_text(*flags.get("--model"));
    const auto& tok = chat.tokenizer();
    const auto ids = tok.encode(text, flags.has("--add-special-tokens"));
    if (flags.has("--json")) {
      json pieces = json::array();
      for (auto id : ids)
        pieces.push_back(tok.id_to_token(id).value_or(""));
      std::cout << json{{"ids", ids}, {"tokens", pieces}}.dump() << "\n";
    } else {
      std::cout << format_int_list(ids) << "\n";
    }
    return 0;
  });
}

int run_detokenize(const parsed_flags& flags) {
  return run_reporting("detokenize", [&] {
    const auto ids = parse_int_list("--tokens", *flags.get("--tokens"));
    const auto chat = load_model_text(*flags.get("--model"));
    require_known_ids(chat.tokenizer(), ids, "--tokens");
    const auto text = chat.tokenizer().decode(ids, flags.has("--skip-special-tokens"));
    if (flags.has("--json"))
      std::cout << json{{"text", text}}.dump() << "\n";
    else
      std::cout << text << "\n";
    return 0;
  });
}

const command_registrar tokenize_reg{
    "tokenize",
    {"token ids of a text with a model's tokenizer",
     {required_flag("--model", "model directory with tokenizer.json or tokenizer.model"),
      required_flag("--text", "the text to encode, UTF-8"),
      switch_flag("--add-special-tokens", "add the special tokens the post-processor adds"),
      switch_flag("--json", "print {\"ids\": [...], \"tokens\": [...]} instead of the ids")},
     "rlforge tokenize --model /tmp/base --text 'Hello world' --json",
     {},
     run_tokenize}};

const command_registrar detokenize_reg{
    "detokenize",
    {"the text of token ids with a model's tokenizer",
     {required_flag("--model", "model directory with tokenizer.json or tokenizer.model"),
      required_flag("--tokens", "comma-separated token ids"),
      switch_flag("--skip-special-tokens", "leave special tokens out of the text"),
      switch_flag("--json", "print {\"text\": ...}")},
     "rlforge detokenize --model /tmp/base --tokens 72,101,108",
     {},
     run_detokenize}};

} // namespace
} // namespace rlforge::cli
