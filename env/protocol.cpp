#include "env/protocol.hpp"

#include <cmath>

namespace rlforge::env::protocol {

namespace {

using json = nlohmann::json;

[[noreturn]] void bad(const std::string& what) {
  throw env_error(failure::protocol, what);
}

std::string dump_checked(const json& j) {
  try {
    return j.dump();
  } catch (const json::type_error&) {
    throw env_error(failure::usage, "a request string is not valid UTF-8");
  }
}

const char* json_type(const json& j) {
  return j.type_name();
}

/// "a string", "an array", ... for messages.
std::string a_type(const json& j) {
  const std::string t = j.type_name();
  return (t == "array" || t == "object" ? "an " : "a ") + t;
}

} // namespace

bool valid_utf8(std::string_view text) noexcept {
  // nlohmann-json checks UTF-8 when it serializes a string (no overlong forms, surrogates or
  // code points past U+10FFFF): the one validator this library needs, from its one dependency.
  try {
    (void)json(std::string(text)).dump();
    return true;
  } catch (...) {
    return false;
  }
}

std::string excerpt(const std::string& line, std::size_t max) {
  std::string out;
  for (std::size_t i = 0; i < line.size() && out.size() < max; ++i) {
    const auto c = static_cast<unsigned char>(line[i]);
    if (c >= 0x20 && c < 0x7F) {
      out.push_back(static_cast<char>(c));
    } else {
      static const char hex[] = "0123456789abcdef";
      out += "\\x";
      out.push_back(hex[c >> 4]);
      out.push_back(hex[c & 0xF]);
    }
  }
  if (out.size() >= max && line.size() > max)
    out += "...";
  return "'" + out + "'";
}

void check_handshake(const std::string& line) {
  auto fail = [&](const std::string& what) {
    throw env_error(failure::handshake,
                    what +
                        " (expected {\"protocol\": \"rlforge.env\", \"version\": 1} as the "
                        "first line of stdout; got " +
                        excerpt(line) + ")");
  };
  if (!valid_utf8(line))
    fail("the handshake is not valid UTF-8");
  const json j = json::parse(line, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    fail("the handshake is not a JSON object");
  if (!j.contains("protocol") || j["protocol"] != name)
    fail("the handshake does not name protocol \"rlforge.env\"");
  if (!j.contains("version") || !j["version"].is_number_integer())
    fail("the handshake has no integer version");
  if (j["version"].get<int64_t>() != version)
    fail("protocol version " + std::to_string(j["version"].get<int64_t>()) +
         " is not supported (this driver speaks version 1)");
}

std::string encode_reset(int64_t id, const reset_request& request) {
  json params = {{"seed", request.seed ? json(*request.seed) : json(nullptr)},
                 {"task", request.task}};
  return dump_checked({{"id", id}, {"method", "reset"}, {"params", std::move(params)}});
}

std::string encode_step(int64_t id, const std::string& action) {
  if (!valid_utf8(action))
    throw env_error(failure::usage, "the action text is not valid UTF-8");
  return dump_checked({{"id", id}, {"method", "step"}, {"params", {{"action", action}}}});
}

std::string encode_close(int64_t id) {
  return dump_checked({{"id", id}, {"method", "close"}, {"params", json::object()}});
}

json decode_reply(const std::string& line, int64_t id, const std::string& method) {
  const std::string req = "the reply to '" + method + "' (id " + std::to_string(id) + ")";
  if (!valid_utf8(line))
    bad(req + " is not valid UTF-8: " + excerpt(line));
  json j = json::parse(line, nullptr, false);
  if (j.is_discarded())
    bad(req + " is not JSON: " + excerpt(line));
  if (!j.is_object())
    bad(req + " is a JSON " + json_type(j) + ", not an object: " + excerpt(line));
  if (!j.contains("id"))
    bad(req + " has no \"id\": " + excerpt(line));
  if (!j["id"].is_number_integer())
    bad(req + " has an \"id\" of type " + json_type(j["id"]) +
        ", not an integer: " + excerpt(line));
  if (j["id"].get<int64_t>() != id)
    bad(req + " carries id " + std::to_string(j["id"].get<int64_t>()) +
        " (wrong id): " + excerpt(line));
  const bool has_result = j.contains("result"), has_error = j.contains("error");
  if (has_result == has_error)
    bad(req +
        (has_result ? " has both \"result\" and \"error\": "
                    : " has neither \"result\" nor \"error\": ") +
        excerpt(line));
  if (has_error) {
    const json& e = j["error"];
    if (!e.is_object() || !e.contains("message") || !e["message"].is_string())
      bad(req + " has an \"error\" without a string \"message\": " + excerpt(line));
    std::string text = e["message"].get<std::string>();
    if (e.contains("type") && e["type"].is_string())
      text = e["type"].get<std::string>() + ": " + text;
    throw env_error(failure::environment, "the environment refused '" + method + "': " + text);
  }
  if (!j["result"].is_object())
    bad(req + " has a \"result\" of type " + json_type(j["result"]) +
        ", not an object: " + excerpt(line));
  return std::move(j["result"]);
}

namespace {

std::string required_string(const json& r, const char* field, const char* what) {
  if (!r.contains(field))
    bad(std::string("the ") + what + " result lacks \"" + field + "\"");
  if (!r[field].is_string())
    bad(std::string("the ") + what + " result's \"" + field + "\" is " + a_type(r[field]) +
        ", not a string");
  return r[field].get<std::string>();
}

json optional_info(const json& r, const char* what) {
  if (!r.contains("info") || r["info"].is_null())
    return json::object();
  if (!r["info"].is_object())
    bad(std::string("the ") + what + " result's \"info\" is " + a_type(r["info"]) +
        ", not an object");
  return r["info"];
}

} // namespace

reset_result decode_reset_result(const json& r) {
  reset_result out;
  out.observation = required_string(r, "observation", "reset");
  out.info = optional_info(r, "reset");
  return out;
}

step_result decode_step_result(const json& r) {
  step_result out;
  out.observation = required_string(r, "observation", "step");
  if (!r.contains("reward"))
    bad("the step result lacks \"reward\"");
  if (!r["reward"].is_number())
    bad(std::string("the step result's \"reward\" is ") + a_type(r["reward"]) + ", not a number");
  out.reward = r["reward"].get<double>();
  if (!std::isfinite(out.reward))
    bad("the step result's \"reward\" is not finite");
  if (!r.contains("done"))
    bad("the step result lacks \"done\"");
  if (!r["done"].is_boolean())
    bad(std::string("the step result's \"done\" is ") + a_type(r["done"]) + ", not a boolean");
  out.done = r["done"].get<bool>();
  out.info = optional_info(r, "step");
  return out;
}

} // namespace rlforge::env::protocol
