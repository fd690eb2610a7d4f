// `rlforge generate`: sample one completion from an HF checkpoint and print it as one JSON object
// {"tokens":[...],"logprobs":[...],"stop_reason":"...", "text":"..."}. The prompt is token ids
// (--prompt-tokens), a text (--prompt), a user message in the model's chat template (--prompt
// with --chat) or chat messages (--messages JSON).
#include "cli/command.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <exception>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backends/error.hpp"
#include "backends/model/causal_lm.hpp"
#include "backends/model/sampler.hpp"
#include "backends/threads.hpp"
#include "cli/flag_values.hpp"
#include "cli/model_text.hpp"

namespace rlforge::cli {
namespace {

using json = nlohmann::ordered_json;

// What to sample from: the prompt ids and, when the model has one, its tokenizer.
struct prompt_input {
  std::vector<int64_t> ids;
  std::optional<prompt::chat_prompt> text;
  bool from_text = false; // the ids were encoded here, so they are printed too
  bool chat = false;      // rendered with the chat template
};

prompt_input read_prompt(const parsed_flags& flags) {
  const int given = static_cast<int>(flags.has("--prompt-tokens")) +
                    static_cast<int>(flags.has("--prompt")) +
                    static_cast<int>(flags.has("--messages"));
  if (given != 1)
    throw usage_error(given == 0 ? "missing --prompt-tokens, --prompt or --messages"
                                 : "give only one of --prompt-tokens, --prompt and --messages");
  if (flags.has("--chat") && !flags.has("--prompt"))
    throw usage_error("--chat applies to --prompt (--messages is always a chat)");
  const auto dir = *flags.get("--model");
  prompt_input in;
  if (auto ids = flags.get("--prompt-tokens")) {
    in.ids = parse_int_list("--prompt-tokens", *ids);
    // The text of the completion is printed when the model has a tokenizer.
    if (has_tokenizer_files(dir))
      in.text = load_model_text(dir);
    return in;
  }
  in.from_text = true;
  json messages;
  if (auto text = flags.get("--prompt")) {
    require_utf8("--prompt", *text);
    in.text = load_model_text(dir);
    if (!flags.has("--chat")) {
      // As Hugging Face's tokenizer(text): with the special tokens its post-processor adds.
      in.ids = in.text->tokenizer().encode(*text, true);
      if (in.ids.empty())
        throw usage_error("--prompt encodes to no tokens");
      return in;
    }
    messages = json::array({json{{"role", "user"}, {"content", *text}}});
  } else {
    messages = parse_messages("--messages", *flags.get("--messages"));
    in.text = load_model_text(dir);
  }
  in.chat = true;
  in.ids = encode_chat(*in.text, messages);
  return in;
}

int run_generate(const parsed_flags& flags) {
  return run_reporting("generate", [&] {
    backends::sampling_params params;
    int threads = 2;
    params.max_tokens = parse_int("--max-tokens", *flags.get("--max-tokens"));
    if (auto v = flags.get("--temperature"))
      params.temperature = parse_double("--temperature", *v);
    if (auto v = flags.get("--top-k"))
      params.top_k = parse_int("--top-k", *v);
    if (auto v = flags.get("--top-p"))
      params.top_p = parse_double("--top-p", *v);
    if (auto v = flags.get("--seed"))
      params.seed = parse_seed("--seed", *v);
    if (auto v = flags.get("--stop-tokens"))
      params.stop_token_ids = parse_int_list("--stop-tokens", *v);
    if (auto v = flags.get("--threads")) {
      const int64_t n = parse_int("--threads", *v);
      if (n < 1 || n > 1024)
        throw usage_error("--threads must be in [1, 1024], got " + *v);
      threads = static_cast<int>(n);
    }
    // fp32 by default: exact Hugging Face numerics.
    const auto dtype = flags.has("--dtype") ? parse_dtype("--dtype", *flags.get("--dtype"))
                                            : backends::compute_dtype::fp32;
    const auto prompt = read_prompt(flags);
    // A chat turn ends with the template's end-of-turn token, as generation_config's eos ids
    // end it in Hugging Face's generate.
    if (prompt.chat && prompt.text->end_of_turn_id()) {
      auto& stops = params.stop_token_ids;
      const auto eot = *prompt.text->end_of_turn_id();
      if (std::find(stops.begin(), stops.end(), eot) == stops.end())
        stops.push_back(eot);
    }

    std::unique_ptr<backends::causal_lm> model;
    try {
      backends::set_intra_op_threads(threads);
      model = backends::causal_lm::load_for_inference(*flags.get("--model"), dtype);
    } catch (const std::exception& e) {
      throw runtime_failure("cannot load model from '" + *flags.get("--model") + "': " + e.what());
    }

    std::vector<backends::sample_result> out;
    try {
      out = backends::generate(*model, {prompt.ids}, {params});
    } catch (const backends::error& e) {
      // Requests the model cannot serve (bad ids, bad parameters) are the caller's input.
      const bool bad_input = e.code() == backends::error_code::invalid_argument ||
                             e.code() == backends::error_code::out_of_range;
      throw command_error{bad_input ? 2 : 1, e.what()};
    }
    json j; // keys in the documented order
    if (prompt.from_text)
      j["prompt_tokens"] = prompt.ids;
    j["tokens"] = out[0].tokens;
    j["logprobs"] = out[0].logprobs;
    j["stop_reason"] = out[0].stop_reason;
    if (prompt.text)
      j["text"] = prompt.text->decode_generated(out[0].tokens, /*skip_special_tokens=*/true);
    std::cout << j.dump() << "\n";
    return 0;
  });
}

const command_registrar reg{
    "generate",
    {"sample tokens from an HF checkpoint (KV cache; prints JSON with the text)",
     {required_flag("--model", "HF checkpoint directory"),
      optional_flag("--prompt-tokens", "the prompt as comma-separated token ids"),
      optional_flag("--prompt", "the prompt as a text (with --chat: a user message)"),
      switch_flag("--chat", "render --prompt with the model's chat template"),
      optional_flag("--messages", "the prompt as chat messages, a JSON list of {role, content}"),
      required_flag("--max-tokens", "most tokens to generate (>= 1)"),
      optional_flag("--temperature", "sampling temperature (0 = greedy)", "1"),
      optional_flag("--top-k", "keep the k most likely tokens (-1 = off)", "-1"),
      optional_flag("--top-p", "keep the smallest set of probability >= p (1 = off)", "1"),
      optional_flag("--seed", "sampling seed (unseeded: random)"),
      optional_flag("--stop-tokens", "comma-separated token ids that end the sequence"),
      optional_flag("--threads", "torch threads (1..1024)", "2"),
      optional_flag("--dtype", "compute dtype: fp32 or bf16", "fp32")},
     "rlforge generate --model /tmp/base --prompt 'Hello' --chat --max-tokens 16 --seed 1",
     {},
     run_generate}};

} // namespace
} // namespace rlforge::cli
