// Writes the seed corpus of the fuzz target linked into this program: one file per seed in the
// directory named by the only argument (created when missing).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

#include "fuzz/fuzz_target.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus-directory>\n", argc > 0 ? argv[0] : "seeds");
    return 2;
  }
  std::filesystem::path dir{argv[1]};
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    std::fprintf(stderr, "cannot create %s: %s\n", dir.c_str(), ec.message().c_str());
    return 1;
  }
  auto corpus = rlforge::fuzz::seeds();
  for (size_t i = 0; i < corpus.size(); ++i) {
    auto path = dir / ("seed-" + std::to_string(i));
    std::ofstream out{path, std::ios::binary | std::ios::trunc};
    out.write(corpus[i].data(), static_cast<std::streamsize>(corpus[i].size()));
    if (!out) {
      std::fprintf(stderr, "cannot write %s\n", path.c_str());
      return 1;
    }
  }
  std::printf("wrote %zu seeds to %s\n", corpus.size(), dir.c_str());
  return 0;
}
