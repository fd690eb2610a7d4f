// The detokenizer seam of a build without rlforge::text (RLFORGE_MINIMAL_DEPS, the GPU subset):
// tokenizer files are recognised, never read, so stop strings are refused with the reason.
#include "backends/model/detokenizer.hpp"

#include <filesystem>
#include <system_error>

#include "backends/error.hpp"

namespace rlforge::backends {

bool has_tokenizer(const std::string& dir) {
  std::error_code ec;
  const std::filesystem::path d(dir);
  return std::filesystem::exists(d / "tokenizer.json", ec) ||
         std::filesystem::exists(d / "tokenizer.model", ec);
}

std::shared_ptr<const detokenizer> load_detokenizer(const std::string& dir) {
  fail(error_code::unsupported,
       "cannot read the tokenizer of '" + dir +
           "': this rlforge was built with RLFORGE_MINIMAL_DEPS, without rlforge::text, so "
           "stop strings are not available");
}

} // namespace rlforge::backends
