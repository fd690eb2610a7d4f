#include "service/openai/request.hpp"

#include <cmath>
#include <set>

namespace rlforge::service::openai {

namespace {

using json = nlohmann::json;

/// The most alternatives per position (OpenAI's limit for top_logprobs).
constexpr int64_t max_top_logprobs = 20;

[[noreturn]] void refuse(const std::string& param, const std::string& message) {
  throw request_error(param, message);
}

const char* type_name(const json& v) {
  return v.type_name();
}

bool is_integer(const json& v) {
  return v.is_number_integer() ||
         (v.is_number_float() && std::isfinite(v.get<double>()) &&
          v.get<double>() == std::floor(v.get<double>()) && std::abs(v.get<double>()) < 9e15);
}

int64_t integer(const json& body, const std::string& key) {
  const auto& v = body.at(key);
  if (!is_integer(v))
    refuse(key, key + " must be an integer, got " + (v.is_number() ? v.dump() : type_name(v)));
  return v.is_number_integer() ? v.get<int64_t>() : static_cast<int64_t>(v.get<double>());
}

double number(const json& body, const std::string& key) {
  const auto& v = body.at(key);
  if (!v.is_number())
    refuse(key, key + " must be a number, got " + type_name(v));
  return v.get<double>();
}

bool boolean(const json& body, const std::string& key) {
  const auto& v = body.at(key);
  if (!v.is_boolean())
    refuse(key, key + " must be true or false, got " + (v.is_primitive() ? v.dump() : type_name(v)));
  return v.get<bool>();
}

/// Present and not null.
bool given(const json& body, const std::string& key) {
  return body.contains(key) && !body.at(key).is_null();
}

/// OpenAI parameters this server does not implement: accepted only at their neutral value.
void refuse_unless_neutral(const json& body) {
  auto zero = [&](const char* key, const char* what) {
    if (given(body, key) && !(body.at(key).is_number() && body.at(key).get<double>() == 0))
      refuse(key, std::string(key) + " is not supported here (" + what + "); send 0 or leave it out");
  };
  zero("presence_penalty", "no repetition penalties");
  zero("frequency_penalty", "no repetition penalties");
  if (given(body, "logit_bias") && !(body.at("logit_bias").is_object() && body.at("logit_bias").empty()))
    refuse("logit_bias", "logit_bias is not supported here; leave it out");
}

std::vector<std::string> read_stop(const json& body) {
  if (!given(body, "stop"))
    return {};
  const auto& v = body.at("stop");
  std::vector<std::string> out;
  if (v.is_string()) {
    out.push_back(v.get<std::string>());
  } else if (v.is_array()) {
    for (const auto& s : v) {
      if (!s.is_string())
        refuse("stop", "stop must be a string or a list of strings; item " +
                           std::to_string(out.size()) + " is " + type_name(s));
      out.push_back(s.get<std::string>());
    }
  } else {
    refuse("stop", std::string("stop must be a string or a list of strings, got ") + type_name(v));
  }
  for (size_t i = 0; i < out.size(); ++i)
    if (out[i].empty())
      refuse("stop", "stop string " + std::to_string(i) + " is empty");
  return out;
}

void read_prompt(const json& body, generation_request& r) {
  if (!body.contains("prompt"))
    refuse("prompt", "prompt is required");
  const auto& p = body.at("prompt");
  auto ids = [&](const json& list) {
    std::vector<int64_t> out;
    for (const auto& t : list) {
      if (!t.is_number_integer())
        refuse("prompt", "a prompt of token ids must hold integers only; item " +
                             std::to_string(out.size()) + " is " + t.dump());
      out.push_back(t.get<int64_t>());
    }
    if (out.empty())
      refuse("prompt", "prompt is empty");
    return out;
  };
  if (p.is_string()) {
    r.prompt_text = p.get<std::string>();
  } else if (p.is_array() && !p.empty() && p.front().is_number()) {
    r.prompt_ids = ids(p);
  } else if (p.is_array() && p.size() == 1 && p.front().is_string()) {
    r.prompt_text = p.front().get<std::string>();
  } else if (p.is_array() && p.size() == 1 && p.front().is_array()) {
    r.prompt_ids = ids(p.front());
  } else if (p.is_array() && p.size() > 1) {
    refuse("prompt", "one prompt per request: this server does not batch " +
                         std::to_string(p.size()) + " prompts; send one request each");
  } else {
    refuse("prompt", std::string("prompt must be a string, a list of token ids, or a list of one "
                                 "of those; got ") +
                         (p.is_array() ? "an empty list" : type_name(p)));
  }
  if (r.prompt_text && r.prompt_text->empty())
    refuse("prompt", "prompt is empty");
}

void read_messages(const json& body, generation_request& r) {
  if (!body.contains("messages"))
    refuse("messages", "messages is required");
  const auto& m = body.at("messages");
  if (!m.is_array() || m.empty())
    refuse("messages", "messages must be a non-empty list of {\"role\", \"content\"} objects");
  static const std::set<std::string> roles{"system", "developer", "user", "assistant", "tool"};
  r.messages = nlohmann::ordered_json::array();
  for (size_t i = 0; i < m.size(); ++i) {
    const auto where = "messages[" + std::to_string(i) + "]";
    const auto& x = m[i];
    if (!x.is_object())
      refuse("messages", where + " must be an object, got " + type_name(x));
    if (!x.contains("role") || !x.at("role").is_string())
      refuse("messages", where + " needs a string role");
    const auto role = x.at("role").get<std::string>();
    if (!roles.count(role))
      refuse("messages", where + " has role '" + role +
                             "'; roles are system, developer, user, assistant and tool");
    for (const auto& [key, value] : x.items())
      if (key != "role" && key != "content" && key != "name" && !value.is_null())
        refuse("messages", where + " has '" + key +
                               "', which this server does not support (tool calls, audio, ...)");
    if (!x.contains("content") || x.at("content").is_null())
      refuse("messages", where + " needs content");
    const auto& c = x.at("content");
    std::string text;
    if (c.is_string()) {
      text = c.get<std::string>();
    } else if (c.is_array()) {
      for (size_t k = 0; k < c.size(); ++k) {
        const auto& part = c[k];
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
            !part.at("text").is_string())
          refuse("messages", where + ".content[" + std::to_string(k) +
                                 "] must be {\"type\": \"text\", \"text\": ...}; only text "
                                 "parts are supported");
        text += part.at("text").get<std::string>();
      }
    } else {
      refuse("messages", where + ".content must be a string or a list of text parts, got " +
                             type_name(c));
    }
    nlohmann::ordered_json out;
    out["role"] = role;
    out["content"] = text;
    if (x.contains("name") && x.at("name").is_string())
      out["name"] = x.at("name");
    r.messages.push_back(std::move(out));
  }
}

const std::set<std::string>& known_keys(endpoint kind) {
  static const std::set<std::string> completions{
      "model", "prompt", "max_tokens", "temperature", "top_p", "n", "stop", "seed", "logprobs",
      "stream", "stream_options", "echo", "best_of", "suffix", "presence_penalty",
      "frequency_penalty", "logit_bias", "user", "return_tokens_as_token_ids"};
  static const std::set<std::string> chat{
      "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n",
      "stop", "seed", "logprobs", "top_logprobs", "stream", "stream_options", "presence_penalty",
      "frequency_penalty", "logit_bias", "user", "tools", "tool_choice", "response_format",
      "parallel_tool_calls", "return_tokens_as_token_ids"};
  return kind == endpoint::completions ? completions : chat;
}

} // namespace

