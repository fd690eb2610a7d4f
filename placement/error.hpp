#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace rlforge::placement {

/// What was wrong with an input to the placement library. The placement-group manager actor maps
/// these onto `rlforge::errc` (invalid_argument, not_found, already_exists, out_of_range, ...).
enum class placement_errc : std::uint8_t {
  none = 0,
  invalid_amount,         ///< zero, negative, NaN, infinite or too large resource amount
  invalid_resource_name,  ///< an empty or duplicated resource name
  empty_bundle,           ///< a bundle without any resource
  invalid_bundle,         ///< a bundle the scheduler cannot express, e.g. GPU 1.5
  empty_request,          ///< a placement request without bundles
  unknown_strategy,       ///< a strategy name that is not one of the four
  invalid_node,           ///< a malformed node description
  duplicate_node,         ///< a node id that is already in the cluster
  unknown_node,           ///< a node id that is not in the cluster
  invalid_group_id,       ///< an empty group id
  duplicate_group,        ///< a group id that is already placed or pending
  unknown_group,          ///< a group id that is neither placed nor pending
  not_pending,            ///< the group exists but is not pending
  not_placed,             ///< the group exists but is not placed
  index_out_of_range,     ///< a bundle index outside the group
  insufficient_resources, ///< a reservation inside a bundle does not fit what is left of it
  unknown_reservation,    ///< a reservation id that is not held
  invalid_reservation,    ///< reservation bookkeeping that does not match the cluster
};

/// Returns the enumerator's name, e.g. "invalid_amount".
const char* to_string(placement_errc x) noexcept;

/// A bad input: a code plus a message that names the bad value.
struct placement_error {
  placement_errc code = placement_errc::none;
  std::string message;
};

/// Builds a `placement_error`.
inline placement_error make_error(placement_errc code, std::string message) {
  return placement_error{code, std::move(message)};
}

/// Either a value or a `placement_error`; the placement library never throws for bad input.
/// Accessing `value()` of an error (or `error()` of a value) is a bug and throws
/// `std::bad_variant_access`.
template <class T> class result {
public:
  /// A successful result.
  result(T value) : state_(std::in_place_index<0>, std::move(value)) {}

  /// A failed result.
  result(placement_error error) : state_(std::in_place_index<1>, std::move(error)) {}

  /// True when this holds a value.
  bool ok() const noexcept { return state_.index() == 0; }

  /// Same as `ok()`.
  explicit operator bool() const noexcept { return ok(); }

  /// The value.
  T& value() & { return std::get<0>(state_); }
  /// The value.
  const T& value() const& { return std::get<0>(state_); }
  /// The value, moved out.
  T&& value() && { return std::get<0>(std::move(state_)); }

  /// The error.
  const placement_error& error() const { return std::get<1>(state_); }

  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

private:
  std::variant<T, placement_error> state_;
};

/// Success or a `placement_error`.
template <> class result<void> {
public:
  /// A successful result.
  result() = default;

  /// A failed result.
  result(placement_error error) : error_(std::move(error)) {}

  /// True when no error is held.
  bool ok() const noexcept { return !error_.has_value(); }

  /// Same as `ok()`.
  explicit operator bool() const noexcept { return ok(); }

  /// The error; throws `std::bad_optional_access` when there is none.
  const placement_error& error() const { return error_.value(); }

private:
  std::optional<placement_error> error_;
};

} // namespace rlforge::placement
