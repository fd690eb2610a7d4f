#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

/// The bodies of the OpenAI-compatible endpoints of `rlforge serve` (`POST /v1/completions`,
/// `POST /v1/chat/completions`), read and checked into one value before anything runs. Pure
/// JSON: no tokenizer, no server state (the endpoints encode the prompt and pick the weights).
namespace rlforge::service::openai {

/// A request the endpoint refuses: HTTP `status` (400 unless said), the body parameter it names
/// (`param`, OpenAI's error field; empty when none) and the message.
class request_error : public std::runtime_error {
public:
  request_error(const std::string& param, const std::string& message, int status = 400)
      : std::runtime_error(message), param_(param), status_(status) {}
  const std::string& param() const noexcept { return param_; }
  int status() const noexcept { return status_; }

private:
  std::string param_;
  int status_;
};

enum class endpoint { completions, chat_completions };

/// One checked request. Defaults are OpenAI's: max_tokens 16 for completions and "what the
/// context leaves" for chat (nullopt here), temperature 1, top_p 1, n 1.
struct generation_request {
  endpoint kind = endpoint::completions;
  std::string model;
  /// completions: the prompt as text, or as token ids (exactly one of the two is set).
  std::optional<std::string> prompt_text;
  std::vector<int64_t> prompt_ids;
  /// chat: the messages, each {"role", "content"} with string content (text parts joined).
  nlohmann::ordered_json messages;
  std::optional<int64_t> max_tokens;
  double temperature = 1.0;
  double top_p = 1.0;
  int64_t n = 1;
  std::vector<std::string> stop;
  std::optional<int64_t> seed;
  /// Per-token log-probs in the answer (completions: `logprobs` >= 0; chat: `logprobs: true`),
  /// with the `top_logprobs` most likely alternatives at each position.
  bool logprobs = false;
  int64_t top_logprobs = 0;
  bool stream = false;
  bool include_usage = false; ///< stream_options.include_usage
  /// vLLM's extension, which RL harnesses use to read the sampled ids back: log-prob entries name
  /// their token as "token_id:<id>" instead of its text.
  bool tokens_as_ids = false;
  /// OpenAI's end-user id: written to the server's log line for the request, nothing else.
  std::string user;
};

/// Reads and checks a body of `kind`. Every field OpenAI defines is either honoured or, when set
/// to anything but its neutral value (presence_penalty 0, echo false, best_of 1, ...), refused
/// naming it; unknown fields are refused too. Throws `request_error` naming the parameter.
generation_request read_request(endpoint kind, const nlohmann::json& body);

} // namespace rlforge::service::openai
