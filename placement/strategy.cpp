#include "placement/strategy.hpp"

#include <cctype>

namespace rlforge::placement {

const char* to_string(placement_strategy x) noexcept {
  switch (x) {
  case placement_strategy::pack:
    return "pack";
  case placement_strategy::spread:
    return "spread";
  case placement_strategy::strict_pack:
    return "strict_pack";
  case placement_strategy::strict_spread:
    return "strict_spread";
  }
  return "unknown";
}

result<placement_strategy> parse_strategy(std::string_view name) {
  std::string lower;
  lower.reserve(name.size());
  for (char c : name)
    lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (auto s : {placement_strategy::pack, placement_strategy::spread,
                 placement_strategy::strict_pack, placement_strategy::strict_spread})
    if (lower == to_string(s))
      return s;
  return make_error(placement_errc::unknown_strategy,
                    "unknown placement strategy '" + std::string(name) +
                        "'; valid strategies: pack, spread, strict_pack, strict_spread");
}

} // namespace rlforge::placement
