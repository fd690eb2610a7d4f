#pragma once
// Reading members of JSON state (checkpoints, snapshots) with errors that name where: one helper
// for every reader of our own JSON formats. Header-only, on nlohmann-json; reentrant.
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

namespace rlforge::runtime {

/// Member `key` of object `j`, converted to T. Throws std::invalid_argument
/// "<what>: <path>.<key> is missing" when `j` is not an object or lacks it, and
/// "<what>: <path>.<key> has the wrong type (<JSON type>)" when it does not convert.
template <class T>
T json_field(const nlohmann::json& j, const std::string& what, const std::string& path,
             const char* key) {
  if (!j.is_object() || !j.contains(key))
    throw std::invalid_argument(what + ": " + path + "." + key + " is missing");
  try {
    return j.at(key).get<T>();
  } catch (const nlohmann::json::exception&) {
    throw std::invalid_argument(what + ": " + path + "." + key + " has the wrong type (" +
                                j.at(key).type_name() + ")");
  }
}

} // namespace rlforge::runtime
