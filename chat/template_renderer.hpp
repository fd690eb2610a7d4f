#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "chat/jinja_template.hpp"

/// Builds prompts from chat messages with a model's own chat template, as transformers'
/// `apply_chat_template(messages, tokenize=False, ...)` does.
///
/// ```cpp
/// auto chat = chat::template_renderer::from_tokenizer_config("/models/Qwen3-0.6B");
/// std::string prompt = chat.render(messages, /*add_generation_prompt=*/true,
///                                  {{"enable_thinking", false}});
/// ```
///
/// The template sees these variables: `messages`; `add_generation_prompt`; `tools` and
/// `documents` (none unless `extra` sets them); the special tokens the configuration sets
/// (`bos_token`, `eos_token`, `unk_token`, `sep_token`, `pad_token`, `cls_token`, `mask_token`
/// as strings — an AddedToken object gives its `content` — and `additional_special_tokens`);
/// then every member of `extra` (which overrides a special token of the same name), e.g.
/// `enable_thinking`, `date_string`, `tools_in_user_message`. Messages are passed as given: a
/// message's keys (`role`, `content`, `tool_calls`, `reasoning_content`, ...) keep their order.
///
/// Thread safety: immutable after construction; `render` may run concurrently.
namespace rlforge::chat {

class template_renderer {
public:
  /// From a parsed tokenizer_config.json: its `chat_template` is a string, or a list of
  /// `{"name", "template"}` (transformers' named templates). Throws template_error (config) when
  /// there is no chat_template, or (syntax, unsupported) when a template does not compile.
  static template_renderer from_tokenizer_config_json(const nlohmann::ordered_json& config);

  /// From a model directory (DIR/tokenizer_config.json; DIR/chat_template.jinja, when present,
  /// replaces the configuration's template as in transformers) or a tokenizer_config.json file.
  /// Throws template_error (config) naming the file that is missing or unreadable.
  static template_renderer from_tokenizer_config(const std::filesystem::path& dir_or_file);

  /// A renderer for one template `source` with the given special tokens (a JSON object of
  /// variables, e.g. {"bos_token": "<s>"}).
  template_renderer(const std::string& source, nlohmann::ordered_json special_tokens);

  /// The prompt for `messages` (a JSON array). With named templates: `template_name` when given,
  /// else "tool_use" when `extra` has non-null `tools` and that template exists, else "default".
  /// `extra` must not set `messages` or `add_generation_prompt`. Throws template_error naming
  /// what was wrong (error_kind::raised when the template itself refused the messages).
  std::string render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                     const nlohmann::ordered_json& extra = nlohmann::ordered_json::object(),
                     const std::string& template_name = "") const;

  /// The names of the templates ("default" for a single template).
  std::vector<std::string> template_names() const;

  /// The special-token variables passed to every render.
  const nlohmann::ordered_json& special_tokens() const noexcept { return special_tokens_; }

private:
  template_renderer() = default;

  std::map<std::string, jinja_template> templates_;
  nlohmann::ordered_json special_tokens_ = nlohmann::ordered_json::object();
};

} // namespace rlforge::chat
