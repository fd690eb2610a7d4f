#include "chat/error.hpp"

namespace rlforge::chat {

const char* to_string(error_kind x) noexcept {
  switch (x) {
  case error_kind::syntax:
    return "syntax";
  case error_kind::unsupported:
    return "unsupported";
  case error_kind::runtime:
    return "runtime";
  case error_kind::raised:
    return "raised";
  case error_kind::config:
    return "config";
  }
  return "runtime";
}

namespace {

std::string compose(error_kind kind, const std::string& detail, source_position where) {
  std::string out = "chat template ";
  out += to_string(kind);
  out += " error";
  if (where.line > 0) {
    out += " at line " + std::to_string(where.line) + ", column " + std::to_string(where.column);
  }
  out += ": ";
  out += detail;
  return out;
}

} // namespace

template_error::template_error(error_kind kind, const std::string& detail, source_position where)
    : std::runtime_error(compose(kind, detail, where)), kind_(kind), where_(where),
      detail_(detail) {}

} // namespace rlforge::chat
