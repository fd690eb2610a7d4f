#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

/// Reading tokenizer.json objects with errors that name the file and the JSON path of the bad
/// value ("/m/tokenizer.json: model.merges[3]: expected a string, got a number"). Every function
/// throws `tokenizer_error`; `where` is the path of `j` itself.
namespace rlforge::text::hf {

using json = nlohmann::json;

/// `where.key`.
std::string path(const std::string& where, std::string_view key);

/// `where[index]`.
std::string path(const std::string& where, size_t index);

/// "a string", "null", "an object", ... for messages.
std::string describe(const json& j);

/// Requires `j` to be an object.
void require_object(const json& j, const std::string& where);

/// Requires every member of object `j` to be one of `known`: a field this library does not know
/// would otherwise be a setting silently ignored.
void require_known_fields(const json& j, std::initializer_list<std::string_view> known,
                          const std::string& where);

/// The member `key`, or nullptr when absent.
const json* find(const json& j, std::string_view key);

/// The member `key`, which must be present.
const json& require(const json& j, std::string_view key, const std::string& where);

/// The string member `key` (required).
std::string get_string(const json& j, std::string_view key, const std::string& where);

/// The string member `key`, or nullopt when absent or null.
std::optional<std::string> get_optional_string(const json& j, std::string_view key,
                                               const std::string& where);

/// The boolean member `key`, or `fallback` when absent or null.
bool get_bool(const json& j, std::string_view key, bool fallback, const std::string& where);

/// The boolean member `key` (required).
bool require_bool(const json& j, std::string_view key, const std::string& where);

/// The integer member `key` (required), within [lo, hi].
int64_t get_int(const json& j, std::string_view key, int64_t lo, int64_t hi,
                const std::string& where);

/// `j` itself as a string.
std::string as_string(const json& j, const std::string& where);

/// The "type" member of object `j` (required, a string).
std::string type_of(const json& j, const std::string& where);

/// Parses `text` as JSON; a syntax error names `source` and the byte offset.
json parse_json(std::string_view text, const std::string& source);

/// Reads and parses the file at `file` (whose name the errors carry).
json read_json_file(const std::string& file);

} // namespace rlforge::text::hf
