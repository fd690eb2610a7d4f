#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "placement/error.hpp"

namespace rlforge::placement {

/// A resource amount in fixed point: 1/10000 of a unit, as Ray does, so that fractional GPUs
/// (0.2 per colocated actor) add up exactly.
using units = std::int64_t;

/// Fixed-point units per whole resource unit: 10000 units = one GPU, one CPU, one byte...
inline constexpr units units_per_whole = 10000;

/// The largest amount (in whole units) accepted from a double: 1e13, which keeps every sum of a
/// few amounts far away from int64 overflow and still covers memory in bytes (10 TB).
inline constexpr double max_amount = 1e13;

/// Well-known resource names. Any other non-empty name is a custom resource.
inline constexpr std::string_view gpu_resource = "GPU";
inline constexpr std::string_view cpu_resource = "CPU";
inline constexpr std::string_view memory_resource = "memory";

/// Converts an amount to fixed point, rounding to the nearest 1/10000 (halves away from zero):
/// 0.33333 becomes 0.3333, 0.00005 becomes 0.0001. Rejects NaN, infinities, negative values and
/// values above `max_amount`; zero is allowed. `name` only serves the error message.
result<units> to_units(double amount, std::string_view name = {});

/// Like `to_units`, but also rejects amounts that are zero after rounding (0, 0.00004).
result<units> to_positive_units(double amount, std::string_view name = {});

/// Renders fixed-point units as a decimal without trailing zeros: 2000 -> "0.2", 10000 -> "1".
std::string format_units(units amount);

/// Orders resource names canonically: GPU, CPU, memory, then the rest alphabetically.
bool resource_name_less(std::string_view a, std::string_view b) noexcept;

/// A map from resource name to a strictly positive amount in fixed point. Entries are kept in
/// the canonical name order; an amount never stored is zero. Not thread-safe (a value type).
class resource_set {
public:
  using entry = std::pair<std::string, units>;

  resource_set() = default;

  /// Sets `name` to `amount` whole units (positive, see `to_positive_units`), replacing any
  /// previous amount. Fails naming the bad name or value and leaves the set unchanged.
  result<void> set(std::string_view name, double amount);

  /// Sets `name` to `amount` fixed-point units (must be > 0), replacing any previous amount.
  result<void> set_units(std::string_view name, units amount);

  /// Removes `name`; no-op when absent.
  void erase(std::string_view name);

  /// The amount of `name` in fixed point, 0 when absent.
  units get(std::string_view name) const noexcept;

  /// True when `name` has a (positive) amount.
  bool contains(std::string_view name) const noexcept;

  /// True when no resource is held.
  bool empty() const noexcept { return entries_.empty(); }

  /// Number of named resources.
  std::size_t size() const noexcept { return entries_.size(); }

  /// The entries in canonical name order.
  const std::vector<entry>& entries() const noexcept { return entries_; }
  std::vector<entry>::const_iterator begin() const noexcept { return entries_.begin(); }
  std::vector<entry>::const_iterator end() const noexcept { return entries_.end(); }

  /// Adds every amount of `other` to this set.
  void add(const resource_set& other);

  /// Subtracts `other` from this set. Fails (naming the resource, what is asked and what is
  /// left) without changing anything when some amount would become negative; amounts that
  /// become zero are removed.
  result<void> subtract(const resource_set& other);

  /// True when every amount of `request` is at most the amount held here.
  bool fits(const resource_set& request) const noexcept;

  /// Renders the set as "GPU: 0.2, CPU: 1"; an empty set renders as "nothing".
  std::string to_string() const;

  friend bool operator==(const resource_set& a, const resource_set& b) noexcept {
    return a.entries_ == b.entries_;
  }
  friend bool operator!=(const resource_set& a, const resource_set& b) noexcept {
    return !(a == b);
  }

private:
  std::vector<entry>::iterator find(std::string_view name) noexcept;
  std::vector<entry>::const_iterator find(std::string_view name) const noexcept;
  void put(std::string_view name, units amount);

  std::vector<entry> entries_;
};

/// Builds a resource set from whole-unit amounts, e.g. `make_resources({{"GPU", 0.2},
/// {"CPU", 1}})`. Every amount must be positive; duplicated or empty names are rejected.
result<resource_set>
make_resources(std::initializer_list<std::pair<std::string_view, double>> amounts);

/// Same as the initializer-list overload, for amounts built at run time.
result<resource_set> make_resources(const std::vector<std::pair<std::string, double>>& amounts);

} // namespace rlforge::placement
