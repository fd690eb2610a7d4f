#include "cli/flag_values.hpp"

#include <cerrno>
#include <cstdlib>

namespace rlforge::cli {

int64_t parse_int(const std::string& flag, const std::string& text) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE)
    throw usage_error(flag + " expects an integer, got '" + text + "'");
  return static_cast<int64_t>(v);
}

uint64_t parse_seed(const std::string& flag, const std::string& text) {
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  if (text.empty() || text[0] == '-' || end != text.c_str() + text.size() || errno == ERANGE)
    throw usage_error(flag + " expects an unsigned 64-bit integer, got '" + text + "'");
  return static_cast<uint64_t>(v);
}

double parse_double(const std::string& flag, const std::string& text) {
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE)
    throw usage_error(flag + " expects a number, got '" + text + "'");
  return v;
}

backends::compute_dtype parse_dtype(const std::string& flag, const std::string& text) {
  if (text == "fp32")
    return backends::compute_dtype::fp32;
  if (text == "bf16")
    return backends::compute_dtype::bf16;
  throw usage_error(flag + " must be fp32 or bf16, got '" + text + "'");
}

std::vector<int64_t> parse_int_list(const std::string& flag, const std::string& text) {
  std::vector<int64_t> out;
  size_t start = 0;
  for (;;) {
    const size_t comma = text.find(',', start);
    const std::string item =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (item.empty())
      throw usage_error(flag + " expects comma-separated integers, got '" + text + "'");
    out.push_back(parse_int(flag, item));
    if (comma == std::string::npos)
      return out;
    start = comma + 1;
  }
}

std::string format_int_list(const std::vector<int64_t>& ids) {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i)
    out += (i ? "," : "") + std::to_string(ids[i]);
  return out;
}

} // namespace rlforge::cli
