#include "text/error.hpp"

namespace rlforge::text {

tokenizer_error::tokenizer_error(const std::string& message) : std::runtime_error(message) {}

void fail(const std::string& message) {
  throw tokenizer_error(message);
}

} // namespace rlforge::text
