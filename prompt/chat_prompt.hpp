#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "chat/template_renderer.hpp"
#include "text/tokenizer.hpp"

/// rlforge::prompt: prompts from chat messages for a model directory — its tokenizer
/// (rlforge::text) and its chat template (rlforge::chat) together. Standard C++ and those two
/// libraries only; drivers (`rlforge generate --chat`, the GRPO job's `--env` mode) use it.
///
/// ```cpp
/// auto chat = prompt::chat_prompt::load("/models/tiny");
/// auto ids = chat.encode(json::parse(R"([{"role": "user", "content": "Hi"}])"), true);
/// // ... generate, stopping on chat.end_of_turn_id() ...
/// std::string reply = chat.decode_generated(sampled, /*skip_special_tokens=*/true);
/// ```
namespace rlforge::prompt {

/// What this library refuses on its own (a template unfit for multi-turn rollouts, ...). Errors
/// of the tokenizer and of the template come as `text::tokenizer_error` and
/// `chat::template_error`.
class prompt_error : public std::runtime_error {
public:
  explicit prompt_error(const std::string& message) : std::runtime_error(message) {}
};

/// A model's tokenizer and chat template. Immutable after construction: every const member may
/// run concurrently.
class chat_prompt {
public:
  /// Loads `dir`'s tokenizer (`text::tokenizer::load`) and, when its tokenizer_config.json (or
  /// chat_template.jinja) has one, its chat template. Throws `text::tokenizer_error` for a
  /// missing or malformed tokenizer and `chat::template_error` for a template that does not
  /// compile; a configuration without a template is fine until one is needed.
  static chat_prompt load(const std::filesystem::path& dir);

  /// From parts already loaded (`renderer` empty: no chat template).
  chat_prompt(text::tokenizer tokenizer, std::optional<chat::template_renderer> renderer);

  const text::tokenizer& tokenizer() const noexcept { return tokenizer_; }

  /// Whether the model has a chat template.
  bool has_template() const noexcept { return renderer_.has_value(); }

  /// The prompt text for `messages` (a JSON array of {"role", "content"} objects), as
  /// transformers' `apply_chat_template(tokenize=False)`. Throws `prompt_error` without a
  /// template, `chat::template_error` when the template refuses the messages.
  std::string render(const nlohmann::ordered_json& messages, bool add_generation_prompt) const;

  /// The ids of `render(...)`, encoded without adding special tokens (the template writes them),
  /// as `apply_chat_template(tokenize=True)`.
  std::vector<int64_t> encode(const nlohmann::ordered_json& messages,
                              bool add_generation_prompt) const;

  /// The token that ends an assistant turn: the first special token the template writes after an
  /// assistant message's content (`<|im_end|>` for ChatML, `<|eot_id|>` for Llama 3), else the
  /// tokenizer's eos token; nullopt when there is neither. Generation stops on it.
  std::optional<int64_t> end_of_turn_id() const noexcept { return end_of_turn_; }

  /// The text of generated `ids`: ids the tokenizer has no token for (a model vocabulary larger
  /// than its tokenizer's) are left out, as Hugging Face's decode leaves them out.
  std::string decode_generated(const std::vector<int64_t>& ids, bool skip_special_tokens) const;

  /// Multi-turn rollouts keep the tokens a model sampled and append the template's text around
  /// them. `history` ends with the assistant message whose content is the text of the sampled
  /// turn (its ids, without the end-of-turn token, decoded); `ended_with_end_of_turn` says
  /// whether the sampled ids end with `end_of_turn_id()`. Returns the ids that follow the
  /// sampled ones up to the next generation prompt after `next_message` (e.g. a user message
  /// with the environment's observation): the rest of the assistant turn as the template writes
  /// it (all of it when the turn was cut off before its end-of-turn token), the next message,
  /// and the generation prompt. Throws `prompt_error` when the template does not render the
  /// conversation as a growing text — when it rewrites earlier turns or the assistant's text
  /// (e.g. templates that drop the reasoning of earlier turns) — naming what differed.
  std::vector<int64_t> continuation(const nlohmann::ordered_json& history,
                                    bool ended_with_end_of_turn,
                                    const nlohmann::ordered_json& next_message) const;

private:
  text::tokenizer tokenizer_;
  std::optional<chat::template_renderer> renderer_;
  std::optional<int64_t> end_of_turn_;
};

} // namespace rlforge::prompt
