#include "placement/request.hpp"

namespace rlforge::placement {

result<void> validate_bundle(const resource_set& bundle, std::size_t index) {
  auto which = "bundle " + std::to_string(index);
  if (bundle.empty())
    return make_error(placement_errc::empty_bundle,
                      which + " is empty; a bundle must request at least one resource");
  for (const auto& [name, amount] : bundle) {
    if (name.empty())
      return make_error(placement_errc::invalid_resource_name,
                        which + " has a resource with an empty name");
    if (amount <= 0)
      return make_error(placement_errc::invalid_amount, which + " requests " + name + ": " +
                                                            format_units(amount) +
                                                            "; amounts must be positive");
  }
  auto gpu = bundle.get(gpu_resource);
  if (gpu > units_per_whole && gpu % units_per_whole != 0)
    return make_error(placement_errc::invalid_bundle,
                      which + " requests GPU: " + format_units(gpu) +
                          "; a GPU amount above 1 must be a whole number of devices");
  return {};
}

result<void> validate_request(const placement_request& request) {
  switch (request.strategy) {
  case placement_strategy::pack:
  case placement_strategy::spread:
  case placement_strategy::strict_pack:
  case placement_strategy::strict_spread:
    break;
  default:
    return make_error(placement_errc::unknown_strategy,
                      "unknown placement strategy value " +
                          std::to_string(static_cast<int>(request.strategy)) +
                          "; valid strategies: pack, spread, strict_pack, strict_spread");
  }
  if (request.bundles.empty())
    return make_error(placement_errc::empty_request,
                      "the placement request has no bundles; at least one is required");
  for (std::size_t i = 0; i < request.bundles.size(); ++i)
    if (auto ok = validate_bundle(request.bundles[i], i); !ok)
      return ok;
  return {};
}

result<placement_request> make_request(std::string_view strategy,
                                       std::vector<resource_set> bundles) {
  auto parsed = parse_strategy(strategy);
  if (!parsed)
    return parsed.error();
  placement_request out{*parsed, std::move(bundles)};
  if (auto ok = validate_request(out); !ok)
    return ok.error();
  return out;
}

units per_device_share(const placed_bundle& bundle) noexcept {
  if (bundle.device_ids.empty())
    return 0;
  return bundle.resources.get(gpu_resource) / static_cast<units>(bundle.device_ids.size());
}

} // namespace rlforge::placement
