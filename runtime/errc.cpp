#include "runtime/errc.hpp"

#include <caf/message.hpp>

namespace rlforge {

const char* to_string(errc x) noexcept {
  switch (x) {
    case errc::none: return "none";
    case errc::invalid_argument: return "invalid_argument";
    case errc::out_of_range: return "out_of_range";
    case errc::not_found: return "not_found";
    case errc::already_exists: return "already_exists";
    case errc::infeasible: return "infeasible";
    case errc::timeout: return "timeout";
    case errc::rank_failed: return "rank_failed";
    case errc::decode_error: return "decode_error";
    case errc::io_error: return "io_error";
    case errc::unsupported: return "unsupported";
    case errc::backend_error: return "backend_error";
    case errc::busy: return "busy";
    case errc::internal: return "internal";
  }
  return "unknown";
}

std::string error_message(const caf::error& err) {
  // An empty caf::error has no category in CAF 0.17: asking for it would dereference null.
  if (!err || err.category() != errc_category)
    return {};
  const auto& ctx = err.context();
  if (ctx.size() == 1 && ctx.match_element<std::string>(0))
    return ctx.get_as<std::string>(0);
  return {};
}

std::string render_errc(uint8_t code, const caf::message& context) {
  std::string out = "rlforge.";
  out += to_string(static_cast<errc>(code));
  if (context.size() == 1 && context.match_element<std::string>(0)) {
    out += ": ";
    out += context.get_as<std::string>(0);
  } else if (!context.empty()) {
    out += ": ";
    out += to_string(context);
  }
  return out;
}

} // namespace rlforge