generation_request read_request(endpoint kind, const json& body) {
  if (!body.is_object())
    refuse("", std::string("the body must be a JSON object, got ") + type_name(body));
  const auto& known = known_keys(kind);
  for (const auto& [key, value] : body.items())
    if (!known.count(key))
      refuse(key, "unknown parameter '" + key + "'");
  generation_request r;
  r.kind = kind;
  if (!body.contains("model") || !body.at("model").is_string() ||
      body.at("model").get<std::string>().empty())
    refuse("model", "model is required: the served base model's name or a "
                    "tinker://.../sampler_weights/... checkpoint (GET /v1/models lists them)");
  r.model = body.at("model").get<std::string>();
  refuse_unless_neutral(body);
  if (kind == endpoint::completions) {
    read_prompt(body, r);
    if (given(body, "echo") && boolean(body, "echo"))
      refuse("echo", "echo is not supported here; leave it out or send false");
    if (given(body, "suffix"))
      refuse("suffix", "suffix (insertion) is not supported here");
    if (given(body, "best_of") && integer(body, "best_of") != 1)
      refuse("best_of", "best_of is not supported here; ask for n samples and pick");
    r.max_tokens = given(body, "max_tokens") ? integer(body, "max_tokens") : 16;
    if (given(body, "logprobs")) {
      const auto k = integer(body, "logprobs");
      if (k < 0 || k > max_top_logprobs)
        refuse("logprobs", "logprobs must be in 0.." + std::to_string(max_top_logprobs) +
                               ", got " + std::to_string(k));
      r.logprobs = true;
      r.top_logprobs = k;
    }
  } else {
    read_messages(body, r);
    if (given(body, "max_completion_tokens"))
      r.max_tokens = integer(body, "max_completion_tokens");
    else if (given(body, "max_tokens"))
      r.max_tokens = integer(body, "max_tokens");
    if (given(body, "logprobs"))
      r.logprobs = boolean(body, "logprobs");
    if (given(body, "top_logprobs")) {
      r.top_logprobs = integer(body, "top_logprobs");
      if (r.top_logprobs < 0 || r.top_logprobs > max_top_logprobs)
        refuse("top_logprobs", "top_logprobs must be in 0.." + std::to_string(max_top_logprobs) +
                                   ", got " + std::to_string(r.top_logprobs));
      if (r.top_logprobs > 0 && !r.logprobs)
        refuse("top_logprobs", "top_logprobs needs logprobs: true");
    }
    if (given(body, "tools") && !(body.at("tools").is_array() && body.at("tools").empty()))
      refuse("tools", "tools (function calling) are not supported here");
    if (given(body, "tool_choice") && body.at("tool_choice") != "none")
      refuse("tool_choice", "tool_choice is not supported here; leave it out or send \"none\"");
    if (given(body, "parallel_tool_calls"))
      refuse("parallel_tool_calls", "tool calls are not supported here; leave it out");
    if (given(body, "response_format") &&
        !(body.at("response_format").is_object() &&
          body.at("response_format").value("type", "") == "text"))
      refuse("response_format", "only {\"type\": \"text\"} is supported as response_format");
  }
  if (r.max_tokens && *r.max_tokens < 1)
    refuse(kind == endpoint::chat_completions && given(body, "max_completion_tokens")
               ? "max_completion_tokens"
               : "max_tokens",
           "max_tokens must be >= 1, got " + std::to_string(*r.max_tokens));
  if (given(body, "temperature")) {
    r.temperature = number(body, "temperature");
    if (!std::isfinite(r.temperature) || r.temperature < 0 || r.temperature > 2)
      refuse("temperature", "temperature must be in [0, 2], got " + body.at("temperature").dump());
  }
  if (given(body, "top_p")) {
    r.top_p = number(body, "top_p");
    if (!(r.top_p > 0 && r.top_p <= 1))
      refuse("top_p", "top_p must be in (0, 1], got " + body.at("top_p").dump());
  }
  if (given(body, "n")) {
    r.n = integer(body, "n");
    if (r.n < 1)
      refuse("n", "n must be >= 1, got " + std::to_string(r.n));
  }
  r.stop = read_stop(body);
  if (given(body, "seed")) {
    r.seed = integer(body, "seed");
    if (*r.seed < 0)
      refuse("seed", "seed must be >= 0, got " + std::to_string(*r.seed));
  }
  if (given(body, "stream"))
    r.stream = boolean(body, "stream");
  if (given(body, "stream_options")) {
    const auto& o = body.at("stream_options");
    if (!r.stream)
      refuse("stream_options", "stream_options needs stream: true");
    if (!o.is_object())
      refuse("stream_options", "stream_options must be an object");
    for (const auto& [key, value] : o.items())
      if (key != "include_usage")
        refuse("stream_options", "unknown stream option '" + key + "'");
    if (o.contains("include_usage")) {
      if (!o.at("include_usage").is_boolean())
        refuse("stream_options", "stream_options.include_usage must be true or false");
      r.include_usage = o.at("include_usage").get<bool>();
    }
  }
  if (r.stream && r.top_logprobs > 0)
    refuse(kind == endpoint::completions ? "logprobs" : "top_logprobs",
           "top log-probs are computed after the whole answer and are not streamed; ask "
           "without stream, or stream with logprobs of the sampled tokens only");
  if (given(body, "return_tokens_as_token_ids"))
    r.tokens_as_ids = boolean(body, "return_tokens_as_token_ids");
  if (given(body, "user")) {
    if (!body.at("user").is_string())
      refuse("user", "user must be a string");
    r.user = body.at("user").get<std::string>();
  }
  return r;
}

} // namespace rlforge::service::openai
