#include "strings/format.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <system_error>

namespace rlforge::strings {

std::string iso_time(int64_t unix_ms) {
  const auto seconds = static_cast<std::time_t>(unix_ms / 1000);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char date[40];
  std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%S", &utc);
  char out[64];
  std::snprintf(out, sizeof(out), "%s.%03dZ", date, static_cast<int>(unix_ms % 1000));
  return out;
}

std::string in_quotes(const std::string& s) {
  return "'" + s + "'";
}

std::string number_text(double x) {
  if (std::isnan(x))
    return "nan";
  if (std::isinf(x))
    return x < 0 ? "-inf" : "inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), x);
  if (r.ec != std::errc())
    return "?";
  return std::string(buf, r.ptr);
}

std::string join(const std::vector<std::string>& items, const std::string& if_empty) {
  if (items.empty())
    return if_empty;
  std::string out;
  for (const auto& item : items)
    out += (out.empty() ? "" : ", ") + item;
  return out;
}

} // namespace rlforge::strings
