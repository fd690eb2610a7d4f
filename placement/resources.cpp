#include "placement/resources.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace rlforge::placement {

namespace {

std::string describe_double(double x) {
  if (std::isnan(x))
    return "NaN";
  if (std::isinf(x))
    return x > 0 ? "inf" : "-inf";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.10g", x);
  return buf;
}

std::string subject(std::string_view name) {
  if (name.empty())
    return "resource amount";
  return "amount of " + std::string(name);
}

int name_rank(std::string_view name) noexcept {
  if (name == gpu_resource)
    return 0;
  if (name == cpu_resource)
    return 1;
  if (name == memory_resource)
    return 2;
  return 3;
}

} // namespace

result<units> to_units(double amount, std::string_view name) {
  if (std::isnan(amount) || std::isinf(amount))
    return make_error(placement_errc::invalid_amount,
                      subject(name) + " is " + describe_double(amount) +
                          "; resource amounts must be finite numbers");
  if (amount < 0)
    return make_error(placement_errc::invalid_amount,
                      subject(name) + " is " + describe_double(amount) +
                          "; resource amounts must not be negative");
  if (amount > max_amount)
    return make_error(placement_errc::invalid_amount,
                      subject(name) + " is " + describe_double(amount) +
                          ", above the largest accepted amount 1e13");
  return static_cast<units>(std::llround(amount * static_cast<double>(units_per_whole)));
}

result<units> to_positive_units(double amount, std::string_view name) {
  auto converted = to_units(amount, name);
  if (!converted)
    return converted;
  if (*converted == 0) {
    if (amount == 0)
      return make_error(placement_errc::invalid_amount,
                        subject(name) + " is 0; a positive amount is required");
    return make_error(placement_errc::invalid_amount,
                      subject(name) + " is " + describe_double(amount) +
                          ", which rounds to 0 at the 1/10000 resolution; a positive amount "
                          "is required");
  }
  return converted;
}

std::string format_units(units amount) {
  std::string out;
  // Work on the magnitude as unsigned so that the most negative value cannot overflow.
  auto magnitude =
      amount < 0 ? 0 - static_cast<std::uint64_t>(amount) : static_cast<std::uint64_t>(amount);
  if (amount < 0)
    out += '-';
  out += std::to_string(magnitude / units_per_whole);
  auto frac = magnitude % units_per_whole;
  if (frac != 0) {
    char digits[8];
    std::snprintf(digits, sizeof(digits), "%04u", static_cast<unsigned>(frac));
    std::string tail = digits;
    while (!tail.empty() && tail.back() == '0')
      tail.pop_back();
    out += '.';
    out += tail;
  }
  return out;
}

bool resource_name_less(std::string_view a, std::string_view b) noexcept {
  auto ra = name_rank(a);
  auto rb = name_rank(b);
  if (ra != rb)
    return ra < rb;
  return a < b;
}

std::vector<resource_set::entry>::iterator resource_set::find(std::string_view name) noexcept {
  for (auto i = entries_.begin(); i != entries_.end(); ++i)
    if (i->first == name)
      return i;
  return entries_.end();
}

std::vector<resource_set::entry>::const_iterator
resource_set::find(std::string_view name) const noexcept {
  for (auto i = entries_.begin(); i != entries_.end(); ++i)
    if (i->first == name)
      return i;
  return entries_.end();
}

void resource_set::put(std::string_view name, units amount) {
  if (auto i = find(name); i != entries_.end()) {
    i->second = amount;
    return;
  }
  auto pos = std::lower_bound(
      entries_.begin(), entries_.end(), name,
      [](const entry& e, std::string_view n) { return resource_name_less(e.first, n); });
  entries_.emplace(pos, std::string(name), amount);
}

result<void> resource_set::set(std::string_view name, double amount) {
  if (name.empty())
    return make_error(placement_errc::invalid_resource_name,
                      "resource name is empty (amount " + describe_double(amount) + ")");
  auto converted = to_positive_units(amount, name);
  if (!converted)
    return converted.error();
  put(name, *converted);
  return {};
}

result<void> resource_set::set_units(std::string_view name, units amount) {
  if (name.empty())
    return make_error(placement_errc::invalid_resource_name,
                      "resource name is empty (amount " + format_units(amount) + ")");
  if (amount <= 0)
    return make_error(placement_errc::invalid_amount, "amount of " + std::string(name) + " is " +
                                                          format_units(amount) +
                                                          "; a positive amount is required");
  put(name, amount);
  return {};
}

void resource_set::erase(std::string_view name) {
  if (auto i = find(name); i != entries_.end())
    entries_.erase(i);
}

units resource_set::get(std::string_view name) const noexcept {
  auto i = find(name);
  return i == entries_.end() ? 0 : i->second;
}

bool resource_set::contains(std::string_view name) const noexcept {
  return find(name) != entries_.end();
}

void resource_set::add(const resource_set& other) {
  for (const auto& [name, amount] : other.entries_) {
    if (auto i = find(name); i != entries_.end())
      i->second += amount;
    else
      put(name, amount);
  }
}

result<void> resource_set::subtract(const resource_set& other) {
  for (const auto& [name, amount] : other.entries_) {
    auto have = get(name);
    if (have < amount)
      return make_error(placement_errc::insufficient_resources,
                        "cannot subtract " + name + ": " + format_units(amount) + " from " + name +
                            ": " + format_units(have));
  }
  for (const auto& [name, amount] : other.entries_) {
    auto i = find(name);
    i->second -= amount;
    if (i->second == 0)
      entries_.erase(i);
  }
  return {};
}

bool resource_set::fits(const resource_set& request) const noexcept {
  for (const auto& [name, amount] : request.entries_)
    if (get(name) < amount)
      return false;
  return true;
}

std::string resource_set::to_string() const {
  if (entries_.empty())
    return "nothing";
  std::string out;
  for (const auto& [name, amount] : entries_) {
    if (!out.empty())
      out += ", ";
    out += name;
    out += ": ";
    out += format_units(amount);
  }
  return out;
}

namespace {

template <class Range> result<resource_set> build_resources(const Range& amounts) {
  resource_set out;
  for (const auto& [name, amount] : amounts) {
    if (out.contains(name))
      return make_error(placement_errc::invalid_resource_name,
                        "resource " + std::string(name) + " is listed twice");
    if (auto ok = out.set(name, amount); !ok)
      return ok.error();
  }
  return out;
}

} // namespace

result<resource_set>
make_resources(std::initializer_list<std::pair<std::string_view, double>> amounts) {
  return build_resources(amounts);
}

result<resource_set> make_resources(const std::vector<std::pair<std::string, double>>& amounts) {
  return build_resources(amounts);
}

} // namespace rlforge::placement
