#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "env/environment.hpp"

/// The JSON-lines protocol between the driver and an environment process (docs/ENVIRONMENTS.md
/// is the full description; this is the codec).
///
/// Every message is one JSON object on one line of UTF-8 text, at most `max_line_bytes` long
/// (configurable; default 1 MiB). The child's stdout carries only protocol lines; its stderr is
/// free for logs (the last lines are quoted in errors).
///
/// 1. Handshake — the child's first stdout line:
///      {"protocol": "rlforge.env", "version": 1}
///    (other members, e.g. "name", are ignored). A different protocol or version fails.
/// 2. Requests — the driver writes one at a time and waits for its reply; `id` counts up from 1:
///      {"id": 1, "method": "reset", "params": {"seed": 7, "task": {...}}}   (seed may be null)
///      {"id": 2, "method": "step",  "params": {"action": "text"}}
///      {"id": 3, "method": "close", "params": {}}
/// 3. Replies — exactly one line per request, with the request's id:
///      {"id": 1, "result": {"observation": "text", "info": {...}}}                       (reset)
///      {"id": 2, "result": {"observation": "text", "reward": 0.5, "done": false,
///                           "info": {...}}}                                              (step)
///      {"id": 3, "result": {}}                                                           (close)
///    or, when the environment itself refuses a request:
///      {"id": 2, "error": {"message": "text", "type": "ValueError"}}   ("type" optional)
///    `info` may be omitted (an empty object); other members are ignored. After `close` is
///    answered the child exits; the driver kills its process group after a grace period anyway.
///
/// Reentrant.
namespace rlforge::env::protocol {

inline constexpr const char* name = "rlforge.env";
inline constexpr int version = 1;

/// Checks the handshake line. Throws env_error (handshake) saying what is wrong.
void check_handshake(const std::string& line);

/// The request lines. Throw env_error (usage) when a string is not valid UTF-8.
std::string encode_reset(int64_t id, const reset_request& request);
std::string encode_step(int64_t id, const std::string& action);
std::string encode_close(int64_t id);

/// The `result` object of the reply line to request `id` (`method` names it in errors). Throws
/// env_error: protocol (not UTF-8, not JSON, not an object, wrong or missing id, neither or both
/// of result/error, result not an object, malformed error), or environment (an error reply,
/// with its message and type).
nlohmann::json decode_reply(const std::string& line, int64_t id, const std::string& method);

/// The fields of a reset / step result. Throw env_error (protocol) naming a missing or
/// mistyped field.
reset_result decode_reset_result(const nlohmann::json& result);
step_result decode_step_result(const nlohmann::json& result);

/// True when `text` is well-formed UTF-8.
bool valid_utf8(std::string_view text) noexcept;

/// `line` shortened to at most `max` bytes, for error messages.
std::string excerpt(const std::string& line, std::size_t max = 160);

} // namespace rlforge::env::protocol
