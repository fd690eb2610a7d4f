#include "text/hf/pattern.hpp"

#include <nlohmann/json.hpp>

#include "text/error.hpp"

namespace rlforge::text::hf {

pattern pattern::from_json(const json& j, const std::string& where) {
  require_object(j, where);
  if (j.size() != 1)
    fail(where + ": expected an object with exactly one of \"String\" or \"Regex\", got " +
         j.dump());
  pattern p;
  if (const json* s = find(j, "String")) {
    p.literal_ = as_string(*s, path(where, "String"));
    // An empty literal matches the empty string everywhere, as the escaped regex HF builds does.
    if (p.literal_.empty())
      p.regex_ = unicode::regex::literal(p.literal_, where);
  } else if (const json* r = find(j, "Regex")) {
    p.is_regex_ = true;
    p.literal_ = as_string(*r, path(where, "Regex"));
    p.regex_ = unicode::regex::compile(p.literal_, where);
  } else {
    fail(where + ": unknown pattern kind \"" + j.begin().key() +
         "\" (expected \"String\" or \"Regex\")");
  }
  return p;
}

void pattern::find_all(std::string_view text, std::vector<unicode::match_span>& out) const {
  if (regex_) {
    regex_->find_all(text, out);
    return;
  }
  size_t at = 0;
  while ((at = text.find(literal_, at)) != std::string_view::npos) {
    out.push_back({at, at + literal_.size()});
    at += literal_.size();
  }
}

std::string pattern::describe() const {
  return std::string(is_regex_ ? "Regex \"" : "String \"") + literal_ + "\"";
}

} // namespace rlforge::text::hf
