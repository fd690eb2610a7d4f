#include "prompt/chat_prompt.hpp"

#include <fstream>
#include <sstream>

namespace rlforge::prompt {

namespace {

using json = nlohmann::ordered_json;
namespace fs = std::filesystem;

// The assistant text of the probe conversation that finds the end-of-turn token.
constexpr const char* probe_text = "rlforge end-of-turn probe";

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

// Whether the model directory names a chat template (in tokenizer_config.json or beside it).
// A config that is not JSON is left for the renderer to report.
bool names_a_template(const fs::path& dir) {
  std::error_code ec;
  if (fs::exists(dir / "chat_template.jinja", ec))
    return true;
  std::ifstream in(dir / "tokenizer_config.json", std::ios::binary);
  if (!in)
    return false;
  std::stringstream buffer;
  buffer << in.rdbuf();
  const auto config = json::parse(buffer.str(), nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded())
    return true;
  return config.is_object() && config.contains("chat_template") &&
         !config["chat_template"].is_null();
}

// A short quote of `s` for error messages.
std::string excerpt(const std::string& s) {
  constexpr size_t limit = 80;
  return "'" + (s.size() <= limit ? s : s.substr(0, limit) + "...") + "'";
}

} // namespace

chat_prompt chat_prompt::load(const fs::path& dir) {
  auto tok = text::tokenizer::load(dir);
  std::optional<chat::template_renderer> renderer;
  if (names_a_template(dir))
    renderer = chat::template_renderer::from_tokenizer_config(dir);
  return chat_prompt(std::move(tok), std::move(renderer));
}

chat_prompt::chat_prompt(text::tokenizer tokenizer, std::optional<chat::template_renderer> renderer)
    : tokenizer_(std::move(tokenizer)), renderer_(std::move(renderer)) {
  if (renderer_) {
    // The first special token written after an assistant's text ends its turn. A template that
    // refuses the probe (e.g. one that insists on a system message) has no end-of-turn token
    // found this way; the eos token stands in.
    try {
      const json probe = json::array({{{"role", "user"}, {"content", "Hello."}},
                                      {{"role", "assistant"}, {"content", probe_text}}});
      const auto rendered = renderer_->render(probe, false);
      const auto at = rendered.rfind(probe_text);
      if (at != std::string::npos) {
        for (int64_t id :
             tokenizer_.encode(rendered.substr(at + std::string(probe_text).size()), false)) {
          if (tokenizer_.is_special(id)) {
            end_of_turn_ = id;
            break;
          }
        }
      }
    } catch (const std::exception&) {
      end_of_turn_.reset();
    }
  }
  if (!end_of_turn_ && tokenizer_.eos_token())
    end_of_turn_ = tokenizer_.eos_token()->id;
}

std::string chat_prompt::render(const json& messages, bool add_generation_prompt) const {
  if (!renderer_)
    throw prompt_error("the model has no chat template (tokenizer_config.json has no "
                       "chat_template and there is no chat_template.jinja)");
  return renderer_->render(messages, add_generation_prompt);
}

std::vector<int64_t> chat_prompt::encode(const json& messages, bool add_generation_prompt) const {
  return tokenizer_.encode(render(messages, add_generation_prompt), false);
}

std::string chat_prompt::decode_generated(const std::vector<int64_t>& ids,
                                          bool skip_special_tokens) const {
  std::vector<int64_t> known;
  known.reserve(ids.size());
  for (int64_t id : ids)
    if (tokenizer_.id_to_token(id))
      known.push_back(id);
  return tokenizer_.decode(known, skip_special_tokens);
}

std::vector<int64_t> chat_prompt::continuation(const json& history, bool ended_with_end_of_turn,
                                               const json& next_message) const {
  if (!history.is_array() || history.empty() || !history.back().is_object() ||
      history.back().value("role", json()) != "assistant" ||
      !history.back().value("content", json()).is_string())
    throw prompt_error("continuation: the history must end with an assistant message with a "
                       "string content");
  const std::string content = history.back()["content"].get<std::string>();
  json before = history;
  before.erase(before.size() - 1);
  const auto asked = render(before, true);
  const auto answered = render(history, false);
  if (!starts_with(answered, asked))
    throw prompt_error("the chat template renders the conversation differently once the "
                       "assistant's turn is added (the generation prompt " +
                       excerpt(asked) + " is not a prefix of " + excerpt(answered) +
                       "); multi-turn rollouts need a template that only appends");
  std::string after = answered.substr(asked.size());
  if (!starts_with(after, content))
    throw prompt_error("the chat template does not write the assistant's text verbatim (expected " +
                       excerpt(content) + ", it wrote " + excerpt(after) +
                       "); multi-turn rollouts need the sampled text kept as it is");
  after.erase(0, content.size());
  if (ended_with_end_of_turn) {
    if (!end_of_turn_)
      throw prompt_error("continuation: the turn ended with an end-of-turn token, but the model "
                         "has none");
    const auto end = tokenizer_.decode({*end_of_turn_}, false);
    if (!starts_with(after, end))
      throw prompt_error("the chat template does not end an assistant turn with " + excerpt(end) +
                         " right after its text (it wrote " + excerpt(after) + ")");
    after.erase(0, end.size());
  }
  json extended = history;
  extended.push_back(next_message);
  const auto next = render(extended, true);
  if (!starts_with(next, answered))
    throw prompt_error("the chat template rewrites earlier turns once a new message follows (" +
                       excerpt(answered) + " is not a prefix of " + excerpt(next) +
                       "); multi-turn rollouts need a template that only appends");
  return tokenizer_.encode(after + next.substr(answered.size()), false);
}

} // namespace rlforge::prompt
