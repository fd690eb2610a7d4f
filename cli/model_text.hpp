#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "prompt/chat_prompt.hpp"

/// Text in and out of the model commands (`tokenize`, `detokenize`, `score --text`,
/// `generate --prompt/--chat/--messages`): loading a model directory's tokenizer and chat
/// template, and checking what the user typed. Every refusal is a `command_error`
/// (cli/command.hpp).
namespace rlforge::cli {

/// Whether `dir` holds a tokenizer file (tokenizer.json or tokenizer.model).
bool has_tokenizer_files(const std::string& dir);

/// The tokenizer and chat template of model directory `dir`. Throws `runtime_failure` naming the
/// directory: none there ("'DIR' has no tokenizer (neither tokenizer.json nor tokenizer.model)"),
/// malformed files, a template that does not compile.
prompt::chat_prompt load_model_text(const std::string& dir);

/// Throws `usage_error` ("FLAG is not valid UTF-8: ...", naming the byte) unless `text` is.
void require_utf8(const std::string& flag, const std::string& text);

/// Throws `usage_error` naming the first of `ids` that names no token of `tok` (outside
/// [0, vocab_size) or a gap in the vocabulary).
void require_known_ids(const text::tokenizer& tok, const std::vector<int64_t>& ids,
                       const std::string& flag);

/// The messages of a `--messages` value: a JSON array of objects, each with a string "role" and
/// a string "content" (other members are passed to the template). Throws `usage_error` naming
/// what is wrong.
nlohmann::ordered_json parse_messages(const std::string& flag, const std::string& text);

/// The ids of `messages` rendered by the model's chat template with the generation prompt.
/// Throws `runtime_failure` when the model has no template and `usage_error` when the template
/// refuses the messages.
std::vector<int64_t> encode_chat(const prompt::chat_prompt& chat,
                                 const nlohmann::ordered_json& messages);

} // namespace rlforge::cli
