#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "prompt/chat_prompt.hpp"
#include "service/openai/request.hpp"

/// The answers of the OpenAI-compatible endpoints: each choice's text as its tokens arrive (stop
/// strings cut, nothing released that a later token could still change), per-token log-probs in
/// the two layouts OpenAI uses, and the JSON of whole answers and of stream chunks.
namespace rlforge::service::openai {

/// One generated token: its id, its log-prob under the distribution it was sampled from, and
/// (when asked) the most likely tokens at its position under the raw model distribution.
struct token_info {
  int64_t id = 0;
  double logprob = 0;
  std::vector<std::pair<int64_t, double>> top;
};

/// The text of one choice, built from its tokens as they arrive. Decodes the whole sequence each
/// time (special tokens skipped, ids the tokenizer lacks left out) and releases only what is
/// final: text ending in an incomplete UTF-8 character (U+FFFD) or in the start of a stop string
/// is held back until the next tokens or the end. A stop string ends the text before it (OpenAI's
/// rule: the stop sequence is not returned). One generation per object; not thread-safe.
class choice_text {
public:
  choice_text(const prompt::chat_prompt& chat, std::vector<std::string> stop);

  /// Adds `ids`; returns the text released by them (`finished`: everything left). After a stop
  /// string appeared, nothing more is released.
  std::string push(const std::vector<int64_t>& ids, bool finished);

  /// Whether a stop string ended the text.
  bool stopped_by_string() const noexcept { return stopped_; }

  /// Everything released so far.
  const std::string& released() const noexcept { return released_; }

private:
  const prompt::chat_prompt& chat_;
  std::vector<std::string> stop_;
  std::vector<int64_t> ids_;
  std::string released_;
  bool stopped_ = false;
};

/// Writes the per-token log-probs of an answer. Token strings are the token decoded alone
/// (special tokens written out), or "token_id:<id>" with `tokens_as_ids`.
class logprob_writer {
public:
  logprob_writer(const prompt::chat_prompt& chat, bool tokens_as_ids)
      : chat_(chat), tokens_as_ids_(tokens_as_ids) {}

  /// Chat layout: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}, ...]}.
  nlohmann::ordered_json chat(const std::vector<token_info>& tokens) const;

  /// Completions layout: {"tokens", "token_logprobs", "top_logprobs", "text_offset"};
  /// `top_logprobs` is null when none were asked (`with_top`), and text offsets count from
  /// `offset` (the length of the text before these tokens).
  nlohmann::ordered_json completion(const std::vector<token_info>& tokens, bool with_top,
                                    size_t offset) const;

private:
  std::string token_string(int64_t id) const;
  const prompt::chat_prompt& chat_;
  bool tokens_as_ids_;
};

/// What a finished choice reports: "stop" (a stop token or string) or "length".
std::string finish_reason(const std::string& stop_reason, bool stopped_by_string);

/// {"prompt_tokens", "completion_tokens", "total_tokens"}.
nlohmann::ordered_json usage_json(int64_t prompt_tokens, int64_t completion_tokens);

/// The answer's envelope: {"id", "object", "created", "model"} for `kind` (whole answer or
/// stream chunk); `choices` and `usage` are added by the caller.
nlohmann::ordered_json envelope(endpoint kind, bool chunk, const std::string& id,
                                int64_t created, const std::string& model);

} // namespace rlforge::service::openai
