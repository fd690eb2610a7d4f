#include "service/openai/response.hpp"

#include <algorithm>

namespace rlforge::service::openai {

using ojson = nlohmann::ordered_json;

namespace {

/// U+FFFD in UTF-8: what the decoder writes for an incomplete character.
const std::string replacement = "\xEF\xBF\xBD";

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

} // namespace

choice_text::choice_text(const prompt::chat_prompt& chat, std::vector<std::string> stop)
    : chat_(chat), stop_(std::move(stop)) {}

std::string choice_text::push(const std::vector<int64_t>& ids, bool finished) {
  if (stopped_)
    return {};
  ids_.insert(ids_.end(), ids.begin(), ids.end());
  std::string text = chat_.decode_generated(ids_, /*skip_special_tokens=*/true);
  // The earliest stop string ends the text.
  size_t cut = std::string::npos;
  for (const auto& s : stop_)
    cut = std::min(cut, text.find(s));
  size_t end = text.size();
  if (cut != std::string::npos) {
    end = cut;
    stopped_ = true;
  } else if (!finished) {
    // Hold back an incomplete character and any ending that may grow into a stop string.
    while (end >= replacement.size() && ends_with(text.substr(0, end), replacement))
      end -= replacement.size();
    size_t hold = 0;
    for (const auto& s : stop_)
      for (size_t k = std::min(s.size() - 1, end); k > hold; --k)
        if (text.compare(end - k, k, s, 0, k) == 0) {
          hold = k;
          break;
        }
    end -= hold;
  }
  // Text already released stays as it was (a later decode only appends to a released prefix).
  if (end <= released_.size())
    return {};
  std::string out = text.substr(released_.size(), end - released_.size());
  released_ += out;
  return out;
}

std::string logprob_writer::token_string(int64_t id) const {
  if (tokens_as_ids_)
    return "token_id:" + std::to_string(id);
  return chat_.decode_generated({id}, /*skip_special_tokens=*/false);
}

ojson logprob_writer::chat(const std::vector<token_info>& tokens) const {
  auto entry = [&](int64_t id, double logprob) {
    const auto s = token_string(id);
    ojson e;
    e["token"] = s;
    e["logprob"] = logprob;
    e["bytes"] = std::vector<int>(s.begin(), s.end());
    for (auto& b : e["bytes"])
      b = b.get<int>() & 0xff;
    return e;
  };
  ojson content = ojson::array();
  for (const auto& t : tokens) {
    auto e = entry(t.id, t.logprob);
    e["top_logprobs"] = ojson::array();
    for (const auto& [id, lp] : t.top)
      e["top_logprobs"].push_back(entry(id, lp));
    content.push_back(std::move(e));
  }
  return ojson{{"content", std::move(content)}};
}

ojson logprob_writer::completion(const std::vector<token_info>& tokens, bool with_top,
                                 size_t offset) const {
  ojson out;
  out["tokens"] = ojson::array();
  out["token_logprobs"] = ojson::array();
  out["top_logprobs"] = with_top ? ojson::array() : ojson(nullptr);
  out["text_offset"] = ojson::array();
  for (const auto& t : tokens) {
    const auto s = token_string(t.id);
    out["tokens"].push_back(s);
    out["token_logprobs"].push_back(t.logprob);
    out["text_offset"].push_back(offset);
    offset += tokens_as_ids_ ? chat_.decode_generated({t.id}, false).size() : s.size();
    if (with_top) {
      ojson top = ojson::object();
      for (const auto& [id, lp] : t.top)
        top[token_string(id)] = lp;
      out["top_logprobs"].push_back(std::move(top));
    }
  }
  return out;
}

std::string finish_reason(const std::string& stop_reason, bool stopped_by_string) {
  return stopped_by_string || stop_reason == "stop" ? "stop" : "length";
}

ojson usage_json(int64_t prompt_tokens, int64_t completion_tokens) {
  return ojson{{"prompt_tokens", prompt_tokens},
               {"completion_tokens", completion_tokens},
               {"total_tokens", prompt_tokens + completion_tokens}};
}

ojson envelope(endpoint kind, bool chunk, const std::string& id, int64_t created,
               const std::string& model) {
  const bool chat = kind == endpoint::chat_completions;
  ojson out;
  out["id"] = id;
  out["object"] = chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
  out["created"] = created;
  out["model"] = model;
  return out;
}

} // namespace rlforge::service::openai
