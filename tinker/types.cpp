#include "tinker/types.hpp"

#include <utility>

namespace rlforge::tinker {

const char* to_string(dtype x) noexcept {
  switch (x) {
  case dtype::float32:
    return "float32";
  case dtype::int64:
    return "int64";
  case dtype::int32:
    return "int32";
  case dtype::bfloat16:
    return "bfloat16";
  }
  return "unknown";
}

dtype parse_dtype(std::string_view name) {
  for (auto x : {dtype::float32, dtype::int64, dtype::int32, dtype::bfloat16})
    if (name == to_string(x))
      return x;
  fail_user("unknown dtype \"" + std::string{name} +
            "\" (expected float32, int64, int32 or bfloat16)");
}

bool is_floating(dtype x) noexcept {
  return x == dtype::float32 || x == dtype::bfloat16;
}

std::string sampler_ref::engine() const {
  switch (type) {
  case kind::base:
    return "base";
  case kind::snapshot:
    return "model:" + model_id;
  case kind::checkpoint:
    return "checkpoint:" + dir;
  }
  return "base";
}

int64_t tensor_data::numel() const {
  int64_t n = 1;
  for (auto d : shape)
    n *= d;
  return n;
}

} // namespace rlforge::tinker
