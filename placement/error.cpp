#include "placement/error.hpp"

namespace rlforge::placement {

const char* to_string(placement_errc x) noexcept {
  switch (x) {
  case placement_errc::none:
    return "none";
  case placement_errc::invalid_amount:
    return "invalid_amount";
  case placement_errc::invalid_resource_name:
    return "invalid_resource_name";
  case placement_errc::empty_bundle:
    return "empty_bundle";
  case placement_errc::invalid_bundle:
    return "invalid_bundle";
  case placement_errc::empty_request:
    return "empty_request";
  case placement_errc::unknown_strategy:
    return "unknown_strategy";
  case placement_errc::invalid_node:
    return "invalid_node";
  case placement_errc::duplicate_node:
    return "duplicate_node";
  case placement_errc::unknown_node:
    return "unknown_node";
  case placement_errc::invalid_group_id:
    return "invalid_group_id";
  case placement_errc::duplicate_group:
    return "duplicate_group";
  case placement_errc::unknown_group:
    return "unknown_group";
  case placement_errc::not_pending:
    return "not_pending";
  case placement_errc::not_placed:
    return "not_placed";
  case placement_errc::index_out_of_range:
    return "index_out_of_range";
  case placement_errc::insufficient_resources:
    return "insufficient_resources";
  case placement_errc::unknown_reservation:
    return "unknown_reservation";
  case placement_errc::invalid_reservation:
    return "invalid_reservation";
  }
  return "unknown";
}

} // namespace rlforge::placement
