#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backends/model/compute_dtype.hpp"
#include "cli/command.hpp"

/// Values of command-line flags; malformed ones throw `usage_error` (cli/command.hpp).
namespace rlforge::cli {

/// A decimal 64-bit integer; throws `usage_error` ("FLAG expects an integer, got 'TEXT'").
int64_t parse_int(const std::string& flag, const std::string& text);

/// An unsigned decimal 64-bit integer (a seed); throws `usage_error`.
uint64_t parse_seed(const std::string& flag, const std::string& text);

/// A decimal number; throws `usage_error` ("FLAG expects a number, got 'TEXT'").
double parse_double(const std::string& flag, const std::string& text);

/// Comma-separated integers ("5,17,3"); an empty list or entry, or a non-integer entry, throws
/// `usage_error` naming the flag and the entry.
std::vector<int64_t> parse_int_list(const std::string& flag, const std::string& text);

/// A compute dtype ("fp32" or "bf16", see backends/model/compute_dtype.hpp); anything else
/// throws `usage_error` naming the flag, the value and the accepted names.
backends::compute_dtype parse_dtype(const std::string& flag, const std::string& text);

/// The inverse of `parse_int_list`: "5,17,3" (empty for no ids).
std::string format_int_list(const std::vector<int64_t>& ids);

} // namespace rlforge::cli
