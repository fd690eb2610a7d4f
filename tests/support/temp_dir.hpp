#pragma once
// The one temporary directory of the tests: a fresh, empty directory under the system's
// temporary directory, removed with its contents when the object goes. Standard C++ and POSIX
// only, so every test suite (torch-free or not) includes it.
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <stdexcept>
#include <string>
#include <system_error>

namespace rlforge::test_support {

class temp_dir {
public:
  /// Creates `<tmp>/rlforge-<tag>-XXXXXX` (mkdtemp: unique across threads and processes); `tag`
  /// only makes it easier to recognise. Throws std::runtime_error when it cannot.
  explicit temp_dir(const std::string& tag = "test") {
    std::string pattern =
        (std::filesystem::temp_directory_path() / ("rlforge-" + tag + "-XXXXXX")).string();
    if (::mkdtemp(pattern.data()) == nullptr)
      throw std::runtime_error("mkdtemp failed for " + pattern);
    path_ = pattern;
  }
  /// Removes the directory; errors are ignored, so that a destructor never throws.
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;

  /// The directory.
  const std::filesystem::path& path() const { return path_; }
  /// The directory as a string.
  std::string str() const { return path_.string(); }
  /// The path of `name` inside the directory (the file need not exist).
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  /// The names of the entries directly inside the directory.
  std::set<std::string> files() const {
    std::set<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(path_))
      out.insert(e.path().filename().string());
    return out;
  }
  /// Writes `text` to the file `name` inside the directory, replacing it.
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(path_ / name, std::ios::binary | std::ios::trunc) << text;
  }

private:
  std::filesystem::path path_;
};

} // namespace rlforge::test_support
