#include "cli/model_text.hpp"

#include <cstdio>
#include <filesystem>

#include "chat/error.hpp"
#include "cli/command.hpp"
#include "text/error.hpp"
#include "text/tokenizer.hpp"
#include "text/unicode/utf8.hpp"

namespace rlforge::cli {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

bool has_tokenizer_files(const std::string& dir) {
  return text::tokenizer::exists_in(dir);
}

prompt::chat_prompt load_model_text(const std::string& dir) {
  std::error_code ec;
  if (fs::is_directory(dir, ec) && !has_tokenizer_files(dir))
    throw runtime_failure("'" + dir +
                          "' has no tokenizer (neither tokenizer.json nor "
                          "tokenizer.model); rlforge init-model writes one");
  try {
    return prompt::chat_prompt::load(dir);
  } catch (const std::exception& e) {
    throw runtime_failure("cannot load the tokenizer of '" + dir + "': " + e.what());
  }
}

void require_utf8(const std::string& flag, const std::string& text) {
  const size_t at = text::unicode::find_invalid_utf8(text);
  if (at == std::string::npos)
    return;
  char byte[8];
  std::snprintf(byte, sizeof(byte), "0x%02X", static_cast<unsigned char>(text[at]));
  throw usage_error(flag + " is not valid UTF-8: byte " + std::to_string(at) + " (" + byte +
                    ") does not start a valid sequence");
}

void require_known_ids(const text::tokenizer& tok, const std::vector<int64_t>& ids,
                       const std::string& flag) {
  for (size_t i = 0; i < ids.size(); ++i) {
    const int64_t id = ids[i];
    if (id < 0 || id >= tok.vocab_size())
      throw usage_error(flag + ": id " + std::to_string(id) + " (entry " + std::to_string(i) +
                        ") is outside the tokenizer's vocabulary [0, " +
                        std::to_string(tok.vocab_size()) + ")");
    if (!tok.id_to_token(id))
      throw usage_error(flag + ": id " + std::to_string(id) + " (entry " + std::to_string(i) +
                        ") names no token of the tokenizer");
  }
}

json parse_messages(const std::string& flag, const std::string& text) {
  require_utf8(flag, text);
  json messages = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (messages.is_discarded())
    throw usage_error(flag + " is not valid JSON");
  if (!messages.is_array() || messages.empty())
    throw usage_error(flag + " must be a non-empty JSON array of messages");
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& m = messages[i];
    const std::string where = flag + " message " + std::to_string(i);
    if (!m.is_object())
      throw usage_error(where + " is not an object");
    for (const char* key : {"role", "content"})
      if (!m.contains(key) || !m[key].is_string())
        throw usage_error(where + " needs a string \"" + key + "\"");
  }
  return messages;
}

std::vector<int64_t> encode_chat(const prompt::chat_prompt& chat, const json& messages) {
  if (!chat.has_template())
    throw runtime_failure("the model has no chat template (tokenizer_config.json has no "
                          "chat_template)");
  try {
    return chat.encode(messages, true);
  } catch (const chat::template_error& e) {
    throw usage_error(std::string("the chat template refused the messages: ") + e.what());
  }
}

} // namespace rlforge::cli
