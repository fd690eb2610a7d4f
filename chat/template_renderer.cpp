#include "chat/template_renderer.hpp"

#include <fstream>
#include <sstream>

namespace rlforge::chat {

namespace {

using json = nlohmann::ordered_json;

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw template_error(error_kind::config, "cannot read " + path.string());
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

json special_tokens_of(const json& config) {
  json out = json::object();
  static const char* const names[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                      "pad_token", "cls_token", "mask_token"};
  auto token_text = [](const json& t) -> const json* {
    if (t.is_string())
      return &t;
    if (t.is_object() && t.contains("content") && t["content"].is_string())
      return &t["content"];
    return nullptr;
  };
  for (const char* name : names) {
    auto it = config.find(name);
    if (it == config.end() || it->is_null())
      continue;
    const json* text = token_text(*it);
    if (text == nullptr)
      throw template_error(error_kind::config, std::string("tokenizer config: ") + name +
                                                   " is neither a string nor an AddedToken object");
    out[name] = *text;
  }
  auto extra = config.find("additional_special_tokens");
  if (extra != config.end() && extra->is_array()) {
    json list = json::array();
    for (const auto& t : *extra) {
      const json* text = token_text(t);
      if (text == nullptr)
        throw template_error(error_kind::config,
                             "tokenizer config: an additional_special_tokens entry is neither a "
                             "string nor an AddedToken object");
      list.push_back(*text);
    }
    out["additional_special_tokens"] = std::move(list);
  }
  return out;
}

} // namespace

template_renderer::template_renderer(const std::string& source, json special_tokens)
    : special_tokens_(std::move(special_tokens)) {
  if (!special_tokens_.is_object())
    throw template_error(error_kind::config, "special tokens must be a JSON object");
  templates_.emplace("default", jinja_template(source));
}

template_renderer template_renderer::from_tokenizer_config_json(const json& config) {
  if (!config.is_object())
    throw template_error(error_kind::config, "tokenizer config must be a JSON object");
  auto it = config.find("chat_template");
  if (it == config.end() || it->is_null())
    throw template_error(error_kind::config, "tokenizer config has no chat_template");
  template_renderer r;
  r.special_tokens_ = special_tokens_of(config);
  if (it->is_string()) {
    r.templates_.emplace("default", jinja_template(it->get<std::string>()));
    return r;
  }
  if (!it->is_array())
    throw template_error(error_kind::config,
                         "tokenizer config: chat_template is neither a string nor a list");
  for (const auto& entry : *it) {
    if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() ||
        !entry.contains("template") || !entry["template"].is_string())
      throw template_error(error_kind::config,
                           "tokenizer config: a chat_template list entry lacks a string 'name' "
                           "or 'template'");
    const auto name = entry["name"].get<std::string>();
    try {
      r.templates_.emplace(name, jinja_template(entry["template"].get<std::string>()));
    } catch (const template_error& e) {
      throw template_error(e.kind(), "template '" + name + "': " + e.detail(), e.where());
    }
  }
  if (r.templates_.empty())
    throw template_error(error_kind::config, "tokenizer config: chat_template list is empty");
  return r;
}

template_renderer template_renderer::from_tokenizer_config(const std::filesystem::path& where) {
  std::error_code ec;
  const bool is_dir = std::filesystem::is_directory(where, ec);
  const auto config_path = is_dir ? where / "tokenizer_config.json" : where;
  if (!std::filesystem::exists(config_path, ec))
    throw template_error(error_kind::config, config_path.string() + " does not exist");
  json config;
  try {
    config = json::parse(read_file(config_path));
  } catch (const json::parse_error& e) {
    throw template_error(error_kind::config,
                         config_path.string() + " is not valid JSON: " + e.what());
  }
  const auto jinja_path = config_path.parent_path() / "chat_template.jinja";
  if (std::filesystem::exists(jinja_path, ec)) {
    if (!config.is_object())
      throw template_error(error_kind::config, config_path.string() + " is not a JSON object");
    config["chat_template"] = read_file(jinja_path);
  }
  try {
    return from_tokenizer_config_json(config);
  } catch (const template_error& e) {
    if (e.kind() != error_kind::config)
      throw;
    throw template_error(error_kind::config, config_path.string() + ": " + e.detail());
  }
}

std::string template_renderer::render(const json& messages, bool add_generation_prompt,
                                      const json& extra, const std::string& template_name) const {
  if (!messages.is_array())
    throw template_error(error_kind::runtime, "messages must be a JSON array");
  if (!extra.is_object())
    throw template_error(error_kind::runtime, "extra variables must be a JSON object");
  for (const char* reserved : {"messages", "add_generation_prompt"})
    if (extra.contains(reserved))
      throw template_error(error_kind::runtime, std::string("extra variables may not set '") +
                                                    reserved + "': it is an argument of render");
  const jinja_template* chosen = nullptr;
  std::string name = template_name;
  if (name.empty()) {
    const bool has_tools = extra.contains("tools") && !extra["tools"].is_null();
    if (has_tools && templates_.count("tool_use") != 0)
      name = "tool_use";
    else
      name = "default";
  }
  auto it = templates_.find(name);
  if (it == templates_.end()) {
    std::string names;
    for (const auto& [n, t] : templates_)
      names += (names.empty() ? "" : ", ") + n;
    throw template_error(error_kind::config,
                         "no chat template named '" + name + "' (available: " + names + ")");
  }
  chosen = &it->second;
  json vars = json::object();
  vars["messages"] = messages;
  vars["add_generation_prompt"] = add_generation_prompt;
  vars["tools"] = nullptr;
  vars["documents"] = nullptr;
  for (auto t = special_tokens_.begin(); t != special_tokens_.end(); ++t)
    vars[t.key()] = t.value();
  for (auto e = extra.begin(); e != extra.end(); ++e)
    vars[e.key()] = e.value();
  return chosen->render(vars);
}

std::vector<std::string> template_renderer::template_names() const {
  std::vector<std::string> out;
  for (const auto& [n, t] : templates_)
    out.push_back(n);
  return out;
}

} // namespace rlforge::chat
