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

int run_tokenize(const args& a) {
  return run_reporting("tokenize", [&] {
    flag_parser flags({"--model", "--text"}, {"--add-special-tokens", "--json"});
    if (!flags.parse(a))
      throw usage_error(flags.error());
    if (!flags.has("--model") || !flags.has("--text"))
      throw usage_error("usage: rlforge tokenize --model DIR --text TEXT [--add-special-tokens] "
                        "[--json]");
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

int run_detokenize(const args& a) {
  return run_reporting("detokenize", [&] {
    flag_parser flags({"--model", "--tokens"}, {"--skip-special-tokens", "--json"});
    if (!flags.parse(a))
      throw usage_error(flags.error());
    if (!flags.has("--model") || !flags.has("--tokens"))
      throw usage_error("usage: rlforge detokenize --model DIR --tokens ID,ID,... "
                        "[--skip-special-tokens] [--json]");
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
    "tokenize", "token ids of a text with a model's tokenizer (--model DIR --text TEXT)",
    run_tokenize};

const command_registrar detokenize_reg{
    "detokenize", "the text of token ids with a model's tokenizer (--model DIR --tokens 1,2,3)",
    run_detokenize};

} // namespace
} // namespace rlforge::cli
