#include "text/tokenizer_config.hpp"

#include <nlohmann/json.hpp>

#include "text/error.hpp"
#include "text/hf/json_reader.hpp"

namespace rlforge::text {

namespace {

std::optional<std::string> token_name(const hf::json& j, const char* key,
                                      const std::string& source) {
  const hf::json* v = hf::find(j, key);
  std::string where = hf::path(source, key);
  if (v == nullptr || v->is_null())
    return std::nullopt;
  if (v->is_string())
    return v->get<std::string>();
  if (v->is_object())
    return hf::get_string(*v, "content", where);
  fail(where + ": expected a string, null or an object with \"content\", got " + hf::describe(*v));
}

std::optional<bool> flag(const hf::json& j, const char* key, const std::string& source) {
  const hf::json* v = hf::find(j, key);
  if (v == nullptr || v->is_null())
    return std::nullopt;
  if (!v->is_boolean())
    fail(hf::path(source, key) + ": expected a boolean, got " + hf::describe(*v));
  return v->get<bool>();
}

} // namespace

tokenizer_config parse_tokenizer_config(std::string_view text, const std::string& source) {
  hf::json j = hf::parse_json(text, source);
  hf::require_object(j, source);
  tokenizer_config c;
  c.bos_token = token_name(j, "bos_token", source);
  c.eos_token = token_name(j, "eos_token", source);
  c.pad_token = token_name(j, "pad_token", source);
  c.unk_token = token_name(j, "unk_token", source);
  c.add_bos_token = flag(j, "add_bos_token", source);
  c.add_eos_token = flag(j, "add_eos_token", source);
  return c;
}

} // namespace rlforge::text
