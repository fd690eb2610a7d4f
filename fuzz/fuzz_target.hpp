#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

/// What a fuzz target source `fuzz/<name>.cpp` provides (see fuzz/CMakeLists.txt):
///
/// - libFuzzer's entry point `extern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t)`,
///   which feeds the input to the parser under test and checks its contract with `check`;
/// - `rlforge::fuzz::seeds()`, the inputs `<name>_seeds` writes as the starting corpus (valid
///   encodings and near misses, so the fuzzer starts past the first checks).
namespace rlforge::fuzz {

/// The seed corpus of the target linked into this program.
std::vector<std::string> seeds();

/// Reports a violated property and aborts, which libFuzzer records as a crash with its input.
inline void check(bool condition, const std::string& what) {
  if (condition)
    return;
  std::fprintf(stderr, "fuzz property violated: %s\n", what.c_str());
  std::abort();
}

} // namespace rlforge::fuzz
